"""Stage `sample`: k responses per prompt from the iteration's starting model.

The logic: self_improve/sampling.py."""

from __future__ import annotations

import argparse

from self_improve import artifacts as art
from self_improve.config import Params
from self_improve.engines.sampler import close_sampler, open_sampler
from self_improve.models.loading import set_threads
from self_improve.sampling import sample
from self_improve.stage import (
    BASE,
    ENGINE,
    ITERATION,
    STARTING_MODEL,
    Arg,
    Declaration,
    Run,
    derive_seed,
    run_stage,
    stage_provenance,
)
from self_improve.tasks import task_for

# the params keys this stage reads: dvc.yaml's params for it, and its provenance (the judge's keys that
# adaptive sampling reads: which votes, their gate and the validity check)
PARAMS = ("seed", "model", "task", "sample", "security", "judge.method", "judge.min_share", "judge.min_share_step",
          "judge.validity", "judge.restates", "judge.cross_view", "judge.frozen")


DECLARATION = Declaration(
    args=(
        ITERATION,
        Arg("--prompts", "in", "this iteration's prompts", required=True),
        STARTING_MODEL,
        BASE,
        ENGINE,
        Arg("--bstar", "in", "the bstar stage's choice (its temperature is used); none: sample.temperature"),
        Arg("--out", "out", "samples (parquet)", required=True),
    ),
    params=PARAMS,
    runs=(Run("sample", {
        "--iteration": "${key}", "--prompts": "data/${key}/prompts.parquet", "--model": "data/${item.prev}/model",
        "--base": "data/it0/model", "--engine": "data/${item.prev}/engine", "--bstar": "data/${key}/bstar.json",
        "--out": "data/${key}/samples.parquet"}, foreach="${loop}"),),
)


def main(argv: list[str] | None = None) -> None:
    def body(args: argparse.Namespace, params: Params) -> None:
        params.iteration_index(args.iteration)
        set_threads()
        prompts = art.read_table(args.prompts, art.PROMPTS)
        cfg = params.sample
        if args.bstar:
            cfg = cfg.model_copy(update={"temperature": float(art.read_json(args.bstar)["temperature"])})
        sampler = open_sampler(args.model, params.sample, params.security, args.base, params.model, args.engine)
        judge = params.judge.model_copy(update={"min_share": params.min_share(args.iteration)})
        drawn: dict = {}
        try:
            df = sample(sampler, prompts, cfg, derive_seed(params.seed, "sample", args.iteration),
                        task_for(params.task), judge=judge, stats=drawn)
        finally:
            close_sampler(sampler)
        prov = stage_provenance("sample", args.iteration, params, PARAMS, [args.out])
        prov["drawn"] = drawn  # samples drawn against k's, new tokens, why vote groups stopped
        prov["temperature"] = cfg.temperature  # the one used: sample.temperature, or B-STaR's choice
        prov["backend"] = sampler.backend
        if getattr(sampler, "compute_type", None):
            prov["compute_type"] = sampler.compute_type
        art.write_table(df, args.out, art.SAMPLES, prov)

    run_stage("sample", DECLARATION.add_args, body, argv, reads=PARAMS)


if __name__ == "__main__":
    main()
