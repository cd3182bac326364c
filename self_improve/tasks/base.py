"""The Task interface: what every stage asks of a task, so that no stage branches on its name.

A task owns its prompt sets (held-out, test-time, the seed data with gold solutions), how a
question is shown to the model, how a final answer is read from a response (`extract`) and checked
against the gold (`verify`), its categories (the curriculum's arms) and how an iteration's prompts
are proposed from the previous iteration's judgments, equivalent rewrites (co_reward) included.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol

import pandas as pd

from self_improve import artifacts as art
from self_improve.config import EvolveConfig, EvolveStrategy, SecScope
from self_improve.curriculum import NO_CATEGORY, BanditState, allocate
from self_improve.errors import ConfigError
from self_improve.tasks.answers import Extracted

# `write(prompts, n) -> n texts per prompt`: the current model writing text (rewrites, paraphrases)
Writer = Callable[[list[str], int], list[list[str]]]


@dataclass
class TaskSets:
    heldout: pd.DataFrame  # PROMPTS: never a training prompt, in any wording
    ttt: pd.DataFrame  # PROMPTS: the loop may train on their prompts, answers only measure
    seed: pd.DataFrame  # SFT: prompts with gold solutions (the builtin model's warm-up, SPIN's references)
    dev: pd.DataFrame | None = None  # PROMPTS (task.dev_size): for design choices, disjoint from held-out and test-time


@dataclass
class ProposeInput:
    """What an iteration's prompts are proposed from."""

    cfg: EvolveConfig
    iteration: str
    seed: int
    ttt: pd.DataFrame
    heldout: pd.DataFrame
    prev_judgments: pd.DataFrame
    curriculum: Optional[BanditState] = None
    seed_data: Optional[pd.DataFrame] = None
    seed_prompts: int = 0
    rewrites: bool = True  # the judge compares equivalent rewrites (co_reward): make them
    writer: Optional[Writer] = None  # the current model, for tasks whose rewrites it writes
    stats: dict = field(default_factory=dict)  # what the proposal did, for provenance and metrics


class Task(Protocol):
    name: str
    open_ended: bool  # open prompts: judged by the rubric, compared by win rate

    def sets(self, seed: int, train_size: int) -> TaskSets: ...

    def categories(self, sets: TaskSets) -> list[str]: ...

    def warmup(self, seed: int, train_size: int, sets: TaskSets) -> pd.DataFrame: ...

    def propose(self, inp: ProposeInput) -> pd.DataFrame: ...

    def extract(self, response: str | None) -> Extracted: ...

    def verify(self, answer: str | None, gold: str | None, category: str | None = None) -> float | None: ...
    # `category`: the problem's (a task whose problems are graded by their source, reasoning_gym)

    # optional: `answer_end(response) -> int | None`, where a complete final answer ends (the engines stop
    # there with sample.stop_at_answer; tasks/answers.py); `floors = False` where a policy that reads only the question is the task (self_improve/floors.py);
    # `dev` of TaskSets, a set for design choices, disjoint from held-out and test-time


def prompt_rows(iteration: str, gid: str, source: str, category: str | None,
                variants: list[tuple[str, str | None]]) -> list[dict]:
    """PROMPTS rows of one problem: variant 0 as posed, then its equivalent rewrites."""
    return [{"iteration": iteration, "prompt_id": f"{gid}/v{v}", "group_id": gid, "variant": v,
             "source": source, "category": category, "prompt": prompt, "answer": answer}
            for v, (prompt, answer) in enumerate(variants)]


def frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=art.PROMPTS.names)


def seed_frame(prompts: list[str], responses: list[str]) -> pd.DataFrame:
    """SFT rows of the seed data (it0): each prompt with its known-good response."""
    return pd.DataFrame({"iteration": "it0", "prompt_id": [f"seed-{i:05d}" for i in range(len(prompts))],
                         "prompt": prompts, "response": responses, "reward": None, "correct": 1.0})


def informativeness(judgments: pd.DataFrame) -> pd.Series:
    """Per problem (group): standard deviation of its self-judged rewards; NaN if unjudged."""
    if judgments.empty:
        return pd.Series(dtype=float)
    scored = judgments.dropna(subset=["reward"])
    return scored.assign(reward=scored["reward"].astype(float)).groupby("group_id")["reward"].std(ddof=0)


def most_informative(judgments: pd.DataFrame, n: int) -> list[str]:
    """Prompts (variant 0) of the `n` problems with the largest reward spread, spread > 0 only."""
    spread = informativeness(judgments)
    spread = spread[spread > 0]
    if spread.empty or n == 0:
        return []
    ranked = spread.reset_index().sort_values(["reward", "group_id"], ascending=[False, True])
    top = set(ranked["group_id"].head(n))
    base = judgments[(judgments["variant"] == 0) & judgments["group_id"].isin(top)]
    return sorted(base["prompt"].unique())


def check_scope(task, cfg: EvolveConfig) -> None:
    """`evolve.sec_scope: mix` needs a task that draws fresh problems by category (`steers_mix`: the
    procedural tasks, reasoning_gym): a file of the user's has nothing to fill a category beyond its
    test-time problems, of which its `sec` draws `evolve.fresh` by category. Refused by key, not ignored."""
    if cfg.strategy == EvolveStrategy.sec and cfg.sec_scope == SecScope.mix and not getattr(task, "steers_mix", False):
        raise ConfigError(f"evolve.sec_scope: mix fills categories with fresh draws; task {task.name!r} draws "
                          f"none (its `sec` poses evolve.fresh of the test-time problems, by category): use "
                          f"sec_scope: fresh, with evolve.fresh as large as the test-time set to steer all of it")


