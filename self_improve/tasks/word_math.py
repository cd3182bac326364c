"""`word_math`: procedural grade-school word problems, one to three steps, whole-number answers.

"Sam has 5 apples and buys 14 more. How many apples does Sam have now?" A problem is a starting
quantity and a chain of operations on it (`add`, `sub`, `mul`, `div`), each step written in one of
several phrasings, about one of several people and things. Its category is its chain (`add`,
`add+sub`, ...): the difficulty levels that `task.levels` chooses and the curriculum's arms. The gold
answer is written the GSM8K way, a worked solution ending in ``#### N`` (the seed data); the
prompt sets hold N.

Every problem has equivalent rewrites (co_reward): the same numbers and answer in other words (other
phrasings, another person and thing) and, for a sum, the quantities in the other order. Prompts are
parsed back into problems from their sentences, so held-out problems are kept out of every training
prompt in any wording, and eva can mutate a problem it has only seen as text.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

import pandas as pd

from self_improve.errors import ConfigError
from self_improve.tasks.base import ProceduralTask, TaskSets, frame, prompt_rows, seed_frame
from self_improve.tasks.free_text import FreeTextAnswers

NAMES = ("Sam", "Mia", "Leo", "Ava", "Noah", "Zoe", "Omar", "Lina", "Tom", "Ella", "Ravi", "Nora")
ITEMS = ("apples", "stickers", "marbles", "books", "coins", "pencils", "cookies", "shells", "cards", "eggs")
OPS = ("add", "sub", "mul", "div")

START = (
    "{name} has {n} {item}.",
    "There are {n} {item} in {name}'s bag.",
    "{name} starts the day with {n} {item}.",
)
STEP = {
    "add": ("{name} buys {n} more {item}.", "A friend gives {name} {n} more {item}.",
            "{name} finds {n} more {item}."),
    "sub": ("{name} gives {n} {item} away.", "{name} loses {n} of the {item}.",
            "{name} uses {n} of the {item}."),
    "mul": ("Then {name} ends up with {n} times as many {item}.",
            "The number of {item} that {name} has grows to {n} times as many.",
            "{name} collects until there are {n} times as many {item}."),
    "div": ("{name} splits the {item} into {n} equal groups and keeps one group.",
            "{name} shares the {item} equally with friends so that {n} people get the same number, "
            "{name} included, and keeps one share.",
            "{name} puts the {item} into {n} equal piles and keeps only one pile."),
}
QUESTION = (
    "How many {item} does {name} have now?",
    "How many {item} does {name} have at the end?",
    "In the end, how many {item} does {name} have?",
)
SOLUTION_WORD = {"add": "+", "sub": "-", "mul": "*", "div": "/"}


def _pattern(template: str) -> re.Pattern:
    out = re.escape(template)
    for key, group in (("name", r"(?P<name>[A-Z][a-z]+)"), ("n", r"(?P<n>\d+)"), ("item", r"(?P<item>[a-z]+)")):
        esc = re.escape("{" + key + "}")
        out = out.replace(esc, group, 1).replace(esc, f"(?P={key})")
    return re.compile(out + r"$")


_START = [_pattern(t) for t in START]
_STEP = {op: [_pattern(t) for t in ts] for op, ts in STEP.items()}
_QUESTION = [_pattern(t) for t in QUESTION]
_SENTENCE = re.compile(r"(?<=[.?])\s+")


@dataclass(frozen=True, order=True)
class WordProblem:
    start: int
    steps: tuple[tuple[str, int], ...]  # (operation, number), applied in order
    name: str = "Sam"
    item: str = "apples"
    style: int = 0  # picks the phrasing of each sentence

    @property
    def values(self) -> list[int]:
        """The running quantity after each step, the start first."""
        out = [self.start]
        for op, n in self.steps:
            x = out[-1]
            out.append({"add": x + n, "sub": x - n, "mul": x * n, "div": x // n}[op])
        return out

    @property
    def answer(self) -> str:
        return str(self.values[-1])

    @property
    def category(self) -> str:
        return "+".join(op for op, _ in self.steps)

    @property
    def prompt(self) -> str:
        s = self.style
        parts = [START[s % len(START)].format(name=self.name, n=self.start, item=self.item)]
        for i, (op, n) in enumerate(self.steps):
            ts = STEP[op]
            parts.append(ts[(s // 3 + i) % len(ts)].format(name=self.name, n=n, item=self.item))
        parts.append(QUESTION[(s // 9) % len(QUESTION)].format(name=self.name, item=self.item))
        return " ".join(parts)

    @property
    def solution(self) -> str:
        """The GSM8K-style gold: one line per step, then ``#### N``."""
        values = self.values
        lines = [f"{values[i]} {SOLUTION_WORD[op]} {n} = {values[i + 1]}" for i, (op, n) in enumerate(self.steps)]
        return "\n".join(lines + [f"#### {self.answer}"])

    @property
    def key(self) -> tuple:
        """What makes two problems the same problem whatever the wording: a sum's terms in any order."""
        if all(op == "add" for op, _ in self.steps):
            return ("add",) + tuple(sorted([self.start] + [n for _, n in self.steps]))
        return (self.start, self.steps)


