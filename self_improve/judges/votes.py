"""The vote judges (majority_vote, co_reward, vote_share) and the label-free rules they take: the
min_share gate and its low-consensus handling, the gate of a whole category, Self-Harmony's cross-view label, the validity check,
the frozen judge's weights, the inverse problems' check (judges/inverse.py)."""

from __future__ import annotations

from collections import Counter
from typing import Callable, Optional

import pandas as pd

from self_improve.config import CrossView, FrozenJudge, JudgeConfig, LowConsensus
from self_improve.judges.base import JudgeContext, Verdicts, category
from self_improve.judges.inverse import inverse_checks
from self_improve.judges.model import frozen_yes


def answer_scores(preds: list[str | None]) -> dict[str, float]:
    """Each answer's vote share over all `preds` (a sample without an answer counts, voting for none)."""
    counts = Counter(p for p in preds if p is not None)
    return {a: c / len(preds) for a, c in counts.items()}


def frozen_weights(preds: list[str | None], frozen: list[float | None]) -> dict[str, float]:
    """Each answer's mean frozen P(Yes) over its samples (0 where none was judged)."""
    out = {}
    for a in set(p for p in preds if p is not None):
        ps = [f for p, f in zip(preds, frozen) if p == a and f is not None]
        out[a] = sum(ps) / len(ps) if ps else 0.0
    return out


def harmonic_scores(preds: list[str | None], variants: list[int]) -> dict[str, float]:
    """Self-Harmony: per answer, 2 p0 p1 / (p0 + p1) of its shares p0 among the original wording's
    samples and p1 among its rewrites' samples; an answer missing from either view scores 0."""
    views = [[p for p, v in zip(preds, variants) if (v == 0) == original] for original in (True, False)]
    if not all(views):
        return {}
    p0, p1 = (answer_scores(view) for view in views)
    return {a: 2 * p0[a] * p1[a] / (p0[a] + p1[a]) if a in p0 and a in p1 else 0.0
            for a in set(p0) | set(p1)}


def top_answer(scores: dict[str, float], gate: float, gate_scores: dict[str, float] | None = None) -> str | None:
    """The highest-scoring answer if it is unique and its gate score (its vote share unless given)
    reaches `gate`."""
    if not scores:
        return None
    (top, best), *rest = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))
    if best <= 0 or (rest and rest[0][1] == best):
        return None  # a tie has no majority
    if (gate_scores if gate_scores is not None else scores).get(top, 0.0) < gate:
        return None
    return top


def vote_label(preds: list[str | None], min_share: float) -> str | None:
    """Plurality answer of `preds` if it is unique and has at least `min_share` of all votes."""
    return top_answer(answer_scores(preds), min_share)


def uncertain_categories(tops: dict[str, str | None], category_of: dict[str, str | None], gate: float) -> set:
    """The categories where fewer than `gate` of the prompts (groups) have a label (`tops`: each one's
    label or None): the vote is not certain enough there for any of its labels to be trained on (CuMa's
    masking of prompts without a clear majority, at the level of a category; a category joins once the
    policy agrees with itself on enough of its problems). Reads only the votes and the question's category."""
    if gate <= 0:
        return set()
    labelled: dict = {}
    for k, top in tops.items():
        labelled.setdefault(category_of[k], []).append(top is not None)
    return {c for c, got in labelled.items() if sum(got) / len(got) < gate}


def _vote_by(key: str, share_reward: bool = False) -> Callable[[pd.DataFrame, JudgeConfig, JudgeContext], Verdicts]:
    """Vote judges over the samples sharing `key`: the label is the top answer (by vote share, by
    Self-Harmony's cross-view score for co_reward with cross_view harmonic, times the frozen judge's
    P(Yes) when on). The reward is 1 for agreeing with the label and 0 otherwise, or with
    `share_reward` (ScPO) the score of the sample's own answer; no label: no verdict."""
    def judge(samples: pd.DataFrame, cfg: JudgeConfig, ctx: JudgeContext) -> Verdicts:
        preds = [p if isinstance(p, str) else None for p in samples["pred"]]
        frozen = frozen_yes(samples, ctx) if cfg.frozen != FrozenJudge.none else None
        checked = inverse_checks(samples, key, ctx, cfg.max_new_tokens) if cfg.inverse else None
        harmonic = key == "group_id" and cfg.cross_view == CrossView.harmonic
        label = [None] * len(samples)
        reward: list[Optional[float]] = [None] * len(samples)
        penalised = [False] * len(samples)
        penalise = cfg.low_consensus == LowConsensus.penalise
        positions: dict[str, list[int]] = {}
        for i, k in enumerate(samples[key]):
            positions.setdefault(k, []).append(i)
        variants = list(samples["variant"]) if harmonic else None
        tops: dict[str, tuple[str | None, dict[str, float]]] = {}
        for k, idx in positions.items():
            ps = [preds[i] for i in idx]
            fz = [frozen[i] for i in idx] if frozen is not None else None
            shares = answer_scores(ps)
            scores = harmonic_scores(ps, [variants[i] for i in idx]) if harmonic else dict(shares)
            if fz is not None:
                weights = frozen_weights(ps, fz)
                scores = {a: s * weights.get(a, 0.0) for a, s in scores.items()}
            if checked is not None:  # self-verification: an answer whose inverse does not come back weighs less
                scores = {a: s * (cfg.inverse_weight if checked.get((k, a)) == 0.0 else 1.0)
                          for a, s in scores.items()}
            top = top_answer(scores, cfg.min_harmony) if harmonic else top_answer(scores, cfg.min_share, shares)
            tops[k] = (top, scores)
        cats = list(samples["category"]) if "category" in samples else [None] * len(samples)
        category_of = {k: category(cats[idx[0]]) for k, idx in positions.items()}
        masked = uncertain_categories({k: t for k, (t, _) in tops.items()}, category_of, cfg.category_gate)
        for k, idx in positions.items():
            top, scores = tops[k]
            if top is None or category_of[k] in masked:
                if penalise and top is None:  # RESTRAIN: a prompt without a trustworthy majority: every sample wrong
                    for i in idx:
                        reward[i], penalised[i] = 0.0, True
                continue
            for i in idx:
                p = preds[i]
                label[i] = top
                reward[i] = scores.get(p, 0.0) if share_reward else (1.0 if p == top else 0.0)
        return Verdicts(reward, label, penalised=penalised)

    return judge


# the vote judges of the judge table (self_improve/config/judges.py)
majority_vote = _vote_by("prompt_id")
co_reward = _vote_by("group_id")  # the views: the table's needs_rewrites
vote_share = _vote_by("prompt_id", share_reward=True)
