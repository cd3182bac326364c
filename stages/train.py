"""Stage `train`: one iteration of self-training, LoRA (default) or full fine-tuning.

The logic: self_improve/training/iteration.py."""

from __future__ import annotations

import argparse
import logging
import sys

from self_improve import artifacts as art
from self_improve.config import Params
from self_improve.distributed import make_accelerator, relaunch
from self_improve.models.loading import (
    load_model,
    save_adapter_chain,
    save_model,
    set_threads,
)
from self_improve.stage import (
    BASE,
    ITERATION,
    STARTING_MODEL,
    Arg,
    Declaration,
    Run,
    derive_seed,
    note_timing,
    run_stage,
    stage_provenance,
)
from self_improve.training.iteration import fingerprint, prepare_precision, train
from self_improve.training.loop import Checkpoints

log = logging.getLogger(__name__)

# the params keys this stage reads: dvc.yaml's params for it, and its provenance
PARAMS = ("seed", "model", "train", "security")


DECLARATION = Declaration(
    args=(
        ITERATION,
        STARTING_MODEL,
        BASE,
        Arg("--pairs", "in", "preference pairs", required=True),
        Arg("--sft", "in", "best-judged samples", required=True),
        Arg("--groups", "in", "GRPO groups", required=True),
        Arg("--out", "out", "the next model directory", required=True),
        Arg("--metrics", "out", "training metrics (json)", required=True),
        Arg("--checkpoints", "out", "resumable state (kept between runs); none if not given", persist=True,
            note="resumable state: kept when the stage reruns; done.json once finished"),
    ),
    params=PARAMS,
    runs=(Run("train", {
        "--iteration": "${key}", "--model": "data/${item.prev}/model", "--base": "data/it0/model",
        "--pairs": "data/${key}/pairs.parquet", "--sft": "data/${key}/sft.parquet",
        "--groups": "data/${key}/groups.parquet", "--out": "data/${key}/model",
        "--metrics": "data/${key}/train_metrics.json", "--checkpoints": "data/${key}/checkpoints"},
        foreach="${loop}"),),
)


def main(argv: list[str] | None = None) -> None:
    def body(args: argparse.Namespace, params: Params) -> None:
        params.iteration_index(args.iteration)
        if argv is None:  # run as a program (dvc.yaml): SELF_IMPROVE_ACCELERATE_CONFIG may pick a launcher
            relaunch("stages.train", sys.argv[1:])
        set_threads()
        accelerator = make_accelerator()  # no GPU: processes over gloo; FSDP2 if the config asks
        prepare_precision(params.train.bf16, accelerator.device)  # before loading merges any adapter
        pairs = art.read_table(args.pairs, art.PAIRS)
        sft = art.read_table(args.sft, art.SFT)
        groups = art.read_table(args.groups, art.GROUPS)
        model, tokenizer = load_model(args.model, device="cpu", security=params.security, base=args.base,
                                      model_cfg=params.model)
        ckpt = None
        if args.checkpoints:
            key = fingerprint(params, args.iteration, args.model, args.base, pairs, sft, groups)
            ckpt = Checkpoints(args.checkpoints, key, params.train.checkpoint_every, accelerator.is_main_process)
        if accelerator.num_processes > 1:
            log.info("training on %d processes (%s)", accelerator.num_processes, accelerator.distributed_type)
        seed = derive_seed(params.seed, "train", args.iteration)
        trained, train_log, n, full_state = train(model.to(accelerator.device), tokenizer, pairs, sft, groups, params.train,
                                      seed, accelerator, ckpt, params.model.max_length)
        for key, value in train_log.speed.items():  # SELF_IMPROVE_TIMINGS' record, not an output
            note_timing(key, value)
        if not accelerator.is_main_process:
            return
        metrics = {"train_examples": n, "train_processes": accelerator.num_processes,
                   "train_resumed_from": train_log.resumed_from, **train_log.summary()}
        prov = stage_provenance("train", args.iteration, params, PARAMS, [args.out])
        if params.train.lora.enabled:
            save_adapter_chain(trained, args.model, args.base or args.model, args.iteration,
                               args.out, prov, state_dict=full_state)
        else:
            save_model(trained, tokenizer, args.out, prov, state_dict=full_state)
        art.write_json(metrics, args.metrics)

    run_stage("train", DECLARATION.add_args, body, argv, reads=PARAMS)


if __name__ == "__main__":
    main()
