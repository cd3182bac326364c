"""Judging samples: `judge_samples` runs the configured judge of the judge table
(self_improve/config/judges.py, where every method is registered once with what it needs and where
its verdict function lives) and `judge_quality` measures it against the oracle `verifier`.

Every judge takes the samples and returns nullable rewards: ``fn(samples, cfg, ctx) -> Verdicts``,
where a reward is a float or None (no verdict). None is never turned into 0: a sample without a
verdict is dropped downstream, not "rejected". Self-judges never see the gold answer.

- ``majority_vote`` (TTRL): per prompt, the plurality answer of its k samples is the label.
- ``co_reward`` (Co-Reward): per problem, the plurality answer pooled over the samples of all its
  equivalent rewrites (``a+b``, ``b+a``, ``(a+d)+(b-d)``, ...) is the label. Errors on different
  surface forms are less correlated than k samples of one prompt, so a model confirming its own
  mistakes is outvoted by the other formulations.
- ``llm_judge`` (Self-Rewarding LMs): the model itself scores each response with the additive
  5-point rubric in ``judge.template``, ``judge.judgments`` times, averaged; only the judge's own
  generated text is parsed (self_improve/judges/rubric.py); a parse failure is None. Reward = points / 5.
  With ``judge.mode`` score_logprob (G-Eval) the score is the expected value over the tokens 1..5
  after "Score: ", and with yes_logprob P(Yes) for "is this answer correct?"
  (``judge.correct_template``): one forward pass per judgment, nothing to parse.
- ``self_certainty``: mean over response tokens of KL(Uniform || p) under the policy.
- ``implicit_reward`` (CREAM / DPO): sum log pi_current(y|x) - sum log pi_reference(y|x), the
  reference being the model before the current one (the base for it1).
- ``vote_share`` (ScPO): a sample's reward is the share of the prompt's votes its answer got, so the
  pair is the most-voted answer over the least-voted and the reward margin is the vote margin / k.
- ``verifier``: ground truth; an oracle baseline and the yardstick for judge quality.
- ``random``, ``format``, ``validity_only``: the control arms (self_improve/judges/controls.py), rewards
  that know nothing of an answer's truth, looped as a rule is so that its gain can be set beside theirs.

The vote judges take the label-free rules of `judge`: the `min_share` gate (RESTRAIN, ScPO),
Self-Harmony's cross-view label for co_reward (`cross_view: harmonic`), the validity check
(`validity`, self_improve/judges/validity.py: invalid responses do not vote and get the lowest reward) and a
frozen judge (`frozen`: the base model's P(Yes) weighs each answer's votes).

CREAM's consistency (when asked for): per prompt, Kendall tau between the ranking of its samples
by this judge and by the previous iteration's model (the reference, scoring each sample by its
mean token log-prob), stored as ``consistency`` = (tau + 1) / 2 for the train stage.
"""

from __future__ import annotations

from typing import Callable, Optional

import pandas as pd

from self_improve.config import ConfigError, FrozenJudge, JudgeConfig, JudgeMode, judge_of
from self_improve.judges.base import JudgeContext, ModelHandle, Verdicts, Verify, category, template_path
from self_improve.judges.rubric import load_template
from self_improve.judges.validity import invalid_reason
from self_improve.quality import consistency_from_tau, kendall_tau, roc_auc


def verifier(samples: pd.DataFrame, cfg: JudgeConfig, ctx: JudgeContext) -> Verdicts:
    if ctx.verify is None:
        raise ValueError("judge.method verifier needs the task's check of an answer (JudgeContext.verify)")
    reward = [ctx.verify(p if isinstance(p, str) else None, a if isinstance(a, str) else None, category(c))
              for p, a, c in zip(samples["pred"], samples["answer"], samples["category"])]
    label = [a if isinstance(a, str) else None for a in samples["answer"]]
    return Verdicts(reward, label)


def needs(cfg: JudgeConfig, consistency: bool = False) -> set[str]:
    """The models judging with `cfg` needs, from the judge table: `policy` (the model that sampled: a
    judge that scores with it, or inverse problems), `reference` (the model before it: implicit
    reward, CREAM's consistency), `frozen` (judge.frozen: the base, adapters off)."""
    judge = cfg.entry
    out = set()
    if judge.needs_policy or cfg.inverse:
        out.add("policy")
    if judge.needs_reference or consistency:
        out.add("reference")
    if cfg.frozen != FrozenJudge.none:
        out.add("frozen")
    return out


def _template(params, key: str | None = None) -> str:
    try:
        return load_template(template_path(params, key))
    except (OSError, ValueError) as err:
        key = key or ("correct_template" if params.judge.mode == JudgeMode.yes_logprob else "template")
        raise ConfigError(f"judge.{key}: {err}") from None


