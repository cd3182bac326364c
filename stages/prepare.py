"""Stage `prepare`: the task's evaluation sets and the base model (iteration 0).

With `model.base: builtin` it builds a character-level tokenizer and a tiny Llama-architecture
model from params, and trains it briefly on the procedural task so it starts mediocre. With a
pretrained `model.base` (a local HF directory, a GGUF file, a hub id) it checks the base before any
work and writes a small record of it as it0 (where it is, its hub commit, a content hash): no
warm-up, no copy of the weights. Writes the held-out set (disjoint from every training prompt),
the test-time set (prompts the loop may train on; answers only measure), the base model's SFT
data, the base model (and its untrained copy, it1's reference; for a pretrained base, the base
itself), an empty judgment table for iteration 0 and the curriculum's initial state.

With `task.name: prompts` the held-out and test-time sets come from the user's prompt file,
validated row by row (stages/lib/prompt_files.py) and split by `task.heldout_fraction`; the base
model is still the embedded arithmetic one.
"""

from __future__ import annotations

import argparse
import copy
import logging
from dataclasses import dataclass

import pandas as pd

from .lib import artifacts as art
from .lib.cli import derive_seed, run_stage, stage_provenance
from .lib.config import Params, TaskConfig, TaskName
from .lib.curriculum import NO_CATEGORY
from .lib.errors import ConfigError
from .lib.prompt_files import load_prompt_file
from .lib.base import resolve_base
from .lib.models import (build_char_tokenizer, build_tiny_model, default_device, save_model, set_threads,
                         write_base_record)
from .lib.curriculum import initial_state
from .lib.tasks import Problem, make_task
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
    base_record: dict | None = None  # a pretrained base: what it is (no model, no warm-up)


def prompt_sets(cfg: TaskConfig, seed: int) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, int]]:
    """Held-out and test-time sets from the user's prompt file (a seeded split)."""
    rows, skipped = load_prompt_file(cfg.prompt_file, cfg.max_prompt_chars, cfg.on_error.value)
    if skipped:
        log.warning("%s: skipped %s", cfg.prompt_file, skipped)
    if len(rows) < 2:
        raise ConfigError(f"{cfg.prompt_file}: {len(rows)} usable prompt(s); at least 2 are needed "
                          "(one held out, one to train on)")
    order = rows.sample(frac=1.0, random_state=seed % 2**32).reset_index(drop=True)
    n_held = min(len(rows) - 1, max(1, round(cfg.heldout_fraction * len(rows))))

    def frame(df: pd.DataFrame, source: str) -> pd.DataFrame:
        ids = [f"{source}-{i:05d}" for i in range(len(df))]
        cols = {"iteration": "it0", "prompt_id": [f"{i}/v0" for i in ids], "group_id": ids, "variant": 0,
                "source": source, "category": list(df["category"]), "prompt": list(df["prompt"]),
                "answer": list(df["answer"])}
        return pd.DataFrame(cols, columns=art.PROMPTS.names)

    return frame(order.iloc[:n_held], "heldout"), frame(order.iloc[n_held:], "ttt"), skipped


def prepare(params: Params, progress: bool = True) -> Prepared:
    cfg = params.prepare
    record = None if params.model.builtin else resolve_base(params.model, params.security)  # before any work
    user_sets = None
    if params.task.name == TaskName.prompts:  # validate the user's file before any training
        user_sets = prompt_sets(params.task, derive_seed(params.seed, "split"))
    task = make_task(params.task if params.task.name == TaskName.arithmetic else TaskConfig())
    heldout, ttt, train = task.split(derive_seed(params.seed, "split"), cfg.train_size)
    held_frame, ttt_frame = problems_frame(heldout, "heldout"), problems_frame(ttt, "ttt")
    if user_sets is not None:
        held_frame, ttt_frame, _ = user_sets
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
    if record is not None:
        log.info("base model: %s (%s), content sha256 %s", record["base"], record["kind"], record["sha256"][:12])
        return Prepared(held_frame, ttt_frame, seed_sft, None, None, TrainLog(), None, record)
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
    return Prepared(held_frame, ttt_frame, seed_sft, model, tokenizer, train_log, init_model)


def categories(params: Params, prepared: Prepared) -> list[str]:
    """The curriculum's arms: the task's categories, or those of the user's prompts."""
    if params.task.name == TaskName.arithmetic:
        return list(make_task(params.task).categories)
    return sorted(set(prepared.ttt["category"].fillna(NO_CATEGORY)))


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
        prov = stage_provenance("prepare", "it0", params, ("seed", "model", "task", "prepare"), outs)
        art.write_table(out.heldout, args.heldout, art.PROMPTS, prov)
        art.write_table(out.ttt, args.ttt, art.PROMPTS, prov)
        art.write_table(out.seed_sft, args.seed_data, art.SFT, prov)
        art.write_table(art.empty_table(art.JUDGMENTS), args.judgments, art.JUDGMENTS, prov)
        art.write_json(out.log.summary(), args.metrics)
        with art.atomic_path(args.curriculum) as tmp:
            tmp.write_text(initial_state(categories(params, out)).to_json(), encoding="utf-8")
        if out.base_record is not None:  # it0 (and it1's reference) is the pretrained base as it is
            write_base_record(out.base_record, args.model, prov)
            write_base_record(out.base_record, args.init_model, prov)
        else:
            save_model(out.model, out.tokenizer, args.model, prov)
            save_model(out.init_model, out.tokenizer, args.init_model, prov)

    run_stage("prepare", _args, body, argv)


if __name__ == "__main__":
    main()
