"""`arithmetic`: two-digit addition for the embedded character-level model.

Posed as ``"23+45="`` with the answer ``"68"``, read as the response's leading integer. A problem
has equivalent rewrites with the same answer (``45+23``, ``(23+d)+(45-d)``); the co_reward judge
uses their agreement. Ground truth is used only by the verifier and to measure.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

import pandas as pd

from self_improve.config import TaskConfig
from self_improve.tasks.answers import Extracted
from self_improve.tasks.base import ProceduralTask, TaskSets, frame, prompt_rows, seed_frame

_ANSWER = re.compile(r"^\s*(-?\d+)")
_PROMPT = re.compile(r"^(\d+)\+(\d+)=$")


def extract_answer(response: str | None) -> str | None:
    """The normalised final answer of a response (leading integer), or None if there is none."""
    if response is None:
        return None
    m = _ANSWER.match(response)
    if not m:
        return None
    return str(int(m.group(1)))


def verify(pred: str | None, answer: str | None, category: str | None = None) -> float | None:
    """1.0 if the prediction equals the ground truth, 0.0 if not, None without ground truth."""
    if answer is None:
        return None
    return 1.0 if pred is not None and pred == extract_answer(answer) else 0.0


@dataclass(frozen=True, order=True)
class Problem:
    a: int
    b: int

    @property
    def prompt(self) -> str:
        return f"{self.a}+{self.b}="

    @property
    def answer(self) -> str:
        return str(self.a + self.b)

    @property
    def category(self) -> str:
        """Difficulty by carries: no_carry, units_carry, tens_carry (3-digit sum) or both_carry."""
        units = (self.a % 10 + self.b % 10) >= 10
        tens = (self.a // 10 % 10 + self.b // 10 % 10 + units) >= 10
        return {(False, False): "no_carry", (True, False): "units_carry",
                (False, True): "tens_carry", (True, True): "both_carry"}[(units, tens)]

    @property
    def unordered(self) -> tuple[int, int]:
        return (min(self.a, self.b), max(self.a, self.b))

    key = unordered  # a+b and b+a are the same problem


def problems_frame(problems: list[Problem], source: str) -> pd.DataFrame:
    rows = []
    for i, p in enumerate(problems):
        rows += prompt_rows("it0", f"{source}-{i:05d}", source, p.category, [(p.prompt, p.answer)])
    out = frame(rows)
    out["prompt_id"] = out["group_id"]  # the base sets were written with bare ids
    return out


class ArithmeticTask(ProceduralTask):
    """Two-operand addition over [min_operand, max_operand]."""

    name = "arithmetic"
    floors = False  # the sum of the question's numbers is the task itself: no shortcut to floor
    CATEGORIES = ("no_carry", "units_carry", "tens_carry", "both_carry")

    def __init__(self, cfg: TaskConfig):
        self.lo, self.hi = cfg.min_operand, cfg.max_operand
        self.cfg = cfg

    def sets(self, seed: int, train_size: int) -> TaskSets:
        heldout, ttt, train = self.split(seed, train_size)
        return TaskSets(problems_frame(heldout, "heldout"), problems_frame(ttt, "ttt"),
                        seed_frame([p.prompt for p in train], [p.answer for p in train]))

    def categories(self, sets: TaskSets) -> list[str]:
        return list(self.CATEGORIES)

    def warmup(self, seed: int, train_size: int, sets: TaskSets) -> pd.DataFrame:
        """The embedded model's warm-up data: the seed problems."""
        return sets.seed

    def extract(self, response: str | None) -> Extracted:
        answer = extract_answer(response)
        return Extracted(answer, None if answer is None else "leading_integer")

    def verify(self, answer: str | None, gold: str | None, category: str | None = None) -> float | None:
        return verify(answer, gold)

    def fresh(self, rng: random.Random, n, forbidden: set, taken: set) -> list[Problem]:
        """`n` new problems at random, or {category: count} of them (sec)."""
        pool = [p for p in self.all_problems() if p.unordered not in forbidden and p not in taken]
        if isinstance(n, int):
            return rng.sample(pool, min(n, len(pool)))
        out: list[Problem] = []
        for cat in sorted(n):
            in_cat = [p for p in pool if p.category == cat]
            out += rng.sample(in_cat, min(n[cat], len(in_cat)))
        return out

    def in_range(self, x: int) -> bool:
        return self.lo <= x <= self.hi

    def all_problems(self) -> list[Problem]:
        return [Problem(a, b) for a in range(self.lo, self.hi + 1) for b in range(self.lo, self.hi + 1)]

    def parse(self, prompt: str) -> Problem:
        m = _PROMPT.match(prompt)
        if not m:
            raise ValueError(f"not an arithmetic prompt: {prompt!r}")
        return Problem(int(m.group(1)), int(m.group(2)))

    def split(self, seed: int, train_size: int) -> tuple[list[Problem], list[Problem], list[Problem]]:
        """Held-out, test-time and base-training problems.

        Held-out problems are drawn as unordered pairs, so neither ``a+b`` nor ``b+a`` of a
        held-out problem is ever a training prompt. Test-time problems are unseen by the base
        model but the loop may train on their prompts.
        """
        rng = random.Random(seed)
        pairs = sorted({p.unordered for p in self.all_problems()})
        rng.shuffle(pairs)
        need_heldout = self.cfg.heldout_size
        heldout: list[Problem] = []
        i = 0
        while len(heldout) < need_heldout and i < len(pairs):
            a, b = pairs[i]
            heldout.append(Problem(a, b))
            if a != b and len(heldout) < need_heldout:
                heldout.append(Problem(b, a))
            i += 1
        rest = [Problem(a, b) for a, b in pairs[i:]] + [Problem(b, a) for a, b in pairs[i:] if a != b]
        rest.sort()
        rng.shuffle(rest)
        need = self.cfg.ttt_size + train_size
        if len(heldout) < need_heldout or len(rest) < need:
            raise ValueError(
                f"task: operand range {self.lo}..{self.hi} has {len(self.all_problems())} problems, "
                f"too few for heldout_size + ttt_size + prepare.train_size"
            )
        ttt = rest[: self.cfg.ttt_size]
        train = rest[self.cfg.ttt_size : need]
        return heldout, ttt, train

    def rewrites(self, p: Problem, n: int, rng: random.Random, forbidden: set[tuple[int, int]]) -> list[Problem]:
        """Up to `n` distinct problems with the same answer: ``b+a``, then ``(a+d)+(b-d)``."""
        out: list[Problem] = []
        seen = {p}

        def add(q: Problem) -> None:
            if q not in seen and q.unordered not in forbidden and self.in_range(q.a) and self.in_range(q.b):
                seen.add(q)
                out.append(q)

        add(Problem(p.b, p.a))
        shifts = [d for d in range(-(self.hi - self.lo), self.hi - self.lo + 1) if d]
        rng.shuffle(shifts)
        for d in shifts:
            if len(out) >= n:
                break
            add(Problem(p.a + d, p.b - d))
        return out[:n]

    def mutate(self, p: Problem, rng: random.Random, forbidden: set[tuple[int, int]]) -> Problem | None:
        """A nearby problem: one operand nudged, keeping its carry structure when possible."""
        for _ in range(20):
            which = rng.randrange(2)
            delta = rng.choice([-10, -1, 1, 10])
            a, b = (p.a + delta, p.b) if which == 0 else (p.a, p.b + delta)
            q = Problem(a, b)
            if self.in_range(a) and self.in_range(b) and q.unordered not in forbidden:
                return q
        return None


def arithmetic_warmup(seed: int, train_size: int) -> pd.DataFrame:
    """The embedded character-level model's warm-up under any other task: default arithmetic."""
    return ArithmeticTask(TaskConfig()).sets(seed, train_size).seed
