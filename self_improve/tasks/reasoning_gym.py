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
paraphrases for co_reward, eva's new problems, the seed data for SPIN) is the file tasks', but for
`sec` with `evolve.sec_scope: mix`: the bandit then allocates the whole training mix (as many problems
as the test-time set and `evolve.fresh` together) over the categories, a category's test-time
problems first and fresh draws from its entry for the rest, so the curriculum moves the mix between
levels and operations. Fresh draws come from each entry's own stream seeded by the iteration, never a
held-out or test-time question.

The label-free choice reads each test-time arithmetic problem in a second wording (`view`: reasoning-gym's
other template, the terms reversed where the operation commutes), so a gym loop records the cross-view
agreement the word problems do; its study over eight kept six-iteration runs picked within one s.e. of
the best in 7 of 8, as base support did (research/results/smollm2_gym_long/views/views.md).
"""

from __future__ import annotations

import logging
import math
import random
import re
from typing import Any, Optional

import pandas as pd

from self_improve.config import EvolveStrategy, SecScope, TaskConfig
from self_improve.curriculum import allocate
from self_improve.errors import ConfigError
from self_improve.tasks.answers import Extracted, extract
from self_improve.tasks.base import ProposeInput, TaskSets, frame, prompt_rows, seed_frame, steer
from self_improve.tasks.files import FileTask
from self_improve.tasks.inverse import expression_inverse

log = logging.getLogger(__name__)

# fresh draws: how many of an entry's items are read per problem still wanted before giving up (a level
# with few distinct problems runs out; the shortfall is logged and counted in the prompts' provenance)
DRAWS_PER_PROBLEM = 64
MIN_DRAWS = 2048

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


# reasoning-gym's two templates of an arithmetic question (basic_arithmetic and chain_sum)
_CALCULATE = re.compile(r"^Calculate (?P<expr>.+)\.$")
_STATE = re.compile(r"^State the final answer to the following arithmetic problem: (?P<expr>.+) =$")
_TERMS = re.compile(r"^-?\d+(\s[-+*/]\s-?\d+)+$")


def other_wording(question: str) -> str | None:
    """The same arithmetic problem in reasoning-gym's other template, its terms reversed where every operation
    is + or every one is * (a sum or product reads the same backwards): "Calculate 4 * 7." -> "State the final
    answer to the following arithmetic problem: 7 * 4 =". None for a question in neither template or not one
    flat expression (parentheses, words)."""
    m = _CALCULATE.match(question) or _STATE.match(question)
    if m is None or not _TERMS.match(m["expr"]):
        return None
    parts = m["expr"].split(" ")
    ops = set(parts[1::2])
    expr = " ".join(parts[::-1]) if ops <= {"+"} or ops <= {"*"} else m["expr"]
    if m.re is _CALCULATE:
        return f"State the final answer to the following arithmetic problem: {expr} ="
    return f"Calculate {expr}."


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

    steers_mix = True  # evolve.sec_scope: mix fills a category with fresh draws from its entry (check_scope)

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

    def view(self, prompt: str) -> str | None:
        """The test-time problem's second wording, which evaluate answers beside the first for the label-free
        choice's cross-view agreement (evaluation.rewritten): `other_wording` of its question, shown as the
        task shows its questions; None where there is none: that problem adds nothing to the agreement, and a
        mix with no such problem reads base support alone."""
        other = other_wording(self.question(prompt))
        return None if other is None else self.show(other)

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

    def pick(self, inp: ProposeInput, rng: random.Random) -> list[tuple]:
        """With `sec` and `sec_scope: mix`, the bandit's allocation of test-time and fresh problems
        together: each category's test-time problems first (drawn at random, kept in their order), fresh
        draws of that category for the rest. Otherwise the file tasks' choice."""
        cfg = inp.cfg
        if not (cfg.strategy == EvolveStrategy.sec and cfg.sec_scope == SecScope.mix):
            return super().pick(inp, rng)
        if inp.curriculum is None:
            raise ValueError("sec needs the curriculum state")
        keep, rest = steer(list(inp.ttt["category"]), allocate(inp.curriculum, len(inp.ttt) + cfg.fresh, rng), rng)
        pool = inp.ttt.iloc[sorted(keep)]
        problems = list(zip(pool["group_id"], pool["source"], pool["category"], pool["prompt"], pool["answer"]))
        forbidden = {_key(self.question(p)) for p in (*inp.heldout["prompt"], *inp.ttt["prompt"])}
        drawn, short = self.fresh(rest, inp.seed, forbidden)
        inp.stats["fresh_by_category"] = {c: n for c, n in sorted(rest.items())}
        if short:
            inp.stats["fresh_short"] = short
            log.warning("fresh draws ran short of distinct problems: %s (the mix is that much smaller)",
                        ", ".join(f"{c} {n}" for c, n in short.items()))
        tag = inp.iteration
        return problems + [(f"{tag}-fresh-{i:05d}", "fresh", cat, self.show(q), a)
                           for i, (q, a, cat) in enumerate(drawn)]

    def fresh(self, need: dict[str, int], seed: int, forbidden: set[str]) -> tuple[list[tuple[str, str, str]], dict]:
        """`need[category]` new problems of each category, (question, answer, category), in order of
        category: read from the category's entry in a stream of its own seeded by `seed`, skipping a
        question in `forbidden` (keys) or drawn already. What a category could not get: the second value."""
        by_entry: dict[int, dict[str, int]] = {}
        labels = [e.category for e in self.entries]
        for cat, n in need.items():
            label = self.entry_label(cat)
            if label is None or n <= 0:
                continue
            by_entry.setdefault(labels.index(label), {})[cat] = n
        got: dict[str, list[tuple[str, str, str]]] = {c: [] for c in need}
        seen = set(forbidden)
        for i, wanted in sorted(by_entry.items()):
            e = self.entries[i]
            budget = max(MIN_DRAWS, DRAWS_PER_PROBLEM * sum(wanted.values()))
            ds = make_dataset(e.name, e.config, budget, (seed * 1009 + i) % 2**32, f"task.datasets[{i}]")
            missing = dict(wanted)
            for item in ds:
                cat = category_of(e.category, item.get("metadata"))
                k = _key(item["question"])
                if missing.get(cat, 0) <= 0 or k in seen:
                    continue
                seen.add(k)
                got[cat].append((item["question"], str(item["answer"]), cat))
                missing[cat] -= 1
                if not any(v > 0 for v in missing.values()):
                    break
        short = {c: n - len(got.get(c, [])) for c, n in sorted(need.items()) if n > len(got.get(c, []))}
        return [p for c in sorted(got) for p in got[c]], short

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
