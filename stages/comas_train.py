"""Stage `comas_train@itN` (comas/dvc.yaml): each agent trained on its own part of the discussion
(every role it played), REINFORCE++ advantages through the GRPO trainer (`train.grpo`, with the
rest of `train`: LoRA, lr, epochs, batches); each agent's output is its adapter chain.

The logic: self_improve/agents/, self_improve/training/iteration.py."""

from __future__ import annotations

import argparse
import logging

import pandas as pd
import torch

from self_improve import artifacts as art
from self_improve.agents.discussion import TRANSCRIPTS, buffer
from self_improve.agents.roster import agent_dir, agent_model
from self_improve.config import ConfigError, Params
from self_improve.models.loading import load_model, save_adapter_chain, set_threads
from self_improve.stage import ITERATION, Arg, Declaration, Run, derive_seed, run_stage, stage_provenance
from self_improve.training.iteration import prepare_precision, train

log = logging.getLogger(__name__)

# the params keys this stage reads: comas/dvc.yaml's params for it, and its provenance
PARAMS = ("seed", "model", "train", "agents.n", "security")


DECLARATION = Declaration(
    args=(
        ITERATION,
        Arg("--agents", "in", "the previous iteration's agents", required=True),
        Arg("--base", "in", "the base model (it0) that adapter chains apply to", required=True),
        Arg("--transcripts", "in", "this iteration's discussions", required=True),
        Arg("--out", "out", "this iteration's agents (an adapter chain each)", required=True),
        Arg("--metrics", "out", "training metrics per agent (json)", required=True),
    ),
    params=PARAMS,
    runs=(Run("comas_train", {
        "--iteration": "${key}", "--agents": "data/comas/${item.prev}/agents", "--base": "data/it0/model",
        "--transcripts": "data/comas/${key}/transcripts.parquet", "--out": "data/comas/${key}/agents",
        "--metrics": "data/comas/${key}/train.json"}, foreach="${agents.loop}", wdir="..", deps=("models",)),),
)


def main(argv: list[str] | None = None) -> None:
    def body(args: argparse.Namespace, params: Params) -> None:
        if not params.train.lora.enabled:
            raise ConfigError("train.lora.enabled: CoMAS keeps each agent as an adapter chain on one base; "
                              "set it to true")
        set_threads()
        prepare_precision(params.train.bf16, torch.device("cpu"))  # before loading merges any adapter
        transcripts = art.read_table(args.transcripts, TRANSCRIPTS)
        cfg = params.train.model_copy(update={"algorithm": "grpo"})
        metrics = {}
        with art.atomic_path(args.out, is_dir=True) as tmp:
            for k in range(params.agents.n):
                rows = buffer(transcripts, k)
                groups = pd.DataFrame({"prompt": rows["prompt"], "response": rows["response"],
                                       "advantage": rows["advantage"]})
                start = agent_model(args.agents, k, args.base)
                model, tokenizer = load_model(start, device="cpu", security=params.security, base=args.base,
                                              model_cfg=params.model)
                seed = derive_seed(params.seed, "comas-train", args.iteration, k)
                trained, train_log, n, _ = train(model, tokenizer, art.empty_table(art.PAIRS), art.empty_table(art.SFT),
                                                 groups, cfg, seed, max_length=params.model.max_length)
                prov = stage_provenance("comas_train", args.iteration, params, PARAMS, [args.out])
                prov["agent"] = k
                save_adapter_chain(trained, start, args.base, args.iteration, agent_dir(tmp, k), prov)
                metrics[f"agent{k}"] = {"train_examples": n, **train_log.summary()}
        log.info("trained %s", ", ".join(f"{a} on {m['train_examples']} outputs" for a, m in metrics.items()))
        art.write_json({"iteration": args.iteration, "agents": metrics}, args.metrics)

    run_stage("comas_train", DECLARATION.add_args, body, argv, reads=PARAMS)


if __name__ == "__main__":
    main()
