"""Tasks: one module each, one interface (base.Task) that every stage uses.

- `arithmetic`: two-digit addition for the embedded character-level model (the default);
- `word_math`: procedural grade-school word problems, the real-model default;
- `math_file`: the user's GSM8K- or MATH-style file;
- `instructions` (earlier `prompts`): the user's open prompts, answers optional;
- `reasoning_gym`: reasoning-gym's procedural datasets, graded by their own scorers (optional extra).
"""

from __future__ import annotations

from self_improve.config import TaskConfig
from self_improve.tasks.answers import Extracted, equivalent, extract, gold_answer, normalise
from self_improve.tasks.arithmetic import ArithmeticTask, Problem
from self_improve.tasks.base import ProposeInput, Task, TaskSets
from self_improve.tasks.files import FileTask
from self_improve.tasks.word_math import WordMathTask

__all__ = ["ArithmeticTask", "Extracted", "FileTask", "Problem", "ProposeInput", "Task", "TaskSets",
           "WordMathTask", "answer_stop", "equivalent", "extract", "gold_answer", "normalise", "task_for"]


def task_for(cfg: TaskConfig) -> Task:
    """The task that `task.name` names in the task table (self_improve/config/tasks.py), configured by
    the rest of the `task` section; reasoning_gym's optional package is imported only when it is built."""
    return cfg.entry.build(cfg)


def answer_stop(task: Task, on: bool):
    """The task's `answer_end` when `sample.stop_at_answer` is on and the task states answers, else None."""
    return getattr(task, "answer_end", None) if on else None
