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
from self_improve.cli import derive_seed, run_stage, stage_provenance
from self_improve.config import Algorithm, FrozenJudge, JudgeMode, Params
from self_improve.errors import ConfigError
from self_improve.judges import (
    REGISTRY,
    JudgeContext,
    ModelHandle,
    judge_quality,
    judge_samples,
    template_path,
)
from self_improve.judges.rubric import load_template
from self_improve.tasks import task_for

log = logging.getLogger(__name__)


# the params keys this stage reads: dvc.yaml's params for it, and its provenance
PARAMS = (
    "seed", "model", "task", "judge", "sample.batch_size", "sample.score_tokens", "train.algorithm",
    "security",
)


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--iteration", required=True)
    p.add_argument("--samples", required=True, help="in: samples (parquet)")
    p.add_argument("--model", required=True, help="in: the model that wrote the samples")
    p.add_argument("--base", help="in: the base model (it0) that adapter chains apply to")
    p.add_argument("--ref-model", required=True,
                   help="in: the model before it (for it1: the base before its warm-up)")
    p.add_argument("--out", required=True, help="out: judgments (parquet)")


def main(argv: list[str] | None = None) -> None:
    def body(args: argparse.Namespace, params: Params) -> None:
        cfg = params.judge.model_copy(update={"min_share": params.min_share(args.iteration)})  # the rising gate
        judge = REGISTRY[cfg.method]
        consistency = params.train.algorithm == Algorithm.cream
        frozen = cfg.frozen != FrozenJudge.none
        template = frozen_template = None
        if judge.needs_template:
            try:
                template = load_template(template_path(params))
            except (OSError, ValueError) as err:
                key = "correct_template" if cfg.mode == JudgeMode.yes_logprob else "template"
                raise ConfigError(f"judge.{key}: {err}") from None
        if frozen:
            try:
                frozen_template = load_template(template_path(params, "correct_template"))
            except (OSError, ValueError) as err:
                raise ConfigError(f"judge.correct_template: {err}") from None
        samples = art.read_table(args.samples, art.SAMPLES)
        task = task_for(params.task)
        ctx = JudgeContext(template=template, seed=derive_seed(params.seed, "judge", args.iteration),
                           batch_size=params.sample.batch_size, max_tokens=params.sample.score_tokens,
                           max_length=params.model.max_length, verify=task.verify,
                           question=getattr(task, "question", lambda prompt: prompt),
                           frozen_template=frozen_template)
        if cfg.inverse:
            if not hasattr(task, "inverse"):
                raise ConfigError(f"judge.inverse: task {params.task.name.value} poses no inverse problems "
                                  "(word_math and reasoning_gym do)")
            ctx.inverse, ctx.extract = task.inverse, lambda response: task.extract(response).answer
        if judge.needs_policy or judge.needs_reference or consistency or frozen or cfg.inverse:
            from self_improve.models.loading import (  # torch: only for judges that run a model
                load_model,
                set_threads,
            )

            set_threads()
        if judge.needs_policy or cfg.inverse:
            ctx.policy = ModelHandle(*load_model(args.model, security=params.security, base=args.base,
                                                 model_cfg=params.model))
        if judge.needs_reference or consistency:
            ctx.reference = ModelHandle(*load_model(args.ref_model, security=params.security, base=args.base,
                                                    model_cfg=params.model))
        if frozen:
            ctx.frozen = ModelHandle(*load_model(args.base or args.ref_model, security=params.security,
                                                 model_cfg=params.model))
            if cfg.frozen_mix > 0:  # a slowly moving judge: part of the way from it0 to the policy
                from self_improve.models.loading import interpolate_weights

                policy = ctx.policy.model if ctx.policy is not None else load_model(
                    args.model, security=params.security, base=args.base, model_cfg=params.model)[0]
                interpolate_weights(ctx.frozen.model, policy, cfg.frozen_mix)
        df = judge_samples(samples, cfg, ctx, with_consistency=consistency)
        log.info("%s: %s", cfg.method.value, judge_quality(df, judge.verdict, ctx.verify))
        prov = stage_provenance("judge", args.iteration, params, PARAMS, [args.out])
        prov["consistency"] = consistency
        prov["min_share"] = cfg.min_share  # the gate in force at this iteration (judge.min_share_step)
        art.write_table(df, args.out, art.JUDGMENTS, prov)

    run_stage("judge", _args, body, argv, reads=PARAMS)


if __name__ == "__main__":
    main()
