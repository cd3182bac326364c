"""The thin shell every stage's main() shares: arguments, params, seeds, clean errors."""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
import time
from typing import Callable

from .artifacts import provenance
from .config import Params, load_params
from .errors import PipelineError


def derive_seed(seed: int, *parts: object) -> int:
    """A stable per-(stage, iteration) seed: the same everywhere, independent of hash salting."""
    digest = hashlib.sha256(repr((seed, *parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little")


def run_stage(
    name: str,
    add_args: Callable[[argparse.ArgumentParser], None],
    body: Callable[[argparse.Namespace, Params], None],
    argv: list[str] | None = None,
) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m stages.{name}")
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    add_args(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"[{name}] %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    start = time.perf_counter()
    try:
        params = load_params(args.params)
        body(args, params)
    except PipelineError as err:
        print(f"{name}: error: {err}", file=sys.stderr)
        sys.exit(2)
    _record_timing(name, getattr(args, "iteration", None), time.perf_counter() - start)


_EXTRA_TIMINGS: dict[str, float] = {}


def note_timing(key: str, seconds: float) -> None:
    """Add a named part of this stage's time (e.g. MLflow logging) to its timing record."""
    _EXTRA_TIMINGS[key] = _EXTRA_TIMINGS.get(key, 0.0) + seconds


def process_seconds() -> float | None:
    """Wall time since this process started (Linux), imports included; None where unknown."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _record_timing(stage: str, iteration: str | None, body_seconds: float) -> None:
    """With SELF_IMPROVE_TIMINGS=<file>, append this stage's timing to it (for benchmarks/)."""
    path = os.environ.get("SELF_IMPROVE_TIMINGS")
    if not path or os.environ.get("RANK", "0") != "0":  # under a launcher, one row: the main process's
        return
    row = {"stage": stage, "iteration": iteration, "seconds": body_seconds,
           "process_seconds": process_seconds(), **_EXTRA_TIMINGS}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def stage_provenance(stage: str, iteration: str, params: Params, keys: tuple[str, ...], outputs: list[str]) -> dict:
    """Provenance for a stage that reads the params sections `keys`."""
    dumped = params.model_dump(mode="json")
    return provenance(stage, iteration, {k: dumped[k] for k in keys}, outputs)
