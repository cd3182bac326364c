"""How far a self-reward can be trusted, and whether the loop is gaming it.

A self-rewarding loop optimises its own judge's score, so the score rising proves nothing by itself.
These measures put it next to evidence that does not come from the judge:

- ``roc_auc``: does the reward rank correct samples above wrong ones (ground truth where it exists)?
  Threshold-free, unlike judge_accuracy, so it also works for graded 0-5 rubric scores.
- ``kendall_tau`` / ``consistency_from_tau``: CREAM (Wang et al. 2024) measures how consistently two
  model iterations rank the same responses, C = (tau + 1) / 2, and uses it to down-weight the
  preference pairs of an inconsistent judge.
- ``reward_hacking_alarm``: the self-reward rising while the policy's true quality falls, or the judge's
  quality falling two iterations running, held-out accuracy below it0's, or, without labels, the
  frozen judge disagreeing with the self-reward and the invalid share rising, each beyond its sampling
  noise (``binomial_se``, ``cluster_se``, ``auc_se``, the paired interval of ``paired_gain``).
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


def binomial_se(p: float | None, n: int | None) -> float | None:
    """Standard error of a share `p` of `n` independent items (None without data)."""
    if p is None or not n:
        return None
    return math.sqrt(max(p * (1 - p), 0.0) / n)


def paired_gain(before: Iterable[Any], after: Iterable[Any], *, n_boot: int = 2000, level: float = 0.95,
                seed: int = 0) -> dict[str, float] | None:
    """Gain in accuracy from `before` to `after`, the same problems scored 1/0 in the same order, with
    a paired bootstrap interval: problems are resampled with replacement and each resample's mean
    difference taken, so what the two runs share (a problem's difficulty) cancels. Seeded: the same
    inputs give the same interval. None without problems scored in both."""
    x, y = _paired(before, after)
    if len(x) == 0:
        return None
    diff = y - x
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(diff), size=(n_boot, len(diff)))].mean(axis=1)
    tail = (1 - level) / 2
    lo, hi = np.quantile(means, [tail, 1 - tail])
    return {"gain": float(diff.mean()), "lo": float(lo), "hi": float(hi), "n": int(len(diff))}


def cluster_se(values: Iterable[Any], groups: Iterable[Any]) -> float | None:
    """Standard error of the mean of `values` when items of one group (a problem's k samples and its
    rewrites) are not independent: the spread of the group means over the number of groups. None
    with fewer than two groups."""
    df = pd.DataFrame({"v": _floats(values), "g": list(groups)}).dropna(subset=["v"])
    means = df.groupby("g")["v"].mean()
    if len(means) < 2:
        return None
    return float(means.std(ddof=1) / math.sqrt(len(means)))


def auc_se(rewards: Iterable[Any], correct: Iterable[Any], groups: Iterable[Any], *, n_boot: int = 200,
           seed: int = 0) -> float | None:
    """Bootstrap standard error of roc_auc, resampling whole groups (a problem with its samples),
    seeded so the same inputs give the same figure. None when the AUC itself is None."""
    from scipy.stats import rankdata

    df = pd.DataFrame({"r": _floats(rewards), "c": _floats(correct), "g": list(groups)}).dropna(subset=["r", "c"])
    if df["c"].nunique() < 2:
        return None
    codes, uniques = pd.factorize(df["g"])
    members = [np.flatnonzero(codes == i) for i in range(len(uniques))]
    r, c = df["r"].to_numpy(), df["c"].to_numpy()
    rng = np.random.default_rng(seed)
    aucs = []
    for _ in range(n_boot):
        idx = np.concatenate([members[i] for i in rng.integers(0, len(members), len(members))])
        cc = c[idx]
        pos = int(cc.sum())
        neg = len(cc) - pos
        if pos == 0 or neg == 0:
            continue
        ranks = rankdata(r[idx])
        aucs.append((ranks[cc == 1].sum() - pos * (pos + 1) / 2) / (pos * neg))
    return float(np.std(aucs, ddof=1)) if len(aucs) >= 2 else None


# (measure, its standard-error key) the alarm reads; the policy's true quality and the judge's
POLICY_KEYS = (("sample_accuracy", "sample_accuracy_se"), ("accuracy", "accuracy_se"))
JUDGE_KEYS = (("judge_auc", "judge_auc_se"), ("judge_accuracy", "judge_accuracy_se"))


def _with_se(row: dict, key: str, se_key: str) -> tuple[float, float] | None:
    value, se = _value(row.get(key)), _value(row.get(se_key))
    return None if value is None or se is None else (value, se)


def reward_hacking_alarm(history: Sequence[dict], *, z: float = 2.0) -> list[str]:
    """One message per (iteration, test) that fired; empty: healthy, or not enough data to tell.

    `history` holds one dict per iteration, in order: reward_mean and, each with its standard error
    (`<key>_se`, see evaluate), the policy's true quality (sample_accuracy: its own samples judged by
    the verifier; accuracy: held-out) and the judge's quality (judge_auc, judge_accuracy). A change
    counts only beyond noise: more than `z` standard errors of the difference,
    sqrt(se_a^2 + se_b^2). Five tests:

    - policy: reward_mean rose while sample_accuracy or held-out accuracy fell beyond noise, against
      the latest earlier iteration that has the measure (held-out accuracy: it0 counts).
    - judge: the judge's quality fell two iterations running, and over those two iterations beyond
      noise (a one-iteration dip is within what a loop does), unless the policy improved over the
      same iterations: its sample accuracy rose beyond noise and its held-out accuracy did not fall
      beyond noise (a judge whose policy improves has fewer wrong samples left to tell apart; that
      alone is no alarm, but a policy that gets its own prompts right more often while it gets
      worse on held-out problems is no excuse).
    - held-out: an iteration's held-out accuracy below it0's beyond noise: its paired 95% interval
      (`accuracy_gain_hi`, the same problems at it0 and here) below 0, or without one, a fall of more
      than `z` s.e. of the difference. Tested from it1 on, whatever the self-reward did.
    - frozen: reward_mean rose while the frozen judge's mean P(Yes) on the policy's samples
      (`frozen_yes`) fell beyond noise: the self-judge likes what the base model does not.
    - invalid: the share of samples the validity check rejects (`invalid_share`) rose beyond noise
      over the first iteration that measured it: the policy learning to restate or miscalculate.

    A value without its standard error is never tested (metrics of older runs).
    """
    labels = [_label(row, i) for i, row in enumerate(history)]
    rewards = [_value(row.get("reward_mean")) for row in history]
    alarms = (_policy_alarms(history, labels, rewards, z) + _heldout_alarms(history, labels, z)
              + _frozen_alarms(history, labels, rewards, z) + _invalid_alarms(history, labels, z)
              + _judge_alarms(history, labels, z))
    order = {label: i for i, label in enumerate(labels)}
    return sorted(alarms, key=lambda m: order.get(m.split(":", 1)[0], 0))


def _policy_alarms(history: Sequence[dict], labels: list[str], rewards: list, z: float) -> list[str]:
    """reward_mean rose while a policy measure (POLICY_KEYS) fell beyond noise since the latest earlier
    iteration that has it."""
    alarms = []
    for key, se_key in POLICY_KEYS:
        last: tuple[int, float, float] | None = None  # (position, value, se)
        for i, row in enumerate(history):
            got = _with_se(row, key, se_key)
            if got is None:
                continue
            if last is not None and rewards[i] is not None:
                j, old, old_se = last
                prev_reward = rewards[j] if rewards[j] is not None else next(
                    (rw for rw in reversed(rewards[:i]) if rw is not None), None)
                bound = z * math.hypot(old_se, got[1])
                if prev_reward is not None and rewards[i] > prev_reward and old - got[0] > bound:
                    alarms.append(
                        f"{labels[i]}: reward_mean rose {_fmt(prev_reward, rewards[i])} while {key} fell "
                        f"{_fmt(old, got[0])} ({got[0] - old:+.3f}, beyond {z:g} s.e. of the difference "
                        f"= {bound:.3f}) (reward hacking?)")
            last = (i, *got)
    return alarms


def _heldout_alarms(history: Sequence[dict], labels: list[str], z: float) -> list[str]:
    """Held-out accuracy below it0's: by its paired interval, else by more than `z` s.e. of the difference."""
    alarms = []
    heldout = [_with_se(row, "accuracy", "accuracy_se") for row in history]
    base = heldout[0] if history and _label(history[0], 0) == "it0" else None
    for i, row in enumerate(history[1:], 1):
        hi, gain = _value(row.get("accuracy_gain_hi")), _value(row.get("accuracy_gain"))
        if hi is not None and gain is not None:
            if hi < 0:
                alarms.append(f"{labels[i]}: held-out accuracy fell {gain:+.3f} below it0's, paired 95% interval "
                              f"[{_value(row.get('accuracy_gain_lo')):+.3f}, {hi:+.3f}] (policy degrading)")
        elif base is not None and heldout[i] is not None:
            bound = z * math.hypot(base[1], heldout[i][1])
            if base[0] - heldout[i][0] > bound:
                alarms.append(f"{labels[i]}: held-out accuracy fell {_fmt(base[0], heldout[i][0])} below it0's "
                              f"({heldout[i][0] - base[0]:+.3f}, beyond {z:g} s.e. of the difference = "
                              f"{bound:.3f}) (policy degrading)")
    return alarms