def inverse_text(p: WordProblem, answer: str) -> str:
    """The problem asked backwards: its start hidden, its end given as `answer`."""
    parts = [f"{p.name} starts with some {p.item}."]
    for i, (op, n) in enumerate(p.steps):
        ts = STEP[op]
        parts.append(ts[(p.style // 3 + i) % len(ts)].format(name=p.name, n=n, item=p.item))
    parts.append(f"Now {p.name} has {answer} {p.item}. How many {p.item} did {p.name} start with?")
    return " ".join(parts)


def parse(prompt: str) -> WordProblem:
    """The problem a word_math prompt states (any phrasing); ValueError for other text."""
    sentences = _SENTENCE.split(prompt.strip())
    if len(sentences) < 3:
        raise ValueError(f"not a word_math prompt: {prompt!r}")

    def match(patterns, text):
        for i, pat in enumerate(patterns):
            m = pat.match(text)
            if m:
                return i, m
        return None, None

    si, m = match(_START, sentences[0])
    if m is None:
        raise ValueError(f"not a word_math prompt (first sentence): {prompt!r}")
    name, item, start = m["name"], m["item"], int(m["n"])
    steps, first = [], 0
    for i, text in enumerate(sentences[1:-1]):
        for op in OPS:
            j, ms = match(_STEP[op], text)
            if ms is not None and ms["name"] == name and ms["item"] == item:
                steps.append((op, int(ms["n"])))
                first = j if i == 0 else first
                break
        else:
            raise ValueError(f"not a word_math prompt (sentence {text!r}): {prompt!r}")
    qi, mq = match(_QUESTION, sentences[-1])
    if mq is None or mq["name"] != name or mq["item"] != item:
        raise ValueError(f"not a word_math prompt (question): {prompt!r}")
    return WordProblem(start, tuple(steps), name, item, si + 3 * first + 9 * qi)


class Generator:
    """Random problems of given chains with numbers up to `max_number` and whole answers."""

    def __init__(self, max_number: int, max_factor: int = 5):
        self.max_number = max_number
        self.max_factor = max_factor

    def step(self, op: str, x: int, rng: random.Random) -> int | None:
        hi = self.max_number
        if op == "add":
            return rng.randint(1, hi)
        if op == "sub":
            return rng.randint(1, x - 1) if x > 1 else None
        if op == "mul":
            return rng.randint(2, self.max_factor)
        divisors = [d for d in range(2, min(x, 10) + 1) if x % d == 0 and x // d >= 1]
        return rng.choice(divisors) if divisors else None

    def problem(self, chain: tuple[str, ...], rng: random.Random) -> WordProblem | None:
        start = rng.randint(2, self.max_number)
        if chain and chain[0] == "div":  # something to divide
            start = rng.randint(2, max(2, self.max_number // 2)) * rng.randint(2, 6)
        x, steps = start, []
        for op in chain:
            n = self.step(op, x, rng)
            if n is None:
                return None
            steps.append((op, n))
            x = {"add": x + n, "sub": x - n, "mul": x * n, "div": x // n}[op]
        return WordProblem(start, tuple(steps), rng.choice(NAMES), rng.choice(ITEMS), rng.randrange(27))

    def mutate(self, p: WordProblem, rng: random.Random) -> WordProblem | None:
        """A nearby problem: the same chain, one number nudged, whole answers kept."""
        for _ in range(20):
            i = rng.randrange(len(p.steps) + 1)
            delta = rng.choice([-3, -2, -1, 1, 2, 3])
            start = p.start + delta if i == 0 else p.start
            steps = list(p.steps)
            if i:
                op, n = steps[i - 1]
                if op in ("mul", "div"):
                    continue
                steps[i - 1] = (op, n + delta)
            q = WordProblem(start, tuple(steps), rng.choice(NAMES), rng.choice(ITEMS), rng.randrange(27))
            if valid(q, self.max_number):
                return q
        return None

    def rewrites(self, p: WordProblem, n: int, rng: random.Random) -> list[WordProblem]:
        """Up to `n` wordings of the same problem: other phrasings, person and thing, a sum reordered."""
        out: list[WordProblem] = []
        seen = {p.prompt}
        candidates = []
        if len(p.steps) == 1 and p.steps[0][0] == "add":
            candidates.append((p.steps[0][1], (("add", p.start),)))
        for _ in range(4 * n + 4):
            candidates.append((p.start, p.steps))
        for start, steps in candidates:
            if len(out) >= n:
                break
            q = WordProblem(start, steps, rng.choice(NAMES), rng.choice(ITEMS), rng.randrange(27))
            if q.prompt not in seen:
                seen.add(q.prompt)
                out.append(q)
        return out


def valid(p: WordProblem, max_number: int) -> bool:
    if p.start < 1 or p.start > 10 * max_number:
        return False
    x = p.start
    for op, n in p.steps:
        if n < 1 or (op == "sub" and n >= x) or (op == "div" and (n < 2 or x % n)):
            return False
        x = {"add": x + n, "sub": x - n, "mul": x * n, "div": x // n}[op]
    return True


class WordMathTask(FreeTextAnswers, ProceduralTask):
    """The task over `task.levels` chains with numbers up to `task.max_number`."""

    name = "word_math"

    def __init__(self, cfg):
        self.cfg = cfg
        self.levels = [tuple(level.split("+")) for level in cfg.levels]
        self.gen = Generator(cfg.max_number, cfg.max_factor)
        self.instruction = cfg.instruction

    def inverse(self, prompt: str, answer: str | None) -> list[tuple[str, str]]:
        """The problem asked backwards with `answer` proposed: its start hidden (tasks/inverse.py);
        [] for a prompt that is not a word problem or an answer that is not a whole number."""
        if not isinstance(answer, str) or not re.fullmatch(r"-?\d+", answer.strip()):
            return []
        try:
            p = parse(self.question(prompt))
        except ValueError:
            return []
        return [(self.show(inverse_text(p, answer.strip())), str(p.start))]

    def parse(self, prompt: str) -> "_Shown":
        return _Shown(parse(self.question(prompt)), self)

    def ruled_out(self, prompt: str) -> frozenset:
        """judge.shortcut: the answers a right response to `prompt` cannot give, read from the question
        alone: the sum of its numbers, where a step is not an addition (measured in judges/validity.py)."""
        try:
            p = parse(self.question(prompt))
        except ValueError:
            return frozenset()
        if all(op == "add" for op, _ in p.steps):
            return frozenset()
        return frozenset({str(p.start + sum(n for _, n in p.steps))})

    def draw(self, rng: random.Random, chain: tuple[str, ...], forbidden: set, taken_keys: set,
             tries: int = 200) -> WordProblem | None:
        for _ in range(tries):
            p = self.gen.problem(chain, rng)
            if p is not None and p.key not in forbidden and p.key not in taken_keys:
                return p
        return None

    def fresh(self, rng: random.Random, n, forbidden: set, taken: set) -> list:
        keys = {t.key for t in taken}
        counts = {"+".join(c): 0 for c in self.levels}
        if isinstance(n, int):
            for _ in range(n):
                counts["+".join(rng.choice(self.levels))] += 1
        else:
            counts.update(n)
        out = []
        for cat in sorted(counts):
            for _ in range(counts[cat]):
                p = self.draw(rng, tuple(cat.split("+")), forbidden, keys)
                if p is not None:
                    keys.add(p.key)
                    out.append(_Shown(p, self))
        return out

    def mutate(self, p: "_Shown", rng: random.Random, forbidden: set):
        for _ in range(10):
            q = self.gen.mutate(p.problem, rng)
            if q is not None and q.key not in forbidden:
                return _Shown(q, self)
        return None

    def rewrites(self, p: "_Shown", n: int, rng: random.Random, forbidden: set) -> list:
        return [_Shown(q, self) for q in self.gen.rewrites(p.problem, n, rng)]

    def sets(self, seed: int, train_size: int) -> TaskSets:
        """Held-out, test-time and dev sets stratified by level (each level an equal share, the
        remainder to the first levels), disjoint in any wording; then the seed data from what is left.
        A level that runs out of distinct problems stops with its name: a set that quietly takes
        fewer of one operation than the others measures a mix the loop never trains on."""
        rng = random.Random(seed)
        keys: set = set()
        names = ["+".join(c) for c in self.levels]

        def stratified(n: int, what: str) -> list[WordProblem]:
            out = []
            for j, chain in enumerate(self.levels):
                need = n // len(self.levels) + (1 if j < n % len(self.levels) else 0)
                for got in range(need):
                    p = self.draw(rng, chain, set(), keys)
                    if p is None:
                        raise ConfigError(
                            f"task.{what}: word_math level {names[j]!r} ran out of distinct problems at {got} of "
                            f"the {need} its share of {n} needs (max_number {self.cfg.max_number}, max_factor "
                            f"{self.cfg.max_factor}, after the sets drawn before it): raise task.max_number or "
                            f"task.max_factor, or lower the sizes")
                    keys.add(p.key)
                    out.append(p)
            rng.shuffle(out)
            return out

        def rest(n: int) -> list[WordProblem]:  # the seed data: round robin over what is left
            out = []
            for i in range(n):
                for j in range(len(self.levels)):
                    p = self.draw(rng, self.levels[(i + j) % len(self.levels)], set(), keys)
                    if p is not None:
                        keys.add(p.key)
                        out.append(p)
                        break
            rng.shuffle(out)
            return out

        heldout = stratified(self.cfg.heldout_size, "heldout_size")
        ttt = stratified(self.cfg.ttt_size, "ttt_size")
        dev = stratified(self.cfg.dev_size, "dev_size")
        train = rest(train_size)

        def prompts(problems: list[WordProblem], source: str) -> pd.DataFrame:
            rows = []
            for i, p in enumerate(problems):
                rows += prompt_rows("it0", f"{source}-{i:05d}", source, p.category, [(self.show(p.prompt), p.answer)])
            return frame(rows)

        seed_sft = seed_frame([self.show(p.prompt) for p in train], [p.solution for p in train])
        return TaskSets(prompts(heldout, "heldout"), prompts(ttt, "ttt"), seed_sft, prompts(dev, "dev"))

    def categories(self, sets) -> list[str]:
        return sorted("+".join(c) for c in self.levels)



@dataclass(frozen=True)
class _Shown:
    """A word problem as the model sees it (with the task's instruction line)."""

    problem: WordProblem
    task: object = None

    def __hash__(self) -> int:
        return hash(self.problem)

    def __eq__(self, other) -> bool:
        return isinstance(other, _Shown) and other.problem == self.problem

    @property
    def prompt(self) -> str:
        return self.task.show(self.problem.prompt)

    @property
    def answer(self) -> str:
        return self.problem.answer

    @property
    def category(self) -> str:
        return self.problem.category

    @property
    def key(self) -> tuple:
        return self.problem.key
