"""The thin shell every stage's main() shares: arguments, params, seeds, clean errors, and the declaration
of a stage's inputs, outputs and params that both its argument parser and dvc.yaml are made from
(`python -m scripts.pipeline` writes dvc.yaml from them)."""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from self_improve.artifacts import provenance
from self_improve.config import Params, load_params
from self_improve.cpu import WAIT_DECISION
from self_improve.errors import PipelineError


def derive_seed(seed: int, *parts: object) -> int:
    """A stable per-(stage, iteration) seed: the same everywhere, independent of hash salting."""
    digest = hashlib.sha256(repr((seed, *parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little")


class UndeclaredRead(PipelineError):
    """A stage read a params key that its declaration (and so dvc.yaml's params) does not name: a
    change to that key would not rerun it."""


class Declared:
    """A read-only view of params that lets a stage read only what it declared.

    `keys` are dotted params keys as dvc.yaml's `params:` lists them (`sample`, `sample.batch_size`).
    Reading a declared key, or anything under one, gives the value itself; reading a section that
    holds a declared key gives a view of it; reading anything else raises `UndeclaredRead`. Methods
    (`iteration_index`, `min_share`, ...) and `model_dump` run on the params themselves.
    `isinstance` sees the wrapped class.
    """

    def __init__(self, obj, keys: tuple[str, ...], stage: str, prefix: str = ""):
        object.__setattr__(self, "_obj", obj)
        object.__setattr__(self, "_keys", keys)
        object.__setattr__(self, "_stage", stage)
        object.__setattr__(self, "_prefix", prefix)

    @property
    def __class__(self):  # isinstance(view, SampleConfig) holds
        return type(object.__getattribute__(self, "_obj"))

    def __getattr__(self, attr: str):
        obj, keys, prefix = self._obj, self._keys, self._prefix
        if attr.startswith("_") or attr not in type(obj).model_fields:
            return getattr(obj, attr)
        path = prefix + attr
        if any(path == k or path.startswith(k + ".") for k in keys):
            return getattr(obj, attr)
        if any(k.startswith(path + ".") for k in keys):
            return Declared(getattr(obj, attr), keys, self._stage, path + ".")
        raise UndeclaredRead(f"stage {self._stage} read params key {path}, which it does not declare "
                             f"(declared: {', '.join(keys)}); add it to the stage's PARAMS and to its "
                             f"params in dvc.yaml")

    def __setattr__(self, attr: str, value) -> None:
        raise AttributeError("params are read-only in a stage")

    def __repr__(self) -> str:
        return f"Declared({self._prefix or 'params'}: {', '.join(self._keys)})"


def declared_values(params: Params, keys: tuple[str, ...]) -> dict:
    """{declared key: its value} (JSON-ready), what a stage's provenance records."""
    params = params._obj if isinstance(params, Declared) else params  # noqa: SLF001
    dumped = params.model_dump(mode="json")
    out = {}
    for key in keys:
        node = dumped
        for part in key.split("."):
            node = node[part]
        out[key] = node
    return out


@dataclass(frozen=True)
class Arg:
    """One command-line argument of a stage: a path it reads (role `in`) or writes (`out`, `metric`, `plot`:
    how dvc.yaml lists it), a value (`value`: `--iteration`) or a switch. `cache` and `persist` are DVC's
    options for an output; `note` is the comment dvc.yaml gives the path."""

    flag: str
    role: str = "in"
    help: str = ""
    required: bool = False
    cache: bool = True
    persist: bool = False
    note: str = ""

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        if self.role == "switch":
            parser.add_argument(self.flag, action="store_true", help=self.help)
            return
        where = f"{self.role}: " if self.role in ("in", "out") else ""
        parser.add_argument(self.flag, required=self.required, help=f"{where}{self.help}" if self.help else None)


@dataclass(frozen=True)
class Run:
    """One stage of a DVC pipeline that runs the module: its name, each argument's value there (in the
    order of its command line), `foreach` for a stage per iteration (`${loop}`), and the deps that are
    not arguments (files the params name, folders read whole), each "path" or "path  # note"."""

    name: str
    args: dict[str, str]
    foreach: str | None = None
    note: str = ""
    deps: tuple[str, ...] = ()
    params: tuple[str, ...] | None = None  # None: the declaration's
    wdir: str | None = None


@dataclass(frozen=True)
class Declaration:
    """A stage declared once: its arguments, the params keys it reads (None: the whole file, as a dep)
    with an optional comment on each, and the pipeline stages that run it."""

    args: tuple[Arg, ...]
    params: tuple[str, ...] | None
    runs: tuple[Run, ...] = ()
    param_notes: dict[str, str] = field(default_factory=dict)

    def add_args(self, parser: argparse.ArgumentParser) -> None:
        for arg in self.args:
            arg.add_to(parser)

    def arg(self, flag: str) -> Arg:
        return next(a for a in self.args if a.flag == flag)


# the arguments many stages share
ITERATION = Arg("--iteration", "value", required=True)
BASE = Arg("--base", "in", "the base model (it0) that adapter chains apply to")
ENGINE = Arg("--engine", "in", "the model's engine dir (its CTranslate2 conversion)")
STARTING_MODEL = Arg("--model", "in", "the iteration's starting model", required=True)


def run_stage(
    name: str,
    add_args: Callable[[argparse.ArgumentParser], None],
    body: Callable[[argparse.Namespace, Params], None],
    argv: list[str] | None = None,
    reads: tuple[str, ...] | Callable[[argparse.Namespace], tuple[str, ...]] | None = None,
) -> None:
    """Parse the arguments, load params.yaml and run `body`. With `reads` (the stage's declared params
    keys, which dvc.yaml's `params:` must list, or a function of the arguments giving them) the body
    sees only those keys."""
    parser = argparse.ArgumentParser(prog=f"python -m stages.{name}")
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    add_args(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"[{name}] %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    start = time.perf_counter()
    try:
        params = load_params(args.params)
        keys = reads(args) if callable(reads) else reads
        body(args, params if keys is None else Declared(params, keys, name))
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
           "process_seconds": process_seconds(), **_EXTRA_TIMINGS,
           **{k: WAIT_DECISION.get(k) for k in ("omp_wait", "others_busy")}}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def stage_provenance(stage: str, iteration: str, params: Params, keys: tuple[str, ...] | None,
                     outputs: list[str]) -> dict:
    """Provenance for a stage: the params it declared (`keys`; None: those of its Declared view)."""
    if keys is None:
        keys = object.__getattribute__(params, "_keys")
    return provenance(stage, iteration, declared_values(params, keys), outputs)