def _frozen_alarms(history: Sequence[dict], labels: list[str], rewards: list, z: float) -> list[str]:
    """reward_mean rose while the frozen judge's P(Yes) on the policy's samples fell beyond noise."""
    alarms = []
    frozen = [(i, got) for i, row in enumerate(history) if (got := _with_se(row, "frozen_yes", "frozen_yes_se"))]
    for (h, (a, a_se)), (i, (b, b_se)) in zip(frozen, frozen[1:]):
        bound = z * math.hypot(a_se, b_se)
        if rewards[h] is not None and rewards[i] is not None and rewards[i] > rewards[h] and a - b > bound:
            alarms.append(f"{labels[i]}: reward_mean rose {_fmt(rewards[h], rewards[i])} while the frozen judge's "
                          f"P(Yes) fell {_fmt(a, b)} ({b - a:+.3f}, beyond {z:g} s.e. of the difference = "
                          f"{bound:.3f}) (self-judge drifting from the frozen one?)")
    return alarms


def _invalid_alarms(history: Sequence[dict], labels: list[str], z: float) -> list[str]:
    """The share of invalid samples rose beyond noise over the first iteration that measured it."""
    alarms = []
    invalid = [(i, got) for i, row in enumerate(history) if (got := _with_se(row, "invalid_share", "invalid_share_se"))]
    for i, (b, b_se) in invalid[1:]:
        h, (a, a_se) = invalid[0]
        bound = z * math.hypot(a_se, b_se)
        if b - a > bound:
            alarms.append(f"{labels[i]}: invalid_share rose {_fmt(a, b)} since {labels[h]} (+{b - a:.3f}, beyond "
                          f"{z:g} s.e. of the difference = {bound:.3f}) (restating or miscalculating?)")
    return alarms


