"""`reasoning_gym`: problems from reasoning-gym's procedural datasets (PyPI `reasoning-gym`, the
`tasks` extra), graded by each dataset's own `score_answer`.

`task.datasets` lists the datasets to draw from, each with its own reasoning-gym config and a
weight; an entry's `label` (default: the dataset's name) is its category, so several entries of
one dataset at different difficulty settings are levels the `sec` curriculum moves between:

    task:
      name: reasoning_gym
      instruction: "Answer with the final number only."
      datasets:
        - {name: chain_sum, label: chain_sum-2, config: {min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}}
        - {name: chain_sum, label: chain_sum-3, config: {min_terms: 3, max_terms: 3, min_digits: 1, max_digits: 2}}

The held-out, test-time and seed sets are drawn from one seeded stream per entry and are disjoint
by content (a question is one problem whatever its spacing or case). The answer is read by the
project's extraction (and from reasoning-gym's `<answer>...</answer>` when a response uses it);
right means the dataset's `score_answer` gives 1.0 for it against the gold (partial credit counts
as wrong). Everything else (the iteration's prompts from the test-time set, the model's
paraphrases for co_reward, eva's new problems, the seed data for SPIN) is the file tasks'.
"""

from __future__ import annotations

import math
import re
from typing import Any, Optional

import pandas as pd

from self_improve.config import TaskConfig
from self_improve.errors import ConfigError
from self_improve.tasks.answers import Extracted, extract
from self_improve.tasks.base import TaskSets, frame, prompt_rows, seed_frame
from self_improve.tasks.files import FileTask
from self_improve.tasks.inverse import expression_inverse

_ANSWER_TAG = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL | re.IGNORECASE)


def _gym():
    try:
        import reasoning_gym
    except ImportError:
        raise ConfigError("task.name reasoning_gym needs the reasoning-gym package: "
                          "pip install -e '.[tasks]' (or pip install 'reasoning-gym>=0.1.25')") from None
    return reasoning_gym


def _key(question: str) -> str:
    """A question's identity for disjointness: case and spacing do not make another problem."""
    return " ".join(question.lower().split())


OPERATIONS = {"+": "add", "-": "sub", "*": "mul", "/": "div"}
_OPERATOR = re.compile(r"\s([-+*/])\s")


def category_of(label: str, metadata: dict) -> str:
    """A problem's category: its entry's label, and for an arithmetic expression its operations
    (`chain_sum-2x12.sub`, `basic_arithmetic-2x1.mul`), so that a policy that learns one operation
    shows as one category rising; a mixed expression names each of its operations once, in the order
    add, sub, mul, div (`add+mul`)."""
    expression = metadata.get("expression") if isinstance(metadata, dict) else None
    if not isinstance(expression, str):
        return label
    found = {OPERATIONS[o] for o in _OPERATOR.findall(f" {expression} ")}
    ops = [op for op in OPERATIONS.values() if op in found]
    return f"{label}.{'+'.join(ops)}" if ops else label


def known_fault(name: str, dataset: Any) -> str | None:
    """Why a dataset's gold answers cannot be trusted under its config, for settings where reasoning-gym
    (0.1.25 and its main branch alike) writes answers that do not match their questions; None elsewhere.

    basic_arithmetic without parentheses builds its question from the drawn numbers, then for a `/`
    picks another divisor (or falls back to `*` with another number) for the answer only: "Calculate
    5 / 9." has the gold 10. The other operators are right, and so is the generator with parentheses
    (its answer is the question's expression evaluated, `/` as floor division)."""
    cfg = getattr(dataset, "config", None)
    if name == "basic_arithmetic" and cfg is not None and not getattr(cfg, "allow_parentheses", True) \
            and "/" in tuple(getattr(cfg, "operators", ())):
        return ("reasoning-gym's basic_arithmetic without parentheses gives its `/` problems gold answers "
                "that do not match the question (\"Calculate 5 / 9.\" -> 10); leave '/' out of operators, "
                "e.g. operators: ['+', '-', '*'], or allow parentheses")
    return None


def make_dataset(name: str, config: dict[str, Any], size: int, seed: int, where: str):
    """reasoning-gym's dataset, with its refusals (unknown name, key or value) named by `where`, and
    settings whose gold answers are known to be wrong (`known_fault`) refused too."""
    gym = _gym()
    try:
        dataset = gym.create_dataset(name, size=size, seed=seed, **config)
    except (KeyError, ValueError, TypeError, AssertionError) as err:
        known = ""
        try:
            from reasoning_gym.factory import DATASETS

            if name not in DATASETS:
                known = f" (not a reasoning-gym dataset; e.g. {', '.join(sorted(DATASETS)[:6])}, ...)"
        except ImportError:  # pragma: no cover - older layouts
            pass
        raise ConfigError(f"{where}: reasoning-gym refused {name!r} with config {config}: {err}{known}") from None
    if fault := known_fault(name, dataset):
        raise ConfigError(f"{where}.config.operators: {fault}")
    return dataset


