"""The judge registry: every method takes the samples and returns nullable rewards.

A judge returns, for each sample row, a reward (float, or None when it has no verdict) and the
pseudo-label it compared against (or None). None is never turned into 0: a sample without a
verdict is dropped downstream, not "rejected".

- ``majority_vote`` (TTRL): per prompt, the plurality answer of its k samples is the label.
- ``co_reward`` (Co-Reward style): per problem, the plurality answer pooled over the samples of
  all its equivalent rewrites (``a+b``, ``b+a``, ``(a+d)+(b-d)``, ...) is the label. Errors on
  different surface forms are less correlated than k samples of one prompt, so the pooled vote
  is a better judge than the policy's own majority.
- ``verifier``: ground truth; an oracle baseline and the yardstick for judge quality.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, Optional

import pandas as pd

from .config import JudgeConfig, JudgeMethod
from .tasks import verify

Verdicts = tuple[list[Optional[float]], list[Optional[str]]]


def vote_label(preds: list[str | None], min_share: float) -> str | None:
    """Plurality answer of `preds` if it is unique and has at least `min_share` of all votes."""
    counts = Counter(p for p in preds if p is not None)
    if not counts:
        return None
    (top, n_top), *rest = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    if rest and rest[0][1] == n_top:
        return None  # a tie has no majority
    if n_top / len(preds) < min_share:
        return None
    return top


def _vote_by(key: str) -> Callable[[pd.DataFrame, JudgeConfig], Verdicts]:
    def judge(samples: pd.DataFrame, cfg: JudgeConfig) -> Verdicts:
        labels: dict[str, str | None] = {}
        for k, group in samples.groupby(key, sort=False):
            preds = [p if isinstance(p, str) else None for p in group["pred"]]
            labels[k] = vote_label(preds, cfg.min_share)
        label = [labels[k] for k in samples[key]]
        reward = [
            None if lab is None else (1.0 if pred == lab else 0.0)
            for lab, pred in zip(label, samples["pred"])
        ]
        return reward, label

    return judge


def _verifier(samples: pd.DataFrame, cfg: JudgeConfig) -> Verdicts:
    reward = [verify(p if isinstance(p, str) else None, a if isinstance(a, str) else None)
              for p, a in zip(samples["pred"], samples["answer"])]
    label = [a if isinstance(a, str) else None for a in samples["answer"]]
    return reward, label


@dataclass(frozen=True)
class Judge:
    fn: Callable[[pd.DataFrame, JudgeConfig], Verdicts]
    uses_ground_truth: bool
    needs_rewrites: bool = False


REGISTRY: dict[JudgeMethod, Judge] = {
    JudgeMethod.majority_vote: Judge(_vote_by("prompt_id"), uses_ground_truth=False),
    JudgeMethod.co_reward: Judge(_vote_by("group_id"), uses_ground_truth=False, needs_rewrites=True),
    JudgeMethod.verifier: Judge(_verifier, uses_ground_truth=True),
}


def judge_samples(samples: pd.DataFrame, cfg: JudgeConfig) -> pd.DataFrame:
    """Add `reward`, `label` (the configured judge) and `correct` (the verifier, to measure)."""
    judge = REGISTRY[cfg.method]
    # self-judges never see the ground truth
    visible = samples if judge.uses_ground_truth else samples.assign(answer=None)
    reward, label = judge.fn(visible, cfg)
    out = samples.copy()
    out["reward"] = pd.array(reward, dtype="Float64")
    out["label"] = pd.array(label, dtype="string")
    out["correct"] = pd.array(
        [verify(p if isinstance(p, str) else None, a if isinstance(a, str) else None)
         for p, a in zip(samples["pred"], samples["answer"])],
        dtype="Float64",
    )
    return out


def judge_quality(judgments: pd.DataFrame) -> dict[str, float | None]:
    """How far the self-judge can be trusted, where ground truth exists.

    judge_accuracy: agreement of the judge's binary verdict (reward >= 0.5) with the verifier,
    over samples the judge scored. label_accuracy: share of labelled prompts whose pseudo-label is
    the true answer. label_coverage: share of prompts that got a label at all.
    """
    scored = judgments.dropna(subset=["reward", "correct"])
    out: dict[str, float | None] = {
        "judge_accuracy": None,
        "label_accuracy": None,
        "label_coverage": None,
        "reward_mean": None,
    }
    if len(judgments.dropna(subset=["reward"])):
        out["reward_mean"] = float(judgments["reward"].dropna().astype(float).mean())
    if len(scored):
        agree = (scored["reward"].astype(float) >= 0.5) == (scored["correct"].astype(float) >= 0.5)
        out["judge_accuracy"] = float(agree.mean())
    per_prompt = judgments.drop_duplicates("prompt_id")
    if len(per_prompt):
        labelled = per_prompt[per_prompt["label"].notna() & per_prompt["answer"].notna()]
        out["label_coverage"] = float(per_prompt["label"].notna().mean())
        if len(labelled):
            out["label_accuracy"] = float(
                (labelled["label"].astype(str) == labelled["answer"].astype(str)).mean()
            )
    return out
