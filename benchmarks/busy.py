"""The loop on a machine that is not idle: two stages timed alone and beside busy processes.

    python -m benchmarks.busy [--out FILE] [--quick]   # in a fresh clone of HEAD (also `make bench`'s `busy`)
    python -m benchmarks.busy --table reports/benchmark.json   # docs/speed.md's table of those figures

A laptop with a browser open, or a shared runner, keeps cores busy. OpenMP's threads spin while they
wait, and beside another process they fight it for the cores. This runs the base model's training
(`prepare`, a fixed number of steps) and its evaluation (`evaluate_base`: greedy answers through
the engine) alone, beside one and beside two single-threaded busy processes (`yes > /dev/null`),
under OpenMP's own wait policy (`SELF_IMPROVE_OMP_WAIT=openmp`), the passive one (`passive`) and the
project's default, which chooses between them by how busy the CPUs are when the stage starts (`auto`,
self_improve/cpu.py). Each figure is the stage's own time (SELF_IMPROVE_TIMINGS), best of `repeats`,
with the policy `auto` chose. Targets, for `auto`: beside one busy process a stage takes at most 2x its
time alone, and alone it is no slower than under OpenMP's own policy (within 10%).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

POLICIES = ("openmp", "passive", "auto")  # SELF_IMPROVE_OMP_WAIT
LOADS = (0, 1, 2)  # busy processes beside the stage
STAGES = ("prepare", "evaluate_base")
TARGETS = {"busy1_slowdown": 2.0, "alone_vs_openmp": 1.10}


def _argv(work: Path, stage: str) -> list[str]:
    from runners.dag import stage_commands

    argv = next(a for name, a in stage_commands(work) if name == stage)
    return [sys.executable, *argv[1:]]


def _time_stage(work: Path, stage: str, params: Path, policy: str, load: int) -> tuple[float, str]:
    """The stage's own seconds (its timing record), run beside `load` busy processes, and the wait policy it ran under."""
    timings = Path(tempfile.mkstemp(suffix=".jsonl")[1])
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "SELF_IMPROVE_OMP_WAIT_SET")}
    env |= {"SELF_IMPROVE_OMP_WAIT": policy, "SELF_IMPROVE_TIMINGS": str(timings), "SELF_IMPROVE_TRACKING": "0"}
    busy = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(load)]
    try:
        time.sleep(0.5 if load else 0)
        proc = subprocess.run(_argv(work, stage) + ["--params", str(params)], cwd=work, env=env,
                              capture_output=True, text=True)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    if proc.returncode != 0:
        sys.exit(f"busy: {stage} failed:\n{proc.stderr[-2000:]}")
    rows = [json.loads(line) for line in timings.read_text().splitlines() if line.strip()]
    timings.unlink()
    return rows[-1]["seconds"], rows[-1].get("omp_wait") or "?"


def _run(work: Path, stage: str, params: Path) -> None:
    proc = subprocess.run(_argv(work, stage) + ["--params", str(params)], cwd=work, capture_output=True, text=True,
                          env={**os.environ, "SELF_IMPROVE_TRACKING": "0"})
    if proc.returncode != 0:
        sys.exit(f"busy: {stage} failed:\n{proc.stderr[-2000:]}")


def bench_busy(work: Path, quick: bool = False, repeats: int = 2) -> dict:
    """Seconds per stage, policy and load in `work` (a fresh clone: its data/it0 is written here); the
    slowdowns and whether the targets hold."""
    raw = yaml.safe_load((work / "params.yaml").read_text())
    steps = 20 if quick else 150
    raw["prepare"] = {**raw.get("prepare", {}), "steps": steps, "stop_loss": 1e-9}  # a fixed amount of work
    params = work / "params.busy.yaml"
    params.write_text(yaml.safe_dump(raw, sort_keys=False))
    _run(work, "check_params", params)
    seconds: dict[str, dict[str, dict[str, float]]] = {}
    chosen: dict[str, dict[str, str]] = {}  # auto's policy per stage and load
    for stage in STAGES:
        if stage == "evaluate_base":
            _run(work, "engine_base", params)  # the engine of the model prepare wrote (the same bytes each time)
        for policy in POLICIES:
            for load in LOADS:
                print(f"busy: {stage}, {policy} wait, beside {load} busy process(es) ...", flush=True)
                best, wait = min(_time_stage(work, stage, params, policy, load) for _ in range(1 if quick else repeats))
                seconds.setdefault(stage, {}).setdefault(policy, {})[str(load)] = round(best, 2)
                if policy == "auto":
                    chosen.setdefault(stage, {})[str(load)] = wait
    out: dict = {"prepare_steps": steps, "repeats": 1 if quick else repeats, "seconds": seconds,
                 "auto_chose": chosen, "cpus": os.cpu_count()}
    return out | judge_busy(seconds)


def judge_busy(seconds: dict[str, dict[str, dict[str, float]]]) -> dict:
    """Each policy's slowdown beside busy processes (against its own time alone) and `auto`'s targets:
    beside one busy process at most TARGETS' factor of its time alone, alone within 10% of OpenMP's own."""
    slowdown = {stage: {policy: {load: round(s[load] / s["0"], 2) for load in s if load != "0"}
                        for policy, s in by.items()} for stage, by in seconds.items()}
    checks = {}
    for stage, by in seconds.items():
        checks[f"{stage}_busy1_slowdown"] = slowdown[stage]["auto"]["1"]
        checks[f"{stage}_alone_vs_openmp"] = round(by["auto"]["0"] / by["openmp"]["0"], 3)
    met = all(v <= TARGETS["busy1_slowdown"] for k, v in checks.items() if k.endswith("busy1_slowdown")) \
        and all(v <= TARGETS["alone_vs_openmp"] for k, v in checks.items() if k.endswith("alone_vs_openmp"))
    return {"slowdown": slowdown, "checks": checks, "targets_met": met}


NAMES = {"openmp": "OpenMP's own", "passive": "passive", "auto": "auto (the default)"}


def table(res: dict) -> str:
    """docs/speed.md's table of a `busy` result: seconds alone and beside 1 and 2 busy processes, and the
    policy `auto` chose."""
    rows = ["| stage | wait policy | alone | beside 1 | beside 2 |", "|---|---|---|---|---|"]
    for stage, by in res["seconds"].items():
        for policy, s in by.items():
            chose = res.get("auto_chose", {}).get(stage, {}) if policy == "auto" else {}
            cell = {load: f"{s[load]} s" + (f" ({chose[load].lower()})" if load in chose else "") for load in s}
            rows.append(f"| {stage} | {NAMES.get(policy, policy)} | {cell['0']} | {cell['1']} | {cell['2']} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    from benchmarks.bench import clone

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="a JSON file: the figures go under its key `busy` (the rest is kept)")
    ap.add_argument("--quick", action="store_true", help="a few steps, one try each: that it completes")
    ap.add_argument("--table", type=Path, metavar="JSON", help="print the markdown table of a JSON's `busy` figures "
                                                               "(reports/benchmark.json) and stop")
    args = ap.parse_args(argv)
    if args.table:
        print(table(json.loads(args.table.read_text())["busy"]))
        return
    with tempfile.TemporaryDirectory(prefix="busy-") as tmp:
        res = bench_busy(clone(Path(tmp) / "repo"), args.quick)
    print(json.dumps(res, indent=2))
    if args.out:
        kept = json.loads(args.out.read_text()) if args.out.exists() else {}
        args.out.write_text(json.dumps(kept | {"busy": res}, indent=2) + "\n")


if __name__ == "__main__":
    main()
