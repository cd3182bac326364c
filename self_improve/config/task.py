"""params.yaml `task`: which problems, from where, how many."""

from __future__ import annotations

import enum
from typing import Annotated, Any, Optional

from pydantic import AfterValidator, Field, field_validator, model_validator

from self_improve.config.base import _Section
from self_improve.config.tables import named_in
from self_improve.config.tasks import TASKS, task_of


WORD_OPS = ("add", "sub", "mul", "div")


class OnError(str, enum.Enum):
    fail = "raise"  # the first bad row stops prepare with its file, row and column
    skip = "skip"  # bad rows are dropped and counted by reason


class GymDataset(_Section):
    """One reasoning-gym dataset of task.datasets: its name, its own config, its share, its category."""

    name: str = Field(min_length=1, description="a reasoning-gym dataset, e.g. chain_sum, basic_arithmetic")
    config: dict[str, Any] = Field(default_factory=dict, description="the dataset's own config (difficulty)")
    weight: float = Field(1.0, gt=0, description="its share of every set, relative to the other entries")
    label: Optional[str] = Field(None, min_length=1, description="its category (default: the name); "
                                 "entries of one dataset at other settings are levels")

    @property
    def category(self) -> str:
        return self.label or self.name


class TaskConfig(_Section):
    """The task (self_improve/tasks/): procedural, or the user's file; and the evaluation sets."""

    name: Annotated[str, AfterValidator(named_in(TASKS))] = Field(
        "arithmetic", description="the task: an entry of the task table (self_improve/config/tasks.py), built in "
        "or added with `register_task` (docs/extending.md)",
    )
    prompt_file: str = Field(
        "data/inputs/instructions.jsonl", min_length=1,
        description="instructions / math_file: JSONL or parquet with `prompt`, optional `answer` and `category`",
    )
    columns: Optional[dict[str, str]] = Field(
        None, description="instructions / math_file: the file's column for `prompt`, `answer`, `category`, "
        "e.g. {prompt: question, answer: answer}; other columns are then ignored",
    )
    heldout_file: Optional[str] = Field(
        None, min_length=1, description="instructions / math_file: a separate held-out file (same columns); "
        "None: hold out `heldout_fraction` of prompt_file",
    )
    instruction: Optional[str] = Field(
        None, min_length=1, description="word_math / math_file: a line added after every question, "
        "e.g. how to state the answer",
    )
    levels: list[str] = Field(
        ["add", "sub", "mul"], min_length=1,
        description="word_math: the chains of operations (add, sub, mul, div joined by +, 1-3 steps) "
        "that problems are drawn from; each is a category",
    )
    max_number: int = Field(10, ge=2, description="word_math: largest number a problem starts with or adds")
    max_factor: int = Field(5, ge=2, description="word_math: largest factor of a `mul` step (with max_number, "
                            "how many distinct multiplication problems exist)")
    datasets: list[GymDataset] = Field(
        default_factory=list, description="reasoning_gym: the datasets drawn from (name, config, weight, label)")
    on_error: OnError = Field(
        OnError.fail, description="prompts: a bad row raises, or is skipped and counted"
    )
    max_prompt_chars: int = Field(2000, ge=1, description="prompts: longer prompts are bad rows")
    heldout_fraction: float = Field(
        0.25, gt=0, lt=1, description="prompts: share of the file held out for evaluation (win rate)"
    )
    min_operand: int = Field(10, ge=0)
    max_operand: int = Field(99, ge=1)
    heldout_size: int = Field(500, ge=1, description="held-out problems, disjoint from all training")
    ttt_size: int = Field(1000, ge=1, description="test-time problems: prompts trainable, answers measured")
    dev_size: int = Field(0, ge=0, description="word_math / reasoning_gym: problems of a dev set, disjoint from "
                          "held-out and test-time, on which design choices are fitted (diagnosis, lengths, "
                          "thresholds); the loop never reads it")

    @model_validator(mode="after")
    def _range(self) -> "TaskConfig":
        if self.max_operand <= self.min_operand:
            raise ValueError("max_operand must be greater than min_operand")
        return self

    @field_validator("datasets")
    @classmethod
    def _datasets(cls, v: list[GymDataset]) -> list[GymDataset]:
        cats = [d.category for d in v]
        if len(set(cats)) != len(cats):
            raise ValueError("two entries share a category: give each entry of one dataset its own label")
        return v

    @field_validator("levels")
    @classmethod
    def _levels(cls, v: list[str]) -> list[str]:
        for level in v:
            ops = level.split("+")
            if not 1 <= len(ops) <= 3 or any(op not in WORD_OPS for op in ops):
                raise ValueError(f"{level!r} is not a chain of 1 to 3 of {', '.join(WORD_OPS)} joined by +")
        if len(set(v)) != len(v):
            raise ValueError("a level is listed twice")
        return v

    @field_validator("columns")
    @classmethod
    def _columns(cls, v: Optional[dict[str, str]]) -> Optional[dict[str, str]]:
        if v is None:
            return v
        for key, col in v.items():
            if key not in ("prompt", "answer", "category"):
                raise ValueError(f"{key!r} is not one of prompt, answer, category")
            if not isinstance(col, str) or not col:
                raise ValueError(f"{key}: the file's column name must be a non-empty string")
        if "prompt" not in v:
            raise ValueError("the mapping needs `prompt` (the file's question column)")
        return v

    @property
    def kind(self) -> str:
        """The task's name, with the earlier name `prompts` read as `instructions`."""
        return "instructions" if self.name == "prompts" else self.name

    @property
    def entry(self):
        """This task's entry of the task table (self_improve/config/tasks.py)."""
        return task_of(self.name)
