"""How far a self-reward can be trusted, and whether the loop is gaming it.

A self-rewarding loop optimises its own judge's score, so the score rising proves nothing by itself.
These measures put it next to evidence that does not come from the judge:

- ``roc_auc``: does the reward rank correct samples above wrong ones (ground truth where it exists)?
  Threshold-free, unlike judge_accuracy, so it also works for graded 0-5 rubric scores.
- ``kendall_tau`` / ``consistency_from_tau``: CREAM (Wang et al. 2024) measures how consistently two
  model iterations rank the same responses, C = (tau + 1) / 2, and uses it to down-weight the
  preference pairs of an inconsistent judge.
- ``reward_hacking_alarm``: the self-reward rising while judge quality or held-out accuracy falls.
- ``win_rate``: per instruction prompt, the judge's score of the new model's response against the
  previous model's.

Missing values (None, NaN, pd.NA) are dropped, never read as 0; a measure without enough data is None.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

QUALITY_KEYS = ("judge_accuracy", "judge_auc", "accuracy")


def _floats(values: Iterable[Any]) -> np.ndarray:
    """Float array with NaN for every missing value (None, NaN, pd.NA)."""
    return np.asarray(pd.array(list(values), dtype="Float64").to_numpy(dtype=float, na_value=np.nan))


def _paired(a: Iterable[Any], b: Iterable[Any]) -> tuple[np.ndarray, np.ndarray]:
    x, y = _floats(a), _floats(b)
    if len(x) != len(y):
        raise ValueError(f"length mismatch: {len(x)} vs {len(y)}")
    keep = ~(np.isnan(x) | np.isnan(y))
    return x[keep], y[keep]


def _value(v: Any) -> float | None:
    if v is None or v is pd.NA:
        return None
    v = float(v)
    return None if math.isnan(v) else v


def roc_auc(rewards: Iterable[Any], correct: Iterable[Any]) -> float | None:
    """ROC AUC of `rewards` against binary `correct` (0/1) over rows where both are present.

    1.0: every correct sample outranks every wrong one; 0.5: no information (or all tied); None when
    either class is absent.
    """
    r, c = _paired(rewards, correct)
    if not np.isin(c, (0.0, 1.0)).all():
        raise ValueError("correct must be 0 or 1 (or missing)")
    if (c == 1).sum() < 1 or (c == 0).sum() < 1:
        return None
    from sklearn.metrics import roc_auc_score  # imported when used: a second of start-up otherwise

    return float(roc_auc_score(c.astype(int), r))


def kendall_tau(a: Iterable[Any], b: Iterable[Any]) -> float | None:
    """Kendall tau-b between two scorings of the same items (pairs with a missing score dropped).

    None with fewer than 2 items or when either scoring is constant (no rank information).
    """
    x, y = _paired(a, b)
    if len(x) < 2 or len(np.unique(x)) < 2 or len(np.unique(y)) < 2:
        return None
    from scipy.stats import kendalltau

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tau = kendalltau(x, y, variant="b").statistic
    return None if tau is None or math.isnan(tau) else float(tau)


def consistency_from_tau(tau: float | None) -> float:
    """CREAM's consistency C = (tau + 1) / 2 in [0, 1]; 0.5 when tau is unknown."""
    if tau is None or math.isnan(tau):
        return 0.5
    return (float(tau) + 1.0) / 2.0


def _fmt(old: float, new: float) -> str:
    a, b = f"{old:.2f}", f"{new:.2f}"
    if a == b:
        a, b = f"{old:.4f}", f"{new:.4f}"
    return f"{a} -> {b}"


def _label(row: dict, position: int) -> str:
    it = row.get("iteration")
    if it is None:
        return f"it{position}"
    return f"it{it}" if isinstance(it, (int, np.integer)) else str(it)


def reward_hacking_alarm(history: Sequence[dict], *, tol: float = 0.01) -> list[str]:
    """One message per (iteration, quality measure) where reward_mean rose while that measure fell.

    `history` holds one dict per iteration, in order, with optional float-or-None keys reward_mean,
    judge_accuracy, judge_auc and accuracy (held-out). Each iteration is compared, per quality measure,
    with the latest earlier iteration that has both reward_mean and that measure; a change counts only
    when it exceeds `tol`. Missing values never fire. Empty list: healthy (or not enough data).
    """
    alarms: list[str] = []
    last: dict[str, tuple[float, float]] = {}  # quality key -> (reward_mean, quality) of the latest
    for position, row in enumerate(history):
        reward = _value(row.get("reward_mean"))
        if reward is None:
            continue
        for key in QUALITY_KEYS:
            quality = _value(row.get(key))
            if quality is None:
                continue
            if key in last:
                prev_reward, prev_quality = last[key]
                if reward - prev_reward > tol and prev_quality - quality > tol:
                    alarms.append(
                        f"{_label(row, position)}: reward_mean rose {_fmt(prev_reward, reward)} while "
                        f"{key} fell {_fmt(prev_quality, quality)} (reward hacking?)"
                    )
            last[key] = (reward, quality)
    return alarms


def win_rate(new_scores: Sequence[Any], old_scores: Sequence[Any]) -> dict[str, float | int | None]:
    """Head-to-head of the new model against the previous one, prompt by prompt.

    Win 1, tie 0.5, loss 0, over prompts where both responses were judged; win_rate is None when none was.
    """
    new, old = _paired(new_scores, old_scores)
    wins, ties = int((new > old).sum()), int((new == old).sum())
    judged = len(new)
    return {
        "win_rate": (wins + 0.5 * ties) / judged if judged else None,
        "judged": judged,
        "wins": wins,
        "ties": ties,
        "losses": judged - wins - ties,
    }