def _limits(params) -> dict:
    """The scoring limits of params a JudgeContext carries."""
    return {"batch_size": params.sample.batch_size, "max_tokens": params.sample.score_tokens,
            "max_length": params.model.max_length}


def frozen_context(params, frozen: ModelHandle) -> JudgeContext:
    """The context of the frozen judge alone (judge.frozen: the base's P(Yes) for an answer), as the
    evaluate stage scores test-time answers with it: judge.correct_template and the scoring limits."""
    return JudgeContext(frozen=frozen, frozen_template=_template(params, "correct_template"), **_limits(params))


def ruled_out_by(task, name: str) -> Callable[[str], frozenset]:
    """judge.shortcut: the task's `ruled_out` (the answers a right response to a prompt cannot give,
    read from the question alone); a task without one is refused by name."""
    if not hasattr(task, "ruled_out"):
        raise ConfigError(f"judge.shortcut: task {name} rules out no answer from the question alone (word_math does)")
    return task.ruled_out


def context(params, models: dict[str, ModelHandle], *, task=None, seed: int = 0,
            cfg: JudgeConfig | None = None) -> JudgeContext:
    """The JudgeContext that judging with `cfg` (default params.judge) reads: the templates the judge
    table says it renders (a bad file refused by key), the scoring limits of params, the task's check,
    question and inverse problems, and the `models` given by role (policy, reference, frozen; `needs`
    says which). The judge stage builds it so; the diagnosis (research/gap.py) keeps one context for every
    rule it scores, so that their log-prob scores are computed once."""
    cfg = cfg or params.judge
    frozen = cfg.frozen != FrozenJudge.none
    ctx = JudgeContext(template=_template(params) if cfg.entry.needs_template else None,
                       frozen_template=_template(params, "correct_template") if frozen else None,
                       seed=seed, policy=models.get("policy"), reference=models.get("reference"),
                       frozen=models.get("frozen"), **_limits(params))
    if task is not None:
        ctx.verify = task.verify
        ctx.question = getattr(task, "question", lambda prompt: prompt)
        if cfg.shortcut:
            ctx.ruled_out = ruled_out_by(task, params.task.name)
    if cfg.inverse:
        if not hasattr(task, "inverse"):
            raise ConfigError(f"judge.inverse: task {params.task.name} poses no inverse problems "
                              "(word_math and reasoning_gym do)")
        ctx.inverse, ctx.extract = task.inverse, lambda response: task.extract(response).answer
    return ctx


def consistency(samples: pd.DataFrame, reward: list[Optional[float]], ctx: JudgeContext) -> list[Optional[float]]:
    """CREAM: per prompt, (tau + 1) / 2 between the judge's ranking and the reference model's."""
    ref = ctx.scores("reference", samples)
    ref_mean = [lp / max(1, n) for lp, n in zip(ref.logp, ref.tokens)]
    frame = pd.DataFrame({"pid": samples["prompt_id"].to_numpy(), "reward": reward, "ref": ref_mean})
    out: dict[str, Optional[float]] = {}
    for pid, group in frame.groupby("pid", sort=False):
        scored = group.dropna(subset=["reward"])
        if len(scored) < 2:
            out[pid] = None
            continue
        out[pid] = consistency_from_tau(kendall_tau(list(scored["reward"]), list(scored["ref"])))
    return [out[p] for p in samples["prompt_id"]]


