"""The task table: every `task.name`, once, with where its code lives and what the stages need of it.

An entry's `make` is `"module:Class"` (imported when the task is built) or the class itself, called
with the `task` section (TaskConfig) and returning an object with the Task interface
(self_improve/tasks/base.py: `sets`, `categories`, `warmup`, `propose`, `extract`, `verify`).
`check_sets` asks check_params to draw the task's sets before any stage deletes an output (a task
whose datasets refuse bad names and values only when drawn); `files` says it reads the user's
`prompt_file`. Adding a task is one module and one `register_task` call (docs/extending.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Union

from self_improve.config.tables import Table, resolve


@dataclass(frozen=True)
class TaskEntry:
    make: Union[str, Callable[..., Any]]  # "module:Class" or the class: make(TaskConfig) -> Task
    about: str = ""
    check_sets: bool = False  # check_params draws the sets (reasoning_gym's datasets check themselves then)
    files: bool = False  # reads the user's prompt_file (and heldout_file)
    math: bool = False  # answers are checked as maths (math_file needs an `answer` column)

    def build(self, cfg) -> Any:
        return resolve(self.make)(cfg)


TASKS: Table[TaskEntry] = Table("task", {
    "arithmetic": TaskEntry("self_improve.tasks.arithmetic:ArithmeticTask",
                            "procedural two-digit addition, verifiable (the tiny model's task)"),
    "word_math": TaskEntry("self_improve.tasks.word_math:WordMathTask",
                           "procedural grade-school word problems, 1-3 steps (real models)"),
    "math_file": TaskEntry("self_improve.tasks.files:FileTask", files=True, math=True,
                           about="the user's GSM8K- or MATH-style file (`prompt_file`, `columns`)"),
    "instructions": TaskEntry("self_improve.tasks.files:FileTask", files=True,
                              about="the user's open prompts (`prompt_file`); answers optional"),
    "prompts": TaskEntry("self_improve.tasks.files:FileTask", files=True,
                         about="the earlier name of `instructions`"),
    "reasoning_gym": TaskEntry("self_improve.tasks.reasoning_gym:ReasoningGymTask", check_sets=True,
                               about="reasoning-gym's procedural datasets (`datasets`), graded by their scorers"),
})

register_task = TASKS.register  # a new task.name: register_task("name", TaskEntry(...))
unregister_task = TASKS.unregister
task_of = TASKS.of  # the entry of a task.name; an unknown one refused with the table's names
