"""Real-model loops, one DVC experiment each, with every finished result kept in git-trackable form.

    python -m research.real_loops --recipe smollm2-gym --judges scpo random --seeds 0 1 2 --out research/results/smollm2_gym_arms
    python -m research.real_loops --recipe smollm2-v3 --judges verifier co_reward --seeds 0 1 2 --out research/results/smollm2_v3
    python -m research.real_loops --table --out research/results/smollm2_v3   # only rebuild the tables from what has finished
    python -m research.real_loops --plain /tmp/loops --jobs 6 --out research/results/smollm2_v2_gpu \\
        -S sample.backend=hf --judges verifier --seeds 0 1 2   # without DVC, six loops at once (a GPU host)

Each (judge, seed) runs `dvc exp run -n smol-<judge>-s<seed>` with a setup of configs/recipes/
(`--recipe`), the judge and the seed, then copies its per-iteration metrics to `<out>/<judge>-s<seed>.json`
and its summary, figures and answers to `<out>/<judge>-s<seed>/`. A judge is a rule of configs/rules/
(`scpo`, `self_harmony+validity_any`, the control arms), the same overrides the diagnosis
(research/gap.py) measured, or a bare `judge.method` (`llm_judge:<mode>`). Experiment refs and DVC
caches do not travel with a clone; these files do. It rebuilds `<out>/table.md`, `accuracy.png`,
`categories.md` and `controls.md` (runners/experiments.py): accuracy per iteration as mean +- sd over the
seeds that finished, the gain it0 -> last, per category against the floor and the control arms. A
finished result is not run again unless --force. With SELF_IMPROVE_TIMINGS set, the stages' own
timings are recorded beside each result, with the loop's wall time, for the orchestration share
(benchmarks/real.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from runners.plain import threads_per_job
from runners.experiments import ROOT, run_experiment, run_plain, write_reports
from self_improve import recipes

def recipe(names: str | list[str]) -> list[str]:
    """The `-S` args of one setup or several composed left to right (`smollm2-v3 long`)."""
    return recipes.set_args(recipes.load_all([names] if isinstance(names, str) else names, ROOT))


def judge_overrides(judge: str) -> list[str]:
    """`-S` overrides of a judge: a rule of configs/rules/, or judge.method[:mode]."""
    from research.gap import rule_overrides

    return recipes.set_args(rule_overrides(judge, ROOT))


def run_one(judge: str, seed: int, force: bool, recipe_name: str | list[str] = "smollm2-v3", *, out: Path,
            sets: list[str] = (), tag: str = "", plain: Path | None = None, threads: int | None = None,
            cache: Path | None = None) -> Path | None:
    """One (judge, seed): a DVC experiment, or with `plain` the same stages without DVC (runners/plain.py)
    in `plain`/<name>. `sets`: more `key=value` overrides after the judge's; `tag` prefixes the name."""
    OUT = out
    stem = (f"{tag}-" if tag else "") + f"{judge.replace(':', '-').replace('+', '-')}-s{seed}"
    name = f"smol-{stem}"
    args = recipe(recipe_name) + judge_overrides(judge) + [a for kv in sets for a in ("-S", kv)] + ["-S", f"seed={seed}"]
    timings = OUT / f"{stem}.timings.jsonl" if os.environ.get("SELF_IMPROVE_TIMINGS") else None
    extra = {"judge": judge, "seed": seed} | ({"tag": tag} if tag else {})
    if plain is not None:
        return run_plain(name, args, OUT / f"{stem}.json", workdir=plain, force=force, extra=extra,
                         timings=timings, report_dir=OUT / stem, threads=threads, cache=cache)
    return run_experiment(name, args, OUT / f"{stem}.json", force=force, extra=extra,
                          timings=timings, report_dir=OUT / stem)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--judges", nargs="*", default=[], help="judge.method, llm_judge:<mode>, or a rule of research/gap.py")
    ap.add_argument("--recipe", nargs="+", default=["smollm2-v3"],
                    help="a setup of configs/recipes/ (smollm2-v3: word problems stratified by operation), or "
                         "several composed left to right (smollm2-v3 long: six iterations and the stop)")
    ap.add_argument("--seeds", nargs="*", type=int, default=[0])
    ap.add_argument("-S", "--set-param", dest="sets", action="append", default=[],
                    help="one more override for every run, as `dvc exp run -S` takes it (repeatable)")
    ap.add_argument("--tag", default="", help="a prefix of every result's name (e.g. nft with -S train.algorithm=nft)")
    ap.add_argument("--out", type=Path, required=True, help="where results go (e.g. research/results/smollm2_v3)")
    ap.add_argument("--plain", type=Path, default=None, metavar="DIR",
                    help="run the stages without DVC, each loop in DIR/<name> (runners/plain.py): a machine without DVC")
    ap.add_argument("--jobs", type=int, default=1, help="with --plain: loops at once (one process each)")
    ap.add_argument("--run-cache", type=Path, default=None, metavar="DIR",
                    help="with --plain: restore stages run before on the same inputs from DIR (an arm's controls "
                         "at one seed share its base stages) and store each stage run there (runners/run_cache.py)")
    ap.add_argument("--force", action="store_true", help="run again even if a result exists")
    ap.add_argument("--table", action="store_true", help="only rebuild the table")
    args = ap.parse_args(argv)
    out = args.out.resolve()
    if args.jobs < 1 or (args.jobs > 1 and args.plain is None):
        ap.error("--jobs: a positive number, above 1 only with --plain (one DVC experiment at a time per workspace)")
    if args.run_cache is not None and args.plain is None:
        ap.error("--run-cache: only with --plain (DVC keeps its own run-cache)")
    runs, failed = [], []
    if not args.table:
        runs = [(j, s) for s in args.seeds for j in args.judges]  # a first seed of every judge before the second of any
        threads = threads_per_job(args.jobs)
        lock = threading.Lock()

        def one(run: tuple[str, int]) -> Path | None:
            kept = run_one(*run, args.force, args.recipe, out=out, sets=args.sets, tag=args.tag,
                           plain=args.plain.resolve() if args.plain else None, threads=threads if args.plain else None,
                           cache=args.run_cache.resolve() if args.run_cache else None)
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
