"""Self-Evolving Curriculum (SEC, Chen et al. 2025): a non-stationary bandit over prompt categories.

Which categories should the next iteration's prompts come from? SEC treats each category as an arm of
a multi-armed bandit whose reward is the learning signal the category gave in the last iteration:
the mean absolute advantage of its samples, where a sample's advantage is its reward minus the mean
reward of the samples of the same prompt. A category whose prompts are all solved (or all failed)
gives advantage 0 and nothing to learn from; one with mixed outcomes gives a large |advantage|.

- value update, TD(0) with a constant step (so old iterations fade: the arms are non-stationary):
  ``Q_c <- Q_c + alpha * (r_c - Q_c)`` for the categories observed this iteration, others unchanged;
- sampling: softmax with temperature tau, ``p_c = exp(Q_c / tau) / sum_c' exp(Q_c' / tau)``.

The state is a small JSON file with sorted keys, so the same run writes byte-identical files.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import pandas as pd

from self_improve.errors import ArtifactError, ConfigError

NO_CATEGORY = "(none)"  # the arm of prompts whose category is null


def _check_params(alpha: float, temperature: float) -> None:
    if not (isinstance(alpha, (int, float)) and 0.0 < alpha <= 1.0):
        raise ConfigError(f"curriculum alpha must be in (0, 1], got {alpha!r}")
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0.0):
        raise ConfigError(f"curriculum temperature must be a positive number, got {temperature!r}")


@dataclass(frozen=True)
class BanditState:
    """Q value per category, the TD step size `alpha` and the softmax `temperature`."""

    q: dict[str, float] = field(default_factory=dict)
    alpha: float = 0.5
    temperature: float = 0.2

    def __post_init__(self) -> None:
        _check_params(self.alpha, self.temperature)
        for c, v in self.q.items():
            if not isinstance(c, str) or not math.isfinite(v):
                raise ConfigError(f"curriculum: bad Q value {v!r} for category {c!r}")
        object.__setattr__(self, "q", {c: float(self.q[c]) for c in sorted(self.q)})

    def to_json(self) -> str:
        """Indented JSON with sorted keys and a final newline: the same state gives the same bytes."""
        body = {"alpha": float(self.alpha), "q": self.q, "temperature": float(self.temperature)}
        return json.dumps(body, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str = "bandit state") -> BanditState:
        """Parse `to_json` output; `source` (the file) is named in the error if it is malformed."""
        try:
            body: Any = json.loads(text)
            if not isinstance(body, dict) or set(body) != {"alpha", "q", "temperature"}:
                raise ValueError("expected the keys alpha, q, temperature")
            if not isinstance(body["q"], dict):
                raise ValueError("q must be an object")
            return cls(q={str(k): float(v) for k, v in body["q"].items()},
                       alpha=float(body["alpha"]), temperature=float(body["temperature"]))
        except (ValueError, TypeError) as e:
            raise ArtifactError(f"{source}: malformed bandit state: {' '.join(str(e).split())}") from None


def initial_state(categories: Iterable[str], alpha: float = 0.5, temperature: float = 0.2) -> BanditState:
    """Q = 0 for every (distinct) category: a uniform first allocation."""
    cats = sorted(set(categories))
    if not cats:
        raise ConfigError("curriculum: no categories")
    return BanditState(q={c: 0.0 for c in cats}, alpha=alpha, temperature=temperature)


def update(state: BanditState, rewards: Mapping[str, float]) -> BanditState:
    """TD(0): move each observed category's Q a step `alpha` toward its reward; the rest stay as they are.

    A category not yet in the state joins with Q = 0 before its update.
    """
    q = dict(state.q)
    for c, r in rewards.items():
        r = float(r)
        if not math.isfinite(r):
            raise ValueError(f"curriculum: reward of category {c!r} is {r}")
        old = q.get(c, 0.0)
        q[c] = old + state.alpha * (r - old)
    return BanditState(q=q, alpha=state.alpha, temperature=state.temperature)


def probabilities(state: BanditState) -> dict[str, float]:
    """Softmax of Q / temperature, by category in sorted order (max subtracted: no overflow)."""
    if not state.q:
        raise ConfigError("curriculum: no categories")
    top = max(state.q.values())
    weights = {c: math.exp((v - top) / state.temperature) for c, v in state.q.items()}
    total = sum(weights.values())  # >= 1: the best arm has weight exp(0)
    return {c: w / total for c, w in weights.items()}


def allocate(state: BanditState, n: int, rng: random.Random) -> dict[str, int]:
    """How many of the next `n` prompts come from each category: n independent softmax draws.

    Every category is in the result (possibly with 0); the same state and rng seed give the same counts.
    """
    if n < 0:
        raise ConfigError(f"curriculum: cannot allocate {n} prompts")
    probs = probabilities(state)
    cats = list(probs)
    counts = {c: 0 for c in cats}
    if n:
        for c in rng.choices(cats, weights=[probs[c] for c in cats], k=n):
            counts[c] += 1
    return counts


def category_rewards(df: pd.DataFrame) -> dict[str, float]:
    """Mean |advantage| per category over scored samples (reward not null).

    A sample's advantage is its reward minus the mean reward of the scored samples of its prompt
    (`prompt_id`); a null category counts as NO_CATEGORY. Categories without a scored sample are absent.
    """
    missing = [c for c in ("prompt_id", "category", "reward") if c not in df.columns]
    if missing:
        raise ArtifactError(f"category_rewards: samples lack column(s) {', '.join(missing)}")
    scored = df.loc[df["reward"].notna(), ["prompt_id", "category", "reward"]].copy()
    if scored.empty:
        return {}
    scored["reward"] = scored["reward"].astype(float)
    baseline = scored.groupby("prompt_id", sort=False)["reward"].transform("mean")
    scored["abs_adv"] = (scored["reward"] - baseline).abs()
    scored["category"] = scored["category"].astype(object).where(scored["category"].notna(), NO_CATEGORY)
    means = scored.groupby("category", sort=True)["abs_adv"].mean()
    return {str(c): float(v) for c, v in means.items()}
