"""Stage `judge`: score every sample with the configured judge (nullable rewards).

The verifier's verdict is stored beside it in `correct`, for measuring judge quality only;
self-judges never see the ground truth.
"""

from __future__ import annotations

import argparse
import logging

from .lib import artifacts as art
from .lib.cli import run_stage, stage_provenance
from .lib.config import Params
from .lib.judges import judge_quality, judge_samples

log = logging.getLogger(__name__)


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--iteration", required=True)
    p.add_argument("--samples", required=True, help="in: samples (parquet)")
    p.add_argument("--out", required=True, help="out: judgments (parquet)")


def main(argv: list[str] | None = None) -> None:
    def body(args: argparse.Namespace, params: Params) -> None:
        params.iteration_index(args.iteration)
        samples = art.read_table(args.samples, art.SAMPLES)
        df = judge_samples(samples, params.judge)
        log.info("%s: %s", params.judge.method.value, judge_quality(df))
        prov = stage_provenance("judge", args.iteration, params, ("seed", "judge"), [args.out])
        art.write_table(df, args.out, art.JUDGMENTS, prov)

    run_stage("judge", _args, body, argv)


if __name__ == "__main__":
    main()
