"""Real-model loops, one DVC experiment each, with every finished result kept in git-trackable form.

    python -m scripts.real_loops --judges verifier co_reward majority_vote --seeds 0 1 2
    python -m scripts.real_loops --recipe smollm2-v1 --judges scpo+validity self_harmony --seeds 0 1 2
    python -m scripts.real_loops --table            # only rebuild the table from what has finished
    python -m scripts.real_loops --plain /tmp/loops --jobs 6 --out reports/smollm2_v2_gpu \\
        -S sample.backend=hf --judges verifier --seeds 0 1 2   # without DVC, six loops at once (a GPU host)

Each (judge, seed) runs `dvc exp run -n smol-<judge>-s<seed>` with one of the SmolLM2 recipes
(configs/recipes/smollm2-v2.yaml, the default, smollm2-v1.yaml or smollm2-gym.yaml), the judge and the
seed, then copies its per-iteration metrics to `reports/smollm2_v2/<judge>-s<seed>.json` (smollm2-v1:
`reports/smollm2/`, smollm2-gym: `reports/smollm2_gym/`)
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
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from scripts.plain import threads_per_job
from scripts.seeds import ROOT, run_experiment, run_plain, write_reports
from self_improve import recipes

OUTS = {"smollm2-v1": ROOT / "reports" / "smollm2", "smollm2-v2": ROOT / "reports" / "smollm2_v2",
        "smollm2-v3": ROOT / "reports" / "smollm2_v3", "smollm2-gym": ROOT / "reports" / "smollm2_gym"}


def recipe(name: str) -> list[str]:
    return recipes.set_args(recipes.load(ROOT / recipes.path_of(name)))


def judge_overrides(judge: str) -> list[str]:
    """`-S` overrides of a judge: a rule of configs/rules/, or judge.method[:mode]."""
    return recipes.set_args(recipes.rule_overrides(judge, ROOT))


def run_one(judge: str, seed: int, force: bool, recipe_name: str = "smollm2-v3", *, out: Path | None = None,
            sets: list[str] = (), tag: str = "", plain: Path | None = None, threads: int | None = None) -> Path | None:
    """One (judge, seed): a DVC experiment, or with `plain` the same stages without DVC (scripts/plain.py)
    in `plain`/<name>. `sets`: more `key=value` overrides after the judge's; `tag` prefixes the name."""
    OUT = out or OUTS[recipe_name]
    stem = (f"{tag}-" if tag else "") + f"{judge.replace(':', '-').replace('+', '-')}-s{seed}"
    name = f"smol-{stem}"
    args = recipe(recipe_name) + judge_overrides(judge) + [a for kv in sets for a in ("-S", kv)] + ["-S", f"seed={seed}"]
    timings = OUT / f"{stem}.timings.jsonl" if os.environ.get("SELF_IMPROVE_TIMINGS") else None
    extra = {"judge": judge, "seed": seed} | ({"tag": tag} if tag else {})
    if plain is not None:
        return run_plain(name, args, OUT / f"{stem}.json", workdir=plain, force=force, extra=extra,
                         timings=timings, report_dir=OUT / stem, threads=threads)
    return run_experiment(name, args, OUT / f"{stem}.json", force=force, extra=extra,
                          timings=timings, report_dir=OUT / stem)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--judges", nargs="*", default=[], help="judge.method, llm_judge:<mode>, or a rule of scripts/gap.py")
    ap.add_argument("--recipe", choices=sorted(OUTS), default="smollm2-v3",
                    help="configs/recipes/<name>.yaml (smollm2-v3: word problems stratified by operation)")
    ap.add_argument("--seeds", nargs="*", type=int, default=[0])
    ap.add_argument("-S", "--set-param", dest="sets", action="append", default=[],
                    help="one more override for every run, as `dvc exp run -S` takes it (repeatable)")
    ap.add_argument("--tag", default="", help="a prefix of every result's name (e.g. nft with -S train.algorithm=nft)")
    ap.add_argument("--out", type=Path, default=None, help="where results go (default reports/smollm2_v2/ or smollm2/)")
    ap.add_argument("--plain", type=Path, default=None, metavar="DIR",
                    help="run the stages without DVC, each loop in DIR/<name> (scripts/plain.py): a machine without DVC")
    ap.add_argument("--jobs", type=int, default=1, help="with --plain: loops at once (one process each)")
    ap.add_argument("--force", action="store_true", help="run again even if a result exists")
    ap.add_argument("--table", action="store_true", help="only rebuild the table")
    args = ap.parse_args(argv)
    out = args.out.resolve() if args.out else OUTS[args.recipe]
    if args.jobs < 1 or (args.jobs > 1 and args.plain is None):
        ap.error("--jobs: a positive number, above 1 only with --plain (one DVC experiment at a time per workspace)")
    runs, failed = [], []
    if not args.table:
        runs = [(j, s) for s in args.seeds for j in args.judges]  # a first seed of every judge before the second of any
        threads = threads_per_job(args.jobs)
        lock = threading.Lock()

        def one(run: tuple[str, int]) -> Path | None:
            kept = run_one(*run, args.force, args.recipe, out=out, sets=args.sets, tag=args.tag,
                           plain=args.plain.resolve() if args.plain else None, threads=threads if args.plain else None)
            with lock:
                write_reports(out)
            return kept

        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            failed = [run for run, kept in zip(runs, pool.map(one, runs)) if kept is None]
    print(write_reports(out))
    if failed:
        sys.exit(f"real_loops: {len(failed)} of {len(runs)} runs failed: "
                 + ", ".join(f"{j} seed {s}" for j, s in failed))


if __name__ == "__main__":
    main()
