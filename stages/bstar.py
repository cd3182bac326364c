"""Stage `bstar`: the iteration's sampling temperature and RAFT reward threshold, chosen by B-STaR's
balance score on a dev subset of its prompts (sample.bstar.enabled), or the params' fixed ones.

Off (the default), it writes the fixed choice without loading any model, so the stages that read
it (sample, pairs, evaluate) rerun only when the choice itself changes. The logic: self_improve/bstar.py."""

from __future__ import annotations

import argparse

from self_improve import artifacts as art
from self_improve.bstar import off, sweep
from self_improve.config import Params
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

# the params keys this stage reads: dvc.yaml's params for it, and its provenance
PARAMS = ("seed", "model", "task", "sample", "judge", "pairs.sft_min_reward", "security")


DECLARATION = Declaration(
    args=(
        ITERATION,
        Arg("--prompts", "in", "this iteration's prompts", required=True),
        STARTING_MODEL,
        BASE,
        ENGINE,
        Arg("--out", "out", "the chosen temperature and threshold (json)", required=True),
    ),
    params=PARAMS,
    runs=(Run("bstar", {
        "--iteration": "${key}", "--prompts": "data/${key}/prompts.parquet", "--model": "data/${item.prev}/model",
        "--base": "data/it0/model", "--engine": "data/${item.prev}/engine", "--out": "data/${key}/bstar.json"},
        foreach="${loop}",
        note="B-STaR: the iteration's temperature and RAFT threshold (off: the params' own, no model loaded)"),),
)


def main(argv: list[str] | None = None) -> None:
    def body(args: argparse.Namespace, params: Params) -> None:
        params.iteration_index(args.iteration)
        if not params.sample.bstar.enabled:
            art.write_json(off(params), args.out)
            return
        from self_improve.engines.sampler import open_sampler  # torch: only when the sweep runs
        from self_improve.models.loading import set_threads
        from self_improve.tasks import task_for

        set_threads()
        prompts = art.read_table(args.prompts, art.PROMPTS)
        sampler = open_sampler(args.model, params.sample, params.security, args.base, params.model, args.engine)
        choice = sweep(sampler, prompts, params, task_for(params.task),
                       derive_seed(params.seed, "bstar", args.iteration), params.min_share(args.iteration))
        choice["provenance"] = stage_provenance("bstar", args.iteration, params, PARAMS, [args.out])
        art.write_json(choice, args.out)

    run_stage("bstar", DECLARATION.add_args, body, argv, reads=PARAMS)


if __name__ == "__main__":
    main()
