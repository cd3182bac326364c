"""Stage `evolve`: the prompts of one iteration.

The test-time problems (their prompts, never their answers, reach the self-judge), fresh
procedural problems, and, for `eva`, mutations of the previous iteration's most informative
problems: those whose self-judged rewards spread the most across their samples. Every problem
comes with equivalent rewrites (same answer) so that rewrite-agreement judges can work.
"""

from __future__ import annotations

import argparse
import random

import pandas as pd

from .lib import artifacts as art
from .lib.cli import derive_seed, run_stage, stage_provenance
from .lib.config import EvolveConfig, EvolveStrategy, Params
from .lib.tasks import ArithmeticTask, Problem, make_task


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


def evolve(
    task: ArithmeticTask,
    cfg: EvolveConfig,
    iteration: str,
    seed: int,
    ttt: pd.DataFrame,
    heldout: pd.DataFrame,
    prev_judgments: pd.DataFrame,
) -> pd.DataFrame:
    # `fixed` draws the same fresh problems every iteration; `eva` draws new ones each time.
    rng = random.Random(seed if cfg.strategy == EvolveStrategy.eva else derive_seed(seed, "fixed"))
    forbidden = {task.parse(p).unordered for p in heldout["prompt"]}
    taken: set[Problem] = set()
    problems: list[tuple[str, str, Problem]] = []  # (group_id, source, problem)

    def take(group_id: str, source: str, p: Problem) -> None:
        if p not in taken and p.unordered not in forbidden:
            taken.add(p)
            problems.append((group_id, source, p))

    if cfg.include_ttt:
        for gid, prompt in zip(ttt["group_id"], ttt["prompt"]):
            take(gid, "ttt", task.parse(prompt))
    if cfg.strategy == EvolveStrategy.eva:
        for i, prompt in enumerate(most_informative(prev_judgments, cfg.keep_top)):
            q = task.mutate(task.parse(prompt), rng, forbidden)
            if q is not None:
                take(f"{iteration}-evolved-{i:05d}", "evolved", q)
    pool = [p for p in task.all_problems() if p.unordered not in forbidden and p not in taken]
    for i, p in enumerate(rng.sample(pool, min(cfg.fresh, len(pool)))):
        take(f"{iteration}-fresh-{i:05d}", "fresh", p)

    rows = []
    for gid, source, p in problems:
        for v, q in enumerate([p] + task.rewrites(p, cfg.rewrites, rng, forbidden)):
            rows.append(
                {
                    "iteration": iteration,
                    "prompt_id": f"{gid}/v{v}",
                    "group_id": gid,
                    "variant": v,
                    "source": source,
                    "category": p.category,
                    "prompt": q.prompt,
                    "answer": q.answer,
                }
            )
    return pd.DataFrame(rows, columns=art.PROMPTS.names)


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--iteration", required=True)
    p.add_argument("--ttt", required=True, help="in: test-time problems")
    p.add_argument("--heldout", required=True, help="in: held-out problems (never posed)")
    p.add_argument("--prev-judgments", required=True, help="in: previous iteration's judgments")
    p.add_argument("--out", required=True, help="out: this iteration's prompts")


def main(argv: list[str] | None = None) -> None:
    def body(args: argparse.Namespace, params: Params) -> None:
        params.iteration_index(args.iteration)
        df = evolve(
            make_task(params.task),
            params.evolve,
            args.iteration,
            derive_seed(params.seed, "evolve", args.iteration),
            art.read_table(args.ttt, art.PROMPTS),
            art.read_table(args.heldout, art.PROMPTS),
            art.read_table(args.prev_judgments, art.JUDGMENTS),
        )
        prov = stage_provenance("evolve", args.iteration, params, ("seed", "task", "evolve"), [args.out])
        art.write_table(df, args.out, art.PROMPTS, prov)

    run_stage("evolve", _args, body, argv)


if __name__ == "__main__":
    main()
