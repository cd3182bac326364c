"""Real-model loops, one DVC experiment each, with every finished result kept in git-trackable form.

    python -m scripts.real_loops --judges verifier co_reward majority_vote --seeds 0 1 2
    python -m scripts.real_loops --table            # only rebuild the table from what has finished

Each (judge, seed) runs `dvc exp run -n smol-<judge>-s<seed>` with the Makefile's SmolLM2 recipe
(`make -s print-smol-recipe`), the judge and the seed, then copies its per-iteration metrics to
`reports/smollm2/<judge>-s<seed>.json` (experiment refs and DVC caches do not travel with a clone;
these files do) and rebuilds `reports/smollm2/table.md`: held-out and test-time accuracy per
iteration as mean +- sd over the seeds that finished, and the gain it0 -> last. A finished result is
not run again unless --force. With SELF_IMPROVE_TIMINGS set, the stages' own timings are recorded
beside each result, with the loop's wall time, for the orchestration share (benchmarks/real.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "reports" / "smollm2"
KEYS = ("accuracy", "ttt_accuracy", "maj_accuracy", "sample_accuracy", "judge_auc", "judge_accuracy",
        "label_accuracy", "reward_mean", "truncated_share", "eval_truncated_share", "extract_failure_rate",
        "num_pairs")


def recipe() -> list[str]:
    out = subprocess.run(["make", "-s", "print-smol-recipe"], cwd=ROOT, capture_output=True, text=True, check=True)
    return shlex.split(out.stdout.strip())


def iterations() -> list[str]:
    return ["it0"] + list(yaml.safe_load((ROOT / "params.yaml").read_text())["loop"])


def run_one(judge: str, seed: int, force: bool) -> Path | None:
    method, _, mode = judge.partition(":")
    name = f"smol-{method}{'-' + mode if mode else ''}-s{seed}"
    dest = OUT / f"{name.removeprefix('smol-')}.json"
    if dest.exists() and not force:
        print(f"{name}: done already ({dest.relative_to(ROOT)})")
        return dest
    args = recipe() + ["-S", f"judge.method={method}", "-S", f"seed={seed}"]
    if mode:
        args += ["-S", f"judge.mode={mode}"]
    timings = OUT / f"{name.removeprefix('smol-')}.timings.jsonl"
    env = dict(os.environ)
    if env.get("SELF_IMPROVE_TIMINGS"):
        timings.parent.mkdir(parents=True, exist_ok=True)
        timings.unlink(missing_ok=True)
        env["SELF_IMPROVE_TIMINGS"] = str(timings)
    cmd = ["dvc", "exp", "run", "-n", name, *args]
    print("+", shlex.join(cmd), flush=True)
    t0 = time.perf_counter()
    rc = subprocess.run(cmd, cwd=ROOT, env=env).returncode
    wall = time.perf_counter() - t0
    if rc != 0:
        print(f"{name}: failed (exit {rc})", file=sys.stderr)
        return None
    metrics = {it: json.loads((ROOT / "reports" / it / "metrics.json").read_text()) for it in iterations()}
    result = {"experiment": name, "judge": judge, "seed": seed, "args": args, "wall_seconds": round(wall, 1),
              "metrics": {it: {k: m[k] for k in KEYS if k in m} for it, m in metrics.items()}}
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(f"{name}: {wall / 60:.1f} min -> {dest.relative_to(ROOT)}", flush=True)
    return dest


def _ms(values: list[float]) -> str:
    if not values:
        return ""
    if len(values) == 1:
        return f"{values[0]:.3f} (1 seed)"
    return f"{statistics.mean(values):.3f} +- {statistics.stdev(values):.3f}"


def table() -> str:
    rows: dict[str, list[dict]] = {}
    for f in sorted(OUT.glob("*.json")):
        r = json.loads(f.read_text())
        rows.setdefault(r["judge"], []).append(r)
    its = iterations()
    lines = ["| judge | seeds | " + " | ".join(f"held-out {it}" for it in its) + " | held-out gain | "
             + " | ".join(f"test-time {it}" for it in its) + " | test-time gain | judge AUC it1 |",
             "|" + "---|" * (2 * len(its) + 5)]
    for judge, runs in rows.items():
        def series(key, it):
            return [r["metrics"][it][key] for r in runs if key in r["metrics"].get(it, {})]

        def gain(key):
            return [r["metrics"][its[-1]][key] - r["metrics"]["it0"][key] for r in runs
                    if key in r["metrics"].get(its[-1], {}) and key in r["metrics"]["it0"]]

        cells = [judge, ", ".join(str(r["seed"]) for r in runs)]
        cells += [_ms(series("accuracy", it)) for it in its] + [_ms(gain("accuracy"))]
        cells += [_ms(series("ttt_accuracy", it)) for it in its] + [_ms(gain("ttt_accuracy"))]
        cells += [_ms(series("judge_auc", "it1"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


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
                (OUT / "table.md").write_text(table())
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "table.md").write_text(table())
    print(table())


if __name__ == "__main__":
    main()
