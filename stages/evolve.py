"""Stage `evolve`: the prompts of one iteration.

The test-time problems (their prompts, never their answers, reach the self-judge), fresh
procedural problems, and by `evolve.strategy`:
- `fixed`: the same fresh problems every iteration;
- `eva`: new fresh problems, plus mutations of the previous iteration's most informative
  problems: those whose self-judged rewards spread the most across their samples;
- `sec` (Self-Evolving Curriculum): the fresh problems are drawn per category (carry
  structure) from a softmax over the categories' values, a non-stationary bandit whose reward is
  the mean |advantage| of the category's samples last iteration, updated by TD(0).
The bandit's state is an artifact of each iteration (`--curriculum`), updated under every
strategy, so a rerun is deterministic and the values can be compared. Every problem comes with
equivalent rewrites (same answer) so that rewrite-agreement judges can work. For SPIN, prompts of
the seed data (the base model's SFT set, with its reference answers) are added as posed.

With the user's prompt file (`task.name: prompts`) the prompts are the file's training rows; `sec`
draws `evolve.fresh` of them by category from the bandit, and `eva` adds rewrites of the most
informative ones that the current model writes from stages/templates/rewrite_prompt.txt, filtered
(empty, too long, near-duplicates of any prompt, held-out ones included).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
from pathlib import Path

import pandas as pd

from .lib import artifacts as art
from .lib.cli import derive_seed, run_stage, stage_provenance
from .lib.config import EvolveConfig, EvolveStrategy, Params, TaskName
from .lib.curriculum import NO_CATEGORY, BanditState, allocate, category_rewards, update
from .lib.prompt_files import REWRITE_TEMPLATE, filter_rewrites, render_rewrite_prompt
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


def next_curriculum(state: BanditState, cfg: EvolveConfig, prev_judgments: pd.DataFrame) -> BanditState:
    """The bandit after last iteration's samples: TD(0) toward each category's mean |advantage|."""
    state = dataclasses.replace(state, alpha=cfg.sec_alpha, temperature=cfg.sec_temperature)
    if prev_judgments.empty:
        return state
    return update(state, category_rewards(prev_judgments))


def evolve(
    task: ArithmeticTask,
    cfg: EvolveConfig,
    iteration: str,
    seed: int,
    ttt: pd.DataFrame,
    heldout: pd.DataFrame,
    prev_judgments: pd.DataFrame,
    curriculum: BanditState | None = None,
    seed_data: pd.DataFrame | None = None,
    seed_prompts: int = 0,
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
    seeds: list[Problem] = []
    if seed_prompts and seed_data is not None and len(seed_data):
        posed = sorted(set(seed_data["prompt"]))
        for prompt in rng.sample(posed, min(seed_prompts, len(posed))):
            p = task.parse(prompt)
            if p not in taken and p.unordered not in forbidden:
                taken.add(p)
                seeds.append(p)
    pool = [p for p in task.all_problems() if p.unordered not in forbidden and p not in taken]
    if cfg.strategy == EvolveStrategy.sec:
        if curriculum is None:
            raise ValueError("sec needs the curriculum state")
        counts = allocate(curriculum, cfg.fresh, rng)
        fresh: list[Problem] = []
        for cat in sorted(counts):
            in_cat = [p for p in pool if p.category == cat]
            fresh += rng.sample(in_cat, min(counts[cat], len(in_cat)))
    else:
        fresh = rng.sample(pool, min(cfg.fresh, len(pool)))
    for i, p in enumerate(fresh):
        take(f"{iteration}-fresh-{i:05d}", "fresh", p)

    rows = []
    for i, p in enumerate(seeds):  # SPIN: as posed in the seed data, no rewrites
        rows.append({"iteration": iteration, "prompt_id": f"{iteration}-seed-{i:05d}/v0",
                     "group_id": f"{iteration}-seed-{i:05d}", "variant": 0, "source": "seed",
                     "category": p.category, "prompt": p.prompt, "answer": p.answer})
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


REWRITE_TOKENS = 160  # characters (tokens of the default tokenizer) a rewrite may take


def evolve_prompts(
    cfg: EvolveConfig,
    iteration: str,
    seed: int,
    ttt: pd.DataFrame,
    heldout: pd.DataFrame,
    prev_judgments: pd.DataFrame,
    curriculum: BanditState,
    rewrite=None,
    max_chars: int = 2000,
) -> tuple[pd.DataFrame, dict[str, int]]:
    """The prompts of one iteration from the user's file; `rewrite(prompts) -> texts` is the model."""
    rng = random.Random(seed)
    pool = ttt.assign(iteration=iteration)
    if cfg.strategy == EvolveStrategy.sec:
        counts = allocate(curriculum, cfg.fresh, rng)
        cats = pool["category"].fillna(NO_CATEGORY)
        keep: list[int] = []
        for cat in sorted(counts):
            idx = list(pool.index[cats == cat])
            keep += rng.sample(idx, min(counts[cat], len(idx)))
        pool = pool.loc[sorted(keep)]
    dropped: dict[str, int] = {}
    rows = [pool]
    if cfg.strategy == EvolveStrategy.eva and rewrite is not None:
        parents = most_informative(prev_judgments, cfg.keep_top)
        if parents:
            texts = rewrite(parents)
            existing = list(ttt["prompt"]) + list(heldout["prompt"])
            kept_parents, candidates = [], []
            for parent, text in zip(parents, texts):
                candidates.append(text.split("\n", 1)[0])
                kept_parents.append(parent)
            kept, dropped = filter_rewrites(candidates, existing, max_chars)
            category = dict(zip(prev_judgments["prompt"], prev_judgments["category"]))
            parent_of = {c.strip(): p for p, c in zip(kept_parents, candidates)}
            new = [{"iteration": iteration, "prompt_id": f"{iteration}-evolved-{i:05d}/v0",
                    "group_id": f"{iteration}-evolved-{i:05d}", "variant": 0, "source": "evolved",
                    "category": category.get(parent_of.get(text)), "prompt": text, "answer": None}
                   for i, text in enumerate(kept)]
            rows.append(pd.DataFrame(new, columns=art.PROMPTS.names))
    out = pd.concat(rows, ignore_index=True)[art.PROMPTS.names]
    return out, dropped


