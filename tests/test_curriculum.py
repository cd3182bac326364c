"""The SEC bandit over prompt categories: TD(0) values, softmax allocation, |advantage| rewards."""

from __future__ import annotations

import math
import random

import pandas as pd
import pytest

from self_improve.curriculum import (
    NO_CATEGORY,
    BanditState,
    allocate,
    category_rewards,
    initial_state,
    probabilities,
    update,
)
from self_improve.errors import ArtifactError, ConfigError


def test_initial_state_is_uniform():
    state = initial_state(["list", "explain", "list", "howto"])
    assert state.q == {"explain": 0.0, "howto": 0.0, "list": 0.0}
    assert (state.alpha, state.temperature) == (0.5, 0.2)
    assert probabilities(state) == pytest.approx({"explain": 1 / 3, "howto": 1 / 3, "list": 1 / 3})
    with pytest.raises(ConfigError):
        initial_state([])


def test_td0_update_by_hand():
    state = BanditState(q={"a": 0.2, "b": 0.4, "c": 0.1}, alpha=0.25, temperature=1.0)
    new = update(state, {"a": 0.6, "b": 0.0})
    assert new.q == pytest.approx({"a": 0.2 + 0.25 * 0.4, "b": 0.4 - 0.25 * 0.4, "c": 0.1})  # c unobserved
    assert state.q["a"] == 0.2  # the old state is unchanged
    assert update(new, {"d": 0.8}).q["d"] == pytest.approx(0.2)  # a new category starts at 0


def test_softmax_by_hand_and_stable_for_large_values():
    probs = probabilities(BanditState(q={"a": 0.0, "b": math.log(3) * 0.5}, alpha=0.5, temperature=0.5))
    assert probs == pytest.approx({"a": 0.25, "b": 0.75})
    huge = probabilities(BanditState(q={"a": 1000.0, "b": 999.0}, alpha=0.5, temperature=0.01))
    assert huge["a"] == pytest.approx(1.0) and math.isfinite(huge["b"])


def test_probability_shifts_toward_the_category_with_larger_advantages():
    state = initial_state(["easy", "mixed", "hard"])
    seen = [probabilities(state)["mixed"]]
    for _ in range(5):
        state = update(state, {"easy": 0.02, "mixed": 0.45, "hard": 0.05})
        seen.append(probabilities(state)["mixed"])
    assert all(b > a for a, b in zip(seen, seen[1:])), seen
    assert seen[-1] > 0.7
    counts = allocate(state, 200, random.Random(0))
    assert counts["mixed"] == max(counts.values())


def test_json_round_trip_is_byte_identical(tmp_path):
    state = update(initial_state(["b", "a", "c"], alpha=0.3, temperature=0.7), {"c": 0.123456789, "a": 0.1})
    text = state.to_json()
    back = BanditState.from_json(text)
    assert back == state and back.to_json() == text
    path = tmp_path / "bandit.json"
    path.write_text(text)
    assert BanditState.from_json(path.read_text()).to_json().encode() == path.read_bytes()
    # the key order of the input does not matter
    same = BanditState(q={"c": state.q["c"], "a": state.q["a"], "b": 0.0}, alpha=0.3, temperature=0.7)
    assert same.to_json() == text
    with pytest.raises(ArtifactError, match="bandit.json"):
        BanditState.from_json('{"q": {}}', source="bandit.json")


def test_bad_parameters_raise():
    with pytest.raises(ConfigError, match="alpha"):
        initial_state(["a"], alpha=0.0)
    with pytest.raises(ConfigError, match="temperature"):
        initial_state(["a"], temperature=0.0)


def test_allocate_is_deterministic_and_sums_to_n():
    state = BanditState(q={"a": 0.1, "b": 0.3, "c": 0.0}, alpha=0.5, temperature=0.2)
    first = allocate(state, 37, random.Random(7))
    assert first == allocate(state, 37, random.Random(7))
    assert sum(first.values()) == 37 and list(first) == ["a", "b", "c"]
    assert allocate(state, 0, random.Random(7)) == {"a": 0, "b": 0, "c": 0}
    with pytest.raises(ConfigError):
        allocate(state, -1, random.Random(7))


def test_category_rewards_by_hand():
    df = pd.DataFrame(
        {
            "prompt_id": ["p1", "p1", "p1", "p2", "p2", "p3", "p3", "p4", "p4"],
            "category": ["x", "x", "x", "x", "x", "y", "y", None, None],
            "reward": [1.0, 0.0, None, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0],
        }
    )
    # p1 scored [1, 0]: mean 0.5, |adv| 0.5, 0.5 (the null sample ignored); p2 all equal: 0, 0
    # p3 all equal: 0, 0; p4 [1, 0] with no category: 0.5, 0.5
    assert category_rewards(df) == pytest.approx({"x": 0.25, "y": 0.0, NO_CATEGORY: 0.5})
    none_scored = df.assign(reward=[None] * len(df))
    assert category_rewards(none_scored) == {}
    with pytest.raises(ArtifactError, match="reward"):
        category_rewards(df.drop(columns="reward"))
