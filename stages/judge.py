"""Stage `judge`: score every sample with the configured judge (nullable rewards).

Model-based judges (llm_judge, self_certainty, implicit_reward) read the model that wrote the
samples (`--model`) and, for implicit_reward and CREAM's consistency, the model before it
(`--ref-model`). A frozen judge (judge.frozen) reads the base model (`--base`, adapters off), the
same model every iteration. The verifier's verdict is stored beside the reward in `correct`, for measuring
judge quality only; self-judges never see the ground truth.
"""

from __future__ import annotations

import argparse
import logging

from self_improve import artifacts as art
from self_improve.config import Params
from self_improve.judges import ModelHandle, context, judge_quality, judge_samples, needs
from self_improve.stage import BASE, ITERATION, Arg, Declaration, Run, derive_seed, run_stage, stage_provenance
from self_improve.tasks import task_for

log = logging.getLogger(__name__)


# the params keys this stage reads: dvc.yaml's params for it, and its provenance
PARAMS = (
    "seed", "model", "task", "judge", "sample.batch_size", "sample.score_tokens", "train.algorithm",
    "security",
)


DECLARATION = Declaration(
    args=(
        ITERATION,
        Arg("--samples", "in", "samples (parquet)", required=True),
        Arg("--model", "in", "the model that wrote the samples", required=True),
        BASE,
        Arg("--ref-model", "in", "the model before it (for it1: the base before its warm-up)", required=True),
        Arg("--out", "out", "judgments (parquet)", required=True),
    ),
    params=PARAMS,
    runs=(Run("judge", {
        "--iteration": "${key}", "--samples": "data/${key}/samples.parquet", "--model": "data/${item.prev}/model",
        "--ref-model": "data/${item.ref}/model", "--base": "data/it0/model", "--out": "data/${key}/judgments.parquet"},
        foreach="${loop}",
        deps=("${judge.template}  # the rubric the params name", "${judge.correct_template}")),),
)


def main(argv: list[str] | None = None) -> None:
    def body(args: argparse.Namespace, params: Params) -> None:
        cfg = params.judge.model_copy(update={"min_share": params.min_share(args.iteration)})  # the rising gate
        judge = cfg.entry  # its entry of the judge table
        consistency = params.train.entry.consistency  # CREAM's, stored for the train stage
        roles = needs(cfg, consistency)
        models = {}
        if roles:
            from self_improve.models.loading import (  # torch: only for judges that run a model
                interpolate_weights,
                load_model,
                set_threads,
            )

            set_threads()
            paths = {"policy": (args.model, args.base), "reference": (args.ref_model, args.base),
                     "frozen": (args.base or args.ref_model, None)}  # the base, adapters off
            for role in [r for r in ("policy", "reference", "frozen") if r in roles]:
                path, base = paths[role]
                models[role] = ModelHandle(*load_model(path, security=params.security, base=base,
                                                       model_cfg=params.model))
            if "frozen" in models and cfg.frozen_mix > 0:  # a slowly moving judge: part way to the policy
                policy = models["policy"].model if "policy" in models else load_model(
                    args.model, security=params.security, base=args.base, model_cfg=params.model)[0]
                interpolate_weights(models["frozen"].model, policy, cfg.frozen_mix)
        samples = art.read_table(args.samples, art.SAMPLES)
        ctx = context(params, models, task=task_for(params.task), cfg=cfg,
                      seed=derive_seed(params.seed, "judge", args.iteration))
        df = judge_samples(samples, cfg, ctx, with_consistency=consistency)
        log.info("%s: %s", cfg.method, judge_quality(df, judge.verdict, ctx.verify))
        prov = stage_provenance("judge", args.iteration, params, PARAMS, [args.out])
        prov["consistency"] = consistency
        prov["min_share"] = cfg.min_share  # the gate in force at this iteration (judge.min_share_step)
        art.write_table(df, args.out, art.JUDGMENTS, prov)

    run_stage("judge", DECLARATION.add_args, body, argv, reads=PARAMS)


if __name__ == "__main__":
    main()
