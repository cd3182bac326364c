"""What the tasks that a real model answers in free text share: a question shown with the task's
instruction line, answers read by the field's conventions and checked by equivalence."""

from __future__ import annotations

import pandas as pd

from self_improve.tasks.answers import answer_end, Extracted, equivalent, extract
from self_improve.tasks.arithmetic import arithmetic_warmup
from self_improve.tasks.base import TaskSets


class FreeTextAnswers:
    instruction: str | None = None

    def show(self, question: str) -> str:
        """The question as the model sees it: then the task's instruction line, if it has one."""
        return f"{question}\n{self.instruction}" if self.instruction else question

    def question(self, prompt: str) -> str:
        """`show` undone."""
        if self.instruction and prompt.endswith("\n" + self.instruction):
            return prompt[: -len(self.instruction) - 1]
        return prompt

    def warmup(self, seed: int, train_size: int, sets: TaskSets) -> pd.DataFrame:
        return arithmetic_warmup(seed, train_size)  # the embedded model is a character-level adder

    def extract(self, response: str | None) -> Extracted:
        return extract(response)

    def answer_end(self, response: str) -> int | None:
        """Where the response's first complete stated answer ends (answers.answer_end); None for
        open prompts, which state none."""
        return None if getattr(self, "open_ended", False) else answer_end(response)

    def verify(self, answer: str | None, gold: str | None, category: str | None = None) -> float | None:
        return float(equivalent(answer, gold)) if isinstance(gold, str) else None
