"""The task's sets and the base model (it0): the prepare stage's logic.

With `model.base: builtin` it builds a character-level tokenizer and a tiny Llama-architecture
model from params, and trains it briefly on the procedural task so it starts mediocre. With a
pretrained `model.base` (a local HF directory, a GGUF file, a hub id) it checks the base before any
work and writes a small record of it as it0 (where it is, its hub commit, a content hash): no
warm-up, no copy of the weights. Writes the held-out set (disjoint from every training prompt),
the test-time set (prompts the loop may train on; answers only measure), the base model's SFT
data, the base model (and its untrained copy, it1's reference; for a pretrained base, the base
itself), an empty judgment table for iteration 0 and the curriculum's initial state.

The task (self_improve/tasks/) makes the sets: procedurally (arithmetic, word_math) or from the
user's file (math_file, instructions), validated row by row before any work. The embedded model is
a character-level model warmed up on arithmetic whatever the task.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass

import pandas as pd

from self_improve.stage import derive_seed
from self_improve.config import Params
from self_improve.models.base import resolve_base
from self_improve.models.loading import (
    build_char_tokenizer,
    build_tiny_model,
    default_device,
)
from self_improve.tasks import task_for
from self_improve.training.loop import Schedule, TrainLog
from self_improve.training.trainers import RunContext, SFTTrainer

log = logging.getLogger(__name__)


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
    categories: list[str] | None = None  # the curriculum's arms


def prepare(params: Params, progress: bool = True) -> Prepared:
    cfg = params.prepare
    record = None if params.model.builtin else resolve_base(params.model, params.security)  # before any work
    task = task_for(params.task)
    sets = task.sets(derive_seed(params.seed, "split"), cfg.train_size)  # the user's file is checked here
    arms = task.categories(sets)
    if record is not None:
        log.info("base model: %s (%s), content sha256 %s", record["base"], record["kind"], record["sha256"][:12])
        return Prepared(sets.heldout, sets.ttt, sets.seed, None, None, TrainLog(), None, record, arms)
    warmup = task.warmup(derive_seed(params.seed, "split"), cfg.train_size, sets)
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(cfg.model, tokenizer, derive_seed(params.seed, "init")).to(default_device())
    init_model = copy.deepcopy(model)
    n_params = sum(p.numel() for p in model.parameters())
    log.info("base model: %d parameters, %d SFT problems, %d steps", n_params, len(warmup), cfg.steps)
    sched = Schedule(cfg.lr, cfg.steps, cfg.warmup_steps, cfg.min_lr_ratio)
    ctx = RunContext(tokenizer, sched, cfg.batch_size, derive_seed(params.seed, "prepare-order"))
    train_log = SFTTrainer(ctx, desc="prepare", stop_loss=cfg.stop_loss).train(
        model, list(warmup["prompt"]), list(warmup["response"]))
    return Prepared(sets.heldout, sets.ttt, sets.seed, model, tokenizer, train_log, init_model, None, arms)
