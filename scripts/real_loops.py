"""Real-model loops, one DVC experiment each, with every finished result kept in git-trackable form.

    python -m scripts.real_loops --judges verifier co_reward majority_vote --seeds 0 1 2
    python -m scripts.real_loops --table            # only rebuild the table from what has finished

Each (judge, seed) runs `dvc exp run -n smol-<judge>-s<seed>` with the Makefile's SmolLM2 recipe
(`make -s print-smol-recipe`), the judge and the seed, then copies its per-iteration metrics to
`reports/smollm2/<judge>-s<seed>.json` and its summary and figures to
`reports/smollm2/<judge>-s<seed>/` (experiment refs and DVC caches do not travel with a clone; these
files do), and rebuilds `reports/smollm2/table.md` and `accuracy.png` (scripts/seeds.py): held-out
and test-time accuracy per iteration as mean +- sd over the seeds that finished, the gain it0 ->
last. A finished result is not run again unless --force. With SELF_IMPROVE_TIMINGS set, the stages'
own timings are recorded beside each result, with the loop's wall time, for the orchestration
share (benchmarks/real.py).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
from pathlib import Path

from scripts.seeds import ROOT, run_experiment, write_reports

OUT = ROOT / "reports" / "smollm2"


def recipe() -> list[str]:
    out = subprocess.run(["make", "-s", "print-smol-recipe"], cwd=ROOT, capture_output=True, text=True, check=True)
    return shlex.split(out.stdout.strip())


def run_one(judge: str, seed: int, force: bool) -> Path | None:
    method, _, mode = judge.partition(":")
    name = f"smol-{method}{'-' + mode if mode else ''}-s{seed}"
    args = recipe() + ["-S", f"judge.method={method}", "-S", f"seed={seed}"]
    if mode:
        args += ["-S", f"judge.mode={mode}"]
    stem = name.removeprefix("smol-")
    timings = OUT / f"{stem}.timings.jsonl" if os.environ.get("SELF_IMPROVE_TIMINGS") else None
    return run_experiment(name, args, OUT / f"{stem}.json", force=force, extra={"judge": judge, "seed": seed},
                          timings=timings, report_dir=OUT / stem)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--judges", nargs="*", default=[], help="judge.method, or llm_judge:<mode>")
    ap.add_argument("--seeds", nargs="*", type=int, default=[0])
    ap.add_argument("--force", action="store_true", help="run again even if a result exists")
    ap.add_argument("--table", action="store_true", help="only rebuild the table")
    args = ap.parse_args(argv)
    if not args.table:
        for seed in args.seeds:  # a first seed of every judge before the second seed of any
            for judge in args.judges:
                run_one(judge, seed, args.force)
                write_reports(OUT)
    print(write_reports(OUT))


if __name__ == "__main__":
    main()