def model_rewriter(model_dir: str, params: Params, seed: int, base: str | None = None):
    """The current model as prompt writer: one rewrite per prompt from the repo's template."""
    from .lib.generation import SamplingSpec, generate
    from .lib.models import load_model, set_threads

    template = REWRITE_TEMPLATE.read_text(encoding="utf-8")
    loaded: list = []

    def rewrite(prompts: list[str]) -> list[str]:
        if not loaded:  # only when there is something to rewrite
            set_threads()
            loaded.extend(load_model(model_dir, security=params.security, base=base, model_cfg=params.model))
        model, tok = loaded
        spec = SamplingSpec(n=1, temperature=params.sample.temperature, top_p=params.sample.top_p,
                            max_new_tokens=REWRITE_TOKENS, batch_size=params.sample.batch_size)
        outs = generate(model, tok, [render_rewrite_prompt(template, p) for p in prompts], spec, seed,
                        desc="rewrite")
        return [o[0] for o in outs]

    return rewrite


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--iteration", required=True)
    p.add_argument("--ttt", required=True, help="in: test-time problems")
    p.add_argument("--heldout", required=True, help="in: held-out problems (never posed)")
    p.add_argument("--prev-judgments", required=True, help="in: previous iteration's judgments")
    p.add_argument("--seed-data", required=True, help="in: the base model's SFT data (SPIN's references)")
    p.add_argument("--prev-curriculum", required=True,
                   help="in: the bandit state after the previous iteration")
    p.add_argument("--model", required=True,
                   help="in: the iteration's starting model (it rewrites prompts of a prompt file)")
    p.add_argument("--base", help="in: the base model (it0) that adapter chains apply to")
    p.add_argument("--out", required=True, help="out: this iteration's prompts")
    p.add_argument("--curriculum", required=True, help="out: the bandit state of this iteration (json)")


def main(argv: list[str] | None = None) -> None:
    def body(args: argparse.Namespace, params: Params) -> None:
        params.iteration_index(args.iteration)
        prev = art.read_table(args.prev_judgments, art.JUDGMENTS)
        try:
            text = Path(args.prev_curriculum).read_text(encoding="utf-8")
        except OSError as err:
            raise art.ArtifactError(f"{args.prev_curriculum}: cannot read ({err.strerror})") from None
        state = BanditState.from_json(text, args.prev_curriculum)
        state = next_curriculum(state, params.evolve, prev)
        n_seed = params.seed_prompts()
        seed = derive_seed(params.seed, "evolve", args.iteration)
        prov = stage_provenance("evolve", args.iteration, params, ("seed", "task", "evolve"), [args.out])
        if params.task.name == TaskName.prompts:
            rewrite = None
            if params.evolve.strategy == EvolveStrategy.eva and not prev.empty:
                rewrite = model_rewriter(args.model, params, seed, args.base)
            df, dropped = evolve_prompts(
                params.evolve, args.iteration, seed, art.read_table(args.ttt, art.PROMPTS),
                art.read_table(args.heldout, art.PROMPTS), prev, state, rewrite, params.task.max_prompt_chars,
            )
            prov["rewrites_dropped"] = dropped
        else:
            df = evolve(
                make_task(params.task),
                params.evolve,
                args.iteration,
                seed,
                art.read_table(args.ttt, art.PROMPTS),
                art.read_table(args.heldout, art.PROMPTS),
                prev,
                state,
                art.read_table(args.seed_data, art.SFT) if n_seed else None,
                n_seed,
            )
            prov["seed_prompts"] = n_seed
        art.write_table(df, args.out, art.PROMPTS, prov)
        with art.atomic_path(args.curriculum) as tmp:
            tmp.write_text(state.to_json(), encoding="utf-8")

    run_stage("evolve", _args, body, argv)


if __name__ == "__main__":
    main()
