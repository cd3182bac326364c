"""The thin shell every stage's main() shares: arguments, params, seeds, clean errors."""

from __future__ import annotations

import argparse
import hashlib
import logging
import sys
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
    try:
        params = load_params(args.params)
        body(args, params)
    except PipelineError as err:
        print(f"{name}: error: {err}", file=sys.stderr)
        sys.exit(2)


def stage_provenance(stage: str, iteration: str, params: Params, keys: tuple[str, ...], outputs: list[str]) -> dict:
    """Provenance for a stage that reads the params sections `keys`."""
    dumped = params.model_dump(mode="json")
    return provenance(stage, iteration, {k: dumped[k] for k in keys}, outputs)