def judge_samples(samples: pd.DataFrame, cfg: JudgeConfig, ctx: JudgeContext | None = None,
                  with_consistency: bool = False) -> pd.DataFrame:
    """Add `reward`, `label`, `parse_rate` (the configured judge), `consistency` (CREAM, when
    asked for), `valid` (judge.validity), `frozen_yes` (judge.frozen) and `correct` (the verifier,
    to measure only).

    With judge.validity, invalid responses (self_improve/judges/validity.py) do not vote (their answer is
    hidden from the judge) and get the lowest reward: 0 for verdicts, the lowest reward given for a
    ranking."""
    ctx = ctx or JudgeContext()
    judge = judge_of(cfg.method)
    # self-judges never see the ground truth
    visible = samples if judge.uses_ground_truth else samples.assign(answer=None)
    n = len(samples)
    valid: list[Optional[bool]] = [None] * n
    if cfg.validity:
        valid = [invalid_reason(ctx.question(q), r if isinstance(r, str) else "",
                                p if isinstance(p, str) else None, cfg.restates.value,
                                ctx.ruled_out(q) if cfg.shortcut else ()) is None
                 for q, r, p in zip(samples["prompt"], samples["response"], samples["pred"])]
        visible = visible.assign(pred=[p if ok else None for p, ok in zip(visible["pred"], valid)])
    v = judge.function()(visible, cfg, ctx)
    reward = list(v.reward)
    if cfg.validity:
        given = [r for r in reward if r is not None]
        lowest = 0.0 if judge.verdict else (min(given) if given else None)
        reward = [r if ok else lowest for r, ok in zip(reward, valid)]
    out = samples.copy()
    out["reward"] = pd.array(reward, dtype="Float64")
    out["valid"] = pd.array(valid, dtype="boolean")
    out["frozen_yes"] = pd.array(ctx._scores.get("frozen_yes", [None] * n), dtype="Float64")
    out["label"] = pd.array(v.label if v.label is not None else [None] * n, dtype="string")
    out["parse_rate"] = pd.array(v.parse_rate if v.parse_rate is not None else [None] * n, dtype="Float64")
    out["penalised"] = pd.array(v.penalised if v.penalised is not None else [None] * n, dtype="boolean")
    cons = consistency(visible, v.reward, ctx) if with_consistency else [None] * n
    out["consistency"] = pd.array(cons, dtype="Float64")
    out["correct"] = pd.array(
        [ctx.verify(p if isinstance(p, str) else None, a if isinstance(a, str) else None, category(c))
         for p, a, c in zip(samples["pred"], samples["answer"], samples["category"])]
        if ctx.verify is not None else [None] * n,
        dtype="Float64",
    )
    return out


def _pairwise_accuracy(scored: pd.DataFrame) -> float | None:
    """Within each prompt, over (correct, wrong) sample pairs: share ranked right (ties 1/2)."""
    hits, total = 0.0, 0
    for _, g in scored.groupby("prompt_id", sort=False):
        r = g["reward"].astype(float).to_numpy()
        c = g["correct"].astype(float).to_numpy() >= 0.5
        good, bad = r[c], r[~c]
        if len(good) and len(bad):
            diff = good[:, None] - bad[None, :]
            hits += float((diff > 0).sum() + 0.5 * (diff == 0).sum())
            total += diff.size
    return hits / total if total else None


def judge_quality(judgments: pd.DataFrame, verdict: bool = True,
                  verify: Optional[Verify] = None) -> dict[str, float | None]:
    """How far the self-judge can be trusted, where ground truth exists.

    judge_accuracy: for verdict judges, agreement of the binary verdict (reward >= 0.5) with the
    verifier over the samples the judge scored; for ranking judges (self_certainty,
    implicit_reward), the share of (correct, wrong) sample pairs of one prompt that the judge ranks
    the right way round. judge_auc: ROC AUC of reward against correctness over all scored samples.
    label_accuracy / label_coverage: pseudo-labels (vote judges). judged_share: samples with a
    verdict. parse_failure_rate (llm_judge): share of judge outputs that did not parse, over the
    samples it was asked to judge.
    """
    scored = judgments.dropna(subset=["reward", "correct"])
    out: dict[str, float | None] = {
        "judge_accuracy": None,
        "judge_auc": None,
        "label_accuracy": None,
        "label_coverage": None,
        "reward_mean": None,
        "judged_share": None,
        "parse_failure_rate": None,
    }
    if len(judgments):
        out["judged_share"] = float(judgments["reward"].notna().mean())
    if len(judgments.dropna(subset=["reward"])):
        out["reward_mean"] = float(judgments["reward"].dropna().astype(float).mean())
    if len(scored):
        if verdict:
            agree = (scored["reward"].astype(float) >= 0.5) == (scored["correct"].astype(float) >= 0.5)
            out["judge_accuracy"] = float(agree.mean())
        else:
            out["judge_accuracy"] = _pairwise_accuracy(scored)
        out["judge_auc"] = roc_auc(list(scored["reward"].astype(float)), list(scored["correct"].astype(float)))
    if "parse_rate" in judgments and judgments["parse_rate"].notna().any():
        out["parse_failure_rate"] = float(1 - judgments["parse_rate"].dropna().astype(float).mean())
    if judgments["label"].notna().any():
        per_prompt = judgments.drop_duplicates("prompt_id")
        labelled = per_prompt[per_prompt["label"].notna() & per_prompt["answer"].notna()]
        out["label_coverage"] = float(per_prompt["label"].notna().mean())
        if len(labelled) and verify is not None:
            out["label_accuracy"] = float(sum(
                verify(str(lab), str(gold), category(c)) or 0.0
                for lab, gold, c in zip(labelled["label"], labelled["answer"], labelled["category"])
            ) / len(labelled))
    return out