class ProceduralTask:
    """A task that generates its problems: fresh draws, mutations (eva), draws by category (sec).

    Subclasses give `parse(prompt) -> problem`, `fresh(rng, n | {category: n}, forbidden, taken)`,
    `mutate(problem, rng, forbidden)` and `rewrites(problem, n, rng, forbidden)`; a problem has
    `prompt`, `answer`, `category` and `key` (the same key: the same problem in any wording).
    """

    name = "procedural"
    steers_mix = True  # evolve.sec_scope: mix fills each category with fresh draws (check_scope)
    open_ended = False

    def propose(self, inp: ProposeInput) -> pd.DataFrame:
        cfg = inp.cfg
        # `fixed` gets the same seed every iteration (stages/evolve.py): the same draws, the same ids
        rng = random.Random(inp.seed)
        tag = "fixed" if cfg.strategy == EvolveStrategy.fixed else inp.iteration
        forbidden = {self.parse(p).key for p in inp.heldout["prompt"]}
        taken: set = set()
        problems: list[tuple[str, str, object]] = []  # (group_id, source, problem)

        def take(group_id: str, source: str, p) -> None:
            if p not in taken and p.key not in forbidden:
                taken.add(p)
                problems.append((group_id, source, p))

        sec = cfg.strategy == EvolveStrategy.sec
        if sec and inp.curriculum is None:
            raise ValueError("sec needs the curriculum state")
        ttt = list(zip(inp.ttt["group_id"], inp.ttt["prompt"])) if cfg.include_ttt else []
        steered = sec and cfg.sec_scope == SecScope.mix
        if steered:  # the bandit's allocation of the whole mix: test-time problems first, fresh draws for the rest
            ttt, rest = self.steer(ttt, allocate(inp.curriculum, len(ttt) + cfg.fresh, rng), rng)
        for gid, prompt in ttt:
            take(gid, "ttt", self.parse(prompt))
        if cfg.strategy == EvolveStrategy.eva:
            for i, prompt in enumerate(most_informative(inp.prev_judgments, cfg.keep_top)):
                q = self.mutate(self.parse(prompt), rng, forbidden)
                if q is not None:
                    take(f"{inp.iteration}-evolved-{i:05d}", "evolved", q)
        seeds: list = []
        if inp.seed_prompts and inp.seed_data is not None and len(inp.seed_data):
            posed = sorted(set(inp.seed_data["prompt"]))
            for prompt in rng.sample(posed, min(inp.seed_prompts, len(posed))):
                p = self.parse(prompt)
                if p not in taken and p.key not in forbidden:
                    taken.add(p)
                    seeds.append(p)
        if sec:
            fresh = self.fresh(rng, rest if steered else allocate(inp.curriculum, cfg.fresh, rng), forbidden, taken)
        else:
            fresh = self.fresh(rng, cfg.fresh, forbidden, taken)
        for i, p in enumerate(fresh):
            take(f"{tag}-fresh-{i:05d}", "fresh", p)

        rows: list[dict] = []
        for i, p in enumerate(seeds):  # SPIN: as posed in the seed data, no rewrites
            rows += prompt_rows(inp.iteration, f"{tag}-seed-{i:05d}", "seed", p.category,
                                [(p.prompt, p.answer)])
        for gid, source, p in problems:
            variants = [p] + self.rewrites(p, cfg.rewrites, rng, forbidden)
            rows += prompt_rows(inp.iteration, gid, source, p.category, [(q.prompt, q.answer) for q in variants])
        return frame(rows)


    def steer(self, ttt: list[tuple[str, str]], counts: dict[str, int],
              rng: random.Random) -> tuple[list[tuple[str, str]], dict[str, int]]:
        """The test-time problems (group_id, prompt) a curriculum allocation `counts` takes (`steer`), and
        what each category still needs from fresh draws."""
        keep, rest = steer([self.parse(prompt).category for _, prompt in ttt], counts, rng)
        return [row for i, row in enumerate(ttt) if i in keep], rest


def steer(categories: list[str | None], counts: dict[str, int], rng: random.Random) -> tuple[set[int], dict[str, int]]:
    """Which of the test-time problems (their `categories`, in order) a curriculum allocation `counts`
    takes: up to its count of each category, drawn at random; and what each category still needs from
    fresh draws."""
    by: dict[str, list[int]] = {}
    for i, cat in enumerate(categories):
        by.setdefault(cat if isinstance(cat, str) and cat else NO_CATEGORY, []).append(i)
    keep: set[int] = set()
    rest: dict[str, int] = {}
    for cat in sorted(set(counts) | set(by)):
        pool = by.get(cat, [])
        chosen = rng.sample(pool, min(counts.get(cat, 0), len(pool)))
        keep.update(chosen)
        if cat != NO_CATEGORY and counts.get(cat, 0) > len(chosen):
            rest[cat] = counts[cat] - len(chosen)
    return keep, rest


def by_category(ttt: pd.DataFrame) -> list[str]:
    return sorted(set(ttt["category"].fillna(NO_CATEGORY)))
