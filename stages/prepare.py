"""Stage `prepare`: the task's evaluation sets and the base model (iteration 0).

Builds a character-level tokenizer and a tiny Llama-architecture model from params, and trains it
briefly on the procedural task so it starts mediocre. Writes the held-out set (disjoint from every
training prompt), the test-time set (prompts the loop may train on; answers only measure), the
base model's SFT data, the base model, and an empty judgment table for iteration 0.
"""

from __future__ import annotations

import argparse
import copy
import logging
from dataclasses import dataclass

import pandas as pd

from .lib import artifacts as art
from .lib.cli import derive_seed, run_stage, stage_provenance
from .lib.config import Params
from .lib.models import build_char_tokenizer, build_tiny_model, default_device, save_model, set_threads
from .lib.tasks import Problem, make_task
from .lib.curriculum import initial_state
from .lib.training import Schedule, TrainLog, train_sft

log = logging.getLogger(__name__)


def problems_frame(problems: list[Problem], source: str) -> pd.DataFrame:
    ids = [f"{source}-{i:05d}" for i in range(len(problems))]
    return pd.DataFrame(
        {
            "iteration": "it0",
            "prompt_id": ids,
            "group_id": ids,
            "variant": 0,
            "source": source,
            "category": [p.category for p in problems],
            "prompt": [p.prompt for p in problems],
            "answer": [p.answer for p in problems],
        }
    )


@dataclass
class Prepared:
    heldout: pd.DataFrame
    ttt: pd.DataFrame
    seed_sft: pd.DataFrame
    model: object
    tokenizer: object
    log: TrainLog
    init_model: object  # the same model before its warm-up: it1's reference


def prepare(params: Params, progress: bool = True) -> Prepared:
    cfg = params.prepare
    task = make_task(params.task)
    heldout, ttt, train = task.split(derive_seed(params.seed, "split"), cfg.train_size)
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(cfg.model, tokenizer, derive_seed(params.seed, "init")).to(default_device())
    init_model = copy.deepcopy(model)
    n_params = sum(p.numel() for p in model.parameters())
    log.info("base model: %d parameters, %d SFT problems, %d steps", n_params, len(train), cfg.steps)
    sched = Schedule(cfg.lr, cfg.steps, cfg.warmup_steps, cfg.min_lr_ratio)
    train_log = train_sft(
        model, tokenizer, [p.prompt for p in train], [p.answer for p in train], sched,
        cfg.batch_size, derive_seed(params.seed, "prepare-order"), desc="prepare", stop_loss=cfg.stop_loss,
    )
    seed_sft = pd.DataFrame(
        {
            "iteration": "it0",
            "prompt_id": [f"seed-{i:05d}" for i in range(len(train))],
            "prompt": [p.prompt for p in train],
            "response": [p.answer for p in train],
            "reward": None,
            "correct": 1.0,
        }
    )
    return Prepared(problems_frame(heldout, "heldout"), problems_frame(ttt, "ttt"), seed_sft, model, tokenizer,
                    train_log, init_model)


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--heldout", required=True, help="out: held-out eval set (parquet)")
    p.add_argument("--ttt", required=True, help="out: test-time eval set (parquet)")
    p.add_argument("--seed-data", required=True, help="out: the base model's SFT data (parquet)")
    p.add_argument("--model", required=True, help="out: base model directory")
    p.add_argument("--init-model", required=True, help="out: the base model before its warm-up")
    p.add_argument("--judgments", required=True, help="out: iteration 0's (empty) judgments")
    p.add_argument("--metrics", required=True, help="out: base training metrics (json)")
    p.add_argument("--curriculum", required=True, help="out: the initial curriculum bandit state (json)")


def main(argv: list[str] | None = None) -> None:
    def body(args: argparse.Namespace, params: Params) -> None:
        set_threads()
        out = prepare(params)
        outs = [args.heldout, args.ttt, args.seed_data, args.model]
        prov = stage_provenance("prepare", "it0", params, ("seed", "task", "prepare"), outs)
        art.write_table(out.heldout, args.heldout, art.PROMPTS, prov)
        art.write_table(out.ttt, args.ttt, art.PROMPTS, prov)
        art.write_table(out.seed_sft, args.seed_data, art.SFT, prov)
        art.write_table(art.empty_table(art.JUDGMENTS), args.judgments, art.JUDGMENTS, prov)
        art.write_json(out.log.summary(), args.metrics)
        with art.atomic_path(args.curriculum) as tmp:
            tmp.write_text(initial_state(make_task(params.task).categories).to_json(), encoding="utf-8")
        save_model(out.model, out.tokenizer, args.model, prov)
        save_model(out.init_model, out.tokenizer, args.init_model, prov)

    run_stage("prepare", _args, body, argv)


if __name__ == "__main__":
    main()