def _judge_alarms(history: Sequence[dict], labels: list[str], z: float) -> list[str]:
    """A judge measure (JUDGE_KEYS) fell two iterations running and beyond noise over the two, unless
    the policy improved meanwhile (sample accuracy up beyond noise, held-out accuracy not down beyond it)."""
    policy = [_with_se(row, "sample_accuracy", "sample_accuracy_se") for row in history]
    heldout = [_with_se(row, "accuracy", "accuracy_se") for row in history]

    def beyond(series: list, h: int, i: int) -> float | None:
        """series[i] - series[h] in units of z s.e. of the difference (> 1: a rise beyond noise)."""
        if series[h] is None or series[i] is None:
            return None
        return (series[i][0] - series[h][0]) / (z * math.hypot(series[h][1], series[i][1]) or 1e-12)

    alarms = []
    for key, se_key in JUDGE_KEYS:
        seen = [(i, *got) for i, row in enumerate(history) if (got := _with_se(row, key, se_key))]
        for (h, a, a_se), (_, b, _), (i, c, c_se) in zip(seen, seen[1:], seen[2:]):
            bound = z * math.hypot(a_se, c_se)
            if not (a > b > c and a - c > bound):
                continue
            # a judge loses some discrimination as its policy's samples get better (fewer wrong ones
            # left to tell apart): that is no alarm while the policy's own accuracy rose beyond noise
            # and its held-out accuracy did not fall beyond noise
            rose, held = beyond(policy, h, i), beyond(heldout, h, i)
            if rose is not None and rose > 1 and (held is None or held >= -1):
                continue
            why = ("sample_accuracy did not rise beyond its noise" if rose is None or rose <= 1 else
                   f"held-out accuracy fell {heldout[h][0]:.3f} -> {heldout[i][0]:.3f} beyond its noise")
            alarms.append(
                f"{labels[i]}: {key} fell two iterations running {a:.2f} -> {b:.2f} -> {c:.2f} "
                f"({c - a:+.3f}, beyond {z:g} s.e. of the difference = {bound:.3f}) while {why} "
                f"(judge degrading?)")
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