class ReasoningGymTask(FileTask):
    """reasoning-gym datasets through the file tasks' machinery, graded by the datasets' scorers."""

    def __init__(self, cfg: TaskConfig):
        super().__init__(cfg)
        self.name = "reasoning_gym"
        self.math = True
        self.open_ended = False
        if not cfg.datasets:
            raise ConfigError("task.datasets: reasoning_gym needs at least one dataset, e.g. "
                              "[{name: chain_sum, config: {min_terms: 2, max_terms: 2}}]")
        self.entries = cfg.datasets
        # one small instance per entry: its scorer (some read their own config) and an early refusal
        self._scorers = {e.category: make_dataset(e.name, e.config, 1, 0, f"task.datasets[{i}]")
                         for i, e in enumerate(self.entries)}

    def extract(self, response: str | None) -> Extracted:
        tagged = _ANSWER_TAG.search(response or "")
        return extract(tagged.group(1) if tagged else response)

    def answer_end(self, response: str) -> int | None:
        """A closed `<answer>...</answer>` ends the answer too (reasoning-gym's own format)."""
        tagged = _ANSWER_TAG.search(response)
        ends = [e for e in (tagged.end() if tagged else None, super().answer_end(response)) if e is not None]
        return min(ends) if ends else None

    def inverse(self, prompt: str, answer: str | None) -> list[tuple[str, str]]:
        """An arithmetic question asked backwards with `answer` proposed (tasks/inverse.py), shown as
        the task shows its questions; [] for a question that is not one two-number expression."""
        return [(self.show(q), hidden) for q, hidden in expression_inverse(self.question(prompt), answer)]

    def entry_label(self, category: Optional[str]) -> Optional[str]:
        """The entry a category belongs to (its label, with or without the operations `category_of` adds)."""
        if not isinstance(category, str):
            return None
        if category in self._scorers:
            return category
        head = category.rsplit(".", 1)[0]
        return head if head in self._scorers else None

    def verify(self, answer: str | None, gold: str | None, category: Optional[str] = None) -> float | None:
        """1.0 when the dataset's score_answer gives 1.0. Without the category (a caller that has
        none), right when some configured dataset's scorer says so."""
        if not isinstance(gold, str):
            return None
        if not isinstance(answer, str):  # None, or the NaN a pandas string column holds for a missing answer
            return 0.0
        entry = self.entry_label(category)
        scorers = [self._scorers[entry]] if entry is not None else list(self._scorers.values())
        entry = {"question": "", "answer": gold, "metadata": {}}
        return float(any(s.score_answer(answer, entry) >= 1.0 for s in scorers))

    def sets(self, seed: int, train_size: int) -> TaskSets:
        # dev after held-out and test-time: each entry's stream draws item i the same whatever comes
        # after it, so a dev set leaves those two as they were; before the seed data, which takes what is left
        sizes = {"heldout": self.cfg.heldout_size, "ttt": self.cfg.ttt_size, "dev": self.cfg.dev_size,
                 "seed": train_size}
        total_weight = sum(e.weight for e in self.entries)
        seen: set[str] = set()
        drawn: dict[str, list[tuple[str, str, str]]] = {k: [] for k in sizes}  # (question, answer, category)
        shares = [{} for _ in self.entries]
        for k, n in sizes.items():  # each set split by weight (largest remainders, ties to the first entry)
            exact = [n * e.weight / total_weight for e in self.entries]
            counts = [math.floor(x) for x in exact]
            by_rest = sorted(range(len(exact)), key=lambda j: (-(exact[j] - counts[j]), j))
            for j in by_rest[:n - sum(counts)]:
                counts[j] += 1
            for share, c in zip(shares, counts):
                share[k] = c
        for i, (e, share) in enumerate(zip(self.entries, shares)):
            need = sum(share.values())
            # one seeded stream per entry; drawn with room for duplicates, which are skipped
            ds = make_dataset(e.name, e.config, 2 * need + 16, seed * 1009 + i, f"task.datasets[{i}]")
            it = iter(ds)
            for part in sizes:
                got = 0
                while got < share[part]:
                    try:
                        item = next(it)
                    except StopIteration:
                        if part == "seed":
                            break  # the seed data takes what is left
                        raise ConfigError(f"task.datasets[{i}] ({e.name}, {e.config}): too few distinct "
                                          f"problems for task.{part}_size {sizes[part]}") from None
                    k = _key(item["question"])
                    if k in seen:
                        continue
                    seen.add(k)
                    drawn[part].append((item["question"], str(item["answer"]),
                                        category_of(e.category, item.get("metadata"))))
                    got += 1

        def prompts(items: list[tuple[str, str, str]], source: str) -> pd.DataFrame:
            rows = []
            for j, (q, a, cat) in enumerate(items):
                rows += prompt_rows("it0", f"{source}-{j:05d}", source, cat, [(self.show(q), a)])
            return frame(rows)

        heldout, ttt = prompts(drawn["heldout"], "heldout"), prompts(drawn["ttt"], "ttt")
        seed_items = drawn["seed"]
        seed_sft = seed_frame([self.show(q) for q, _, _ in seed_items], [a for _, a, _ in seed_items])
        return TaskSets(heldout, ttt, seed_sft, prompts(drawn["dev"], "dev"))

    def categories(self, sets: TaskSets) -> list[str]:
        """The categories the sets hold (an entry's label, with its operations where it has them)."""
        return sorted({c for df in (sets.heldout, sets.ttt) for c in df["category"].dropna()})
