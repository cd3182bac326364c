"""Stage `train`: one iteration of self-training on a LoRA adapter, merged into the next model.

`raft` fine-tunes on the best-judged samples (RAFT / ReST / STaR); `dpo` uses the sigmoid DPO
loss with an optional NLL term on the chosen answer, the reference being the iteration's starting
model (the adapter disabled). The adapter is merged so the next iteration starts from a plain
model in safetensors.
"""

from __future__ import annotations

import argparse
import logging

import pandas as pd
import torch

from .lib import artifacts as art
from .lib.cli import derive_seed, run_stage, stage_provenance
from .lib.config import Algorithm, Params, TrainConfig
from .lib.models import attach_lora, load_model, merge_lora, save_model, set_threads
from .lib.training import Schedule, steps_for, train_dpo, train_sft

log = logging.getLogger(__name__)


def train(model, tokenizer, pairs: pd.DataFrame, sft: pd.DataFrame, cfg: TrainConfig, seed: int):
    """Train `model` in place of a copy; returns the merged model and the training log."""
    if cfg.lora.enabled:
        torch.manual_seed(seed)  # the adapter's initial weights
        model = attach_lora(model, cfg.lora)
    if cfg.algorithm == Algorithm.raft:
        n = len(sft)
        sched = Schedule(cfg.lr, steps_for(n, cfg.batch_size, cfg.epochs), warmup_steps=min(10, n))
        out = train_sft(model, tokenizer, list(sft["prompt"]), list(sft["response"]), sched,
                        cfg.batch_size, seed, cfg.max_grad_norm, desc="raft")
    else:
        n = len(pairs)
        sched = Schedule(cfg.lr, steps_for(n, cfg.batch_size, cfg.epochs), warmup_steps=min(10, n))
        out = train_dpo(model, tokenizer, list(pairs["prompt"]), list(pairs["chosen"]), list(pairs["rejected"]),
                        sched, cfg.batch_size, seed, cfg.beta, cfg.nll_weight, cfg.max_grad_norm)
    if n == 0:
        log.warning("no training data this iteration: the model is passed on unchanged")
    return merge_lora(model), out, n


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--iteration", required=True)
    p.add_argument("--model", required=True, help="in: the iteration's starting model")
    p.add_argument("--pairs", required=True, help="in: preference pairs")
    p.add_argument("--sft", required=True, help="in: best-judged samples")
    p.add_argument("--out", required=True, help="out: the next model directory")
    p.add_argument("--metrics", required=True, help="out: training metrics (json)")


def main(argv: list[str] | None = None) -> None:
    def body(args: argparse.Namespace, params: Params) -> None:
        params.iteration_index(args.iteration)
        set_threads()
        pairs = art.read_table(args.pairs, art.PAIRS)
        sft = art.read_table(args.sft, art.SFT)
        model, tokenizer = load_model(args.model, security=params.security)
        merged, train_log, n = train(model, tokenizer, pairs, sft, params.train,
                                     derive_seed(params.seed, "train", args.iteration))
        metrics = {"train_examples": n, **train_log.summary()}
        prov = stage_provenance("train", args.iteration, params, ("seed", "train", "security"), [args.out])
        save_model(merged, tokenizer, args.out, prov)
        art.write_json(metrics, args.metrics)

    run_stage("train", _args, body, argv)


if __name__ == "__main__":
    main()
