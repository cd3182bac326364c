"""Real-model loops, one DVC experiment each, with every finished result kept in git-trackable form.

    python -m scripts.real_loops --judges verifier co_reward majority_vote --seeds 0 1 2
    python -m scripts.real_loops --recipe smollm2-v1 --judges scpo+validity self_harmony --seeds 0 1 2
    python -m scripts.real_loops --table            # only rebuild the table from what has finished

Each (judge, seed) runs `dvc exp run -n smol-<judge>-s<seed>` with one of the SmolLM2 recipes
(configs/recipes/smollm2-v2.yaml, the default, or smollm2-v1.yaml), the judge and the seed, then copies
its per-iteration metrics to `reports/smollm2_v2/<judge>-s<seed>.json` (smollm2-v1: `reports/smollm2/`)
and its summary and figures to `reports/smollm2_v2/<judge>-s<seed>/`. A judge is a `judge.method` (with
`llm_judge:<mode>`) or a rule of `scripts/gap.py` (`scpo`, `self_harmony+validity`, ...), the same
overrides the diagnosis measured (experiment refs and DVC caches do not travel with a clone; these
files do), and rebuilds `reports/smollm2/table.md` and `accuracy.png` (scripts/seeds.py): held-out
and test-time accuracy per iteration as mean +- sd over the seeds that finished, the gain it0 ->
last. A finished result is not run again unless --force. With SELF_IMPROVE_TIMINGS set, the stages'
own timings are recorded beside each result, with the loop's wall time, for the orchestration
share (benchmarks/real.py).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from scripts.seeds import ROOT, run_experiment, write_reports
from self_improve import recipes

OUTS = {"smollm2-v1": ROOT / "reports" / "smollm2", "smollm2-v2": ROOT / "reports" / "smollm2_v2"}


def recipe(name: str) -> list[str]:
    return recipes.set_args(recipes.load(ROOT / recipes.path_of(name)))


def judge_overrides(judge: str) -> list[str]:
    """`-S` overrides of a judge: a rule of scripts/gap.py, or judge.method[:mode]."""
    from scripts.gap import RULES

    if judge in RULES:
        return [a for k, v in RULES[judge].items()
                for a in ("-S", f"{k if k.startswith('pairs.') else 'judge.' + k}={str(v).lower() if isinstance(v, bool) else v}")]
    method, _, mode = judge.partition(":")
    return ["-S", f"judge.method={method}"] + (["-S", f"judge.mode={mode}"] if mode else [])


def run_one(judge: str, seed: int, force: bool, recipe_name: str = "smollm2-v2") -> Path | None:
    OUT = OUTS[recipe_name]
    name = f"smol-{judge.replace(':', '-').replace('+', '-')}-s{seed}"
    args = recipe(recipe_name) + judge_overrides(judge) + ["-S", f"seed={seed}"]
    stem = name.removeprefix("smol-")
    timings = OUT / f"{stem}.timings.jsonl" if os.environ.get("SELF_IMPROVE_TIMINGS") else None
    return run_experiment(name, args, OUT / f"{stem}.json", force=force, extra={"judge": judge, "seed": seed},
                          timings=timings, report_dir=OUT / stem)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--judges", nargs="*", default=[], help="judge.method, llm_judge:<mode>, or a rule of scripts/gap.py")
    ap.add_argument("--recipe", choices=sorted(OUTS), default="smollm2-v2",
                    help="configs/recipes/<name>.yaml (smollm2-v2: sized to see 5 points)")
    ap.add_argument("--seeds", nargs="*", type=int, default=[0])
    ap.add_argument("--force", action="store_true", help="run again even if a result exists")
    ap.add_argument("--table", action="store_true", help="only rebuild the table")
    args = ap.parse_args(argv)
    if not args.table:
        for seed in args.seeds:  # a first seed of every judge before the second seed of any
            for judge in args.judges:
                run_one(judge, seed, args.force, args.recipe)
                write_reports(OUTS[args.recipe])
    print(write_reports(OUTS[args.recipe]))


if __name__ == "__main__":
    main()
