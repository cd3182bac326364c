"""The loop on a machine that is not idle: two stages timed alone and beside busy processes.

    python -m benchmarks.busy [--out FILE] [--quick]   # in a fresh clone of HEAD (also `make bench`'s `busy`)

A laptop with a browser open, or a shared runner, keeps cores busy. OpenMP's threads spin while they
wait, and beside another process they fight it for the cores. This runs the base model's training
(`prepare`, a fixed number of steps) and its evaluation (`evaluate_base`: greedy answers through
the engine) alone, beside one and beside two single-threaded busy processes (`yes > /dev/null`),
under OpenMP's own wait policy (`SELF_IMPROVE_OMP_WAIT=default`, the project's default) and the passive
one (`SELF_IMPROVE_OMP_WAIT=passive`, self_improve/cpu.py). Each figure is the stage's own time
(SELF_IMPROVE_TIMINGS), best of `repeats`. Targets: beside one busy process a stage takes at most
2x its time alone, and alone it is no slower than under the default policy (within 10%): what a default
that waits passively would have to meet.
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

POLICIES = {"default": "default", "passive": "passive"}  # SELF_IMPROVE_OMP_WAIT
LOADS = (0, 1, 2)  # busy processes beside the stage
STAGES = ("prepare", "evaluate_base")
TARGETS = {"busy1_slowdown": 2.0, "alone_vs_default": 1.10}


def _argv(work: Path, stage: str) -> list[str]:
    from runners.dag import stage_commands

    argv = next(a for name, a in stage_commands(work) if name == stage)
    return [sys.executable, *argv[1:]]


def _time_stage(work: Path, stage: str, params: Path, policy: str, load: int) -> float:
    """The stage's own seconds (its timing record), run beside `load` busy processes."""
    timings = Path(tempfile.mkstemp(suffix=".jsonl")[1])
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
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
    return rows[-1]["seconds"]


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
    for stage in STAGES:
        if stage == "evaluate_base":
            _run(work, "engine_base", params)  # the engine of the model prepare wrote (the same bytes each time)
        for policy in POLICIES:
            for load in LOADS:
                print(f"busy: {stage}, {policy} wait, beside {load} busy process(es) ...", flush=True)
                best = min(_time_stage(work, stage, params, policy, load) for _ in range(1 if quick else repeats))
                seconds.setdefault(stage, {}).setdefault(policy, {})[str(load)] = round(best, 2)
    out: dict = {"prepare_steps": steps, "repeats": 1 if quick else repeats, "seconds": seconds, "cpus": os.cpu_count()}
    checks = {}
    for stage, by in seconds.items():
        for policy, s in by.items():
            out.setdefault("slowdown", {}).setdefault(stage, {})[policy] = {
                load: round(s[load] / s["0"], 2) for load in s if load != "0"}
        checks[f"{stage}_busy1_slowdown"] = out["slowdown"][stage]["passive"]["1"]
        checks[f"{stage}_alone_vs_default"] = round(by["passive"]["0"] / by["default"]["0"], 3)
    out["checks"] = checks
    out["targets_met"] = all(v <= TARGETS["busy1_slowdown"] for k, v in checks.items() if k.endswith("busy1_slowdown")) \
        and all(v <= TARGETS["alone_vs_default"] for k, v in checks.items() if k.endswith("alone_vs_default"))
    return out


def main(argv: list[str] | None = None) -> None:
    from benchmarks.bench import clone

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="a JSON file: the figures go under its key `busy` (the rest is kept)")
    ap.add_argument("--quick", action="store_true", help="a few steps, one try each: that it completes")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="busy-") as tmp:
        res = bench_busy(clone(Path(tmp) / "repo"), args.quick)
    print(json.dumps(res, indent=2))
    if args.out:
        kept = json.loads(args.out.read_text()) if args.out.exists() else {}
        args.out.write_text(json.dumps(kept | {"busy": res}, indent=2) + "\n")


if __name__ == "__main__":
    main()
