"""B-STaR's balance score on known inputs, its choice, the dev subset, the refusals and the stage when off."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from self_improve import artifacts as art
from self_improve.bstar import balance, choose, dev_prompts, right
from self_improve.config import BstarLabels, ConfigError, parse_params
from stages import bstar as bstar_stage

from .conftest import ROOT


def _judged(rows: list[tuple]) -> pd.DataFrame:
    """(prompt_id, response, pred, reward, label, correct, valid) rows."""
    df = pd.DataFrame(rows, columns=["prompt_id", "response", "pred", "reward", "label", "correct", "valid"])
    df["reward"] = df["reward"].astype("Float64")
    df["correct"] = df["correct"].astype("Float64")
    df["valid"] = df["valid"].astype("boolean")
    return df


JUDGED = _judged([
    # p1: three distinct responses with reward 1 (two right by the verifier), one duplicate, one reward 0
    ("p1", "a=5", "5", 1.0, "5", 1.0, True),
    ("p1", "so 5", "5", 1.0, "5", 1.0, True),
    ("p1", "a=5", "5", 1.0, "5", 1.0, True),
    ("p1", "it is 5", "5", 1.0, "5", 0.0, True),
    ("p1", "7", "7", 0.0, "5", 0.0, True),
    # p2: nothing above 0.5; one sample the validity check rejected
    ("p2", "3", "3", 0.0, "4", 1.0, True),
    ("p2", "4", "4", 0.4, "4", 0.0, False),
])


def test_right_by_the_verifier_or_by_the_judges_pseudo_label():
    assert list(right(JUDGED, BstarLabels.verifier)) == [True, True, True, False, False, True, False]
    # the pseudo-label: the answer its vote gave; an invalid answer is never right
    assert list(right(JUDGED, BstarLabels.judge)) == [True, True, True, True, False, False, False]


def test_balance_score_by_hand():
    ok = right(JUDGED, BstarLabels.verifier)
    # threshold 0.5: p1 selects 3 distinct ("a=5", "so 5", "it is 5"), 2 right -> min(2/8, 1) * 2/3;
    # p2 selects nothing -> 0
    got = balance(JUDGED, ok, 0.5, n_star=8)
    assert got["balance"] == pytest.approx((2 / 8 * 2 / 3 + 0) / 2)
    assert got["selected"] == pytest.approx(1.5) and got["right"] == pytest.approx(1.0)
    # threshold 0: p1 selects 4 distinct (2 right), p2 2 distinct (1 right: "3")
    got = balance(JUDGED, ok, 0.0, n_star=2)
    assert got["balance"] == pytest.approx((min(2 / 2, 1) * 2 / 4 + min(1 / 2, 1) * 1 / 2) / 2)
    # the judge's own labels: p1's four distinct selected at 0.5 are all right
    assert balance(JUDGED, right(JUDGED, BstarLabels.judge), 0.5, n_star=4)["balance"] == pytest.approx(3 / 4 / 2)


def test_the_choice_is_the_highest_balance_then_the_lower_temperature_then_the_higher_threshold():
    grid = [{"temperature": t, "threshold": h, "balance": b}
            for t, h, b in [(0.5, 0.0, 0.2), (0.5, 1.0, 0.3), (0.9, 0.0, 0.3), (0.9, 1.0, 0.1)]]
    assert (choose(grid)["temperature"], choose(grid)["threshold"]) == (0.5, 1.0)
    grid[2]["balance"] = 0.31
    assert (choose(grid)["temperature"], choose(grid)["threshold"]) == (0.9, 0.0)


def test_the_dev_subset_takes_whole_groups_seeded():
    prompts = pd.DataFrame({"prompt_id": [f"p{i}" for i in range(12)],
                            "group_id": [f"g{i // 3}" for i in range(12)]})
    dev = dev_prompts(prompts, 2, seed=7)
    assert len(dev) == 6 and dev.groupby("group_id").size().eq(3).all()
    assert dev.equals(dev_prompts(prompts, 2, seed=7))
    assert len(dev_prompts(prompts, 10, seed=7)) == 12  # more than there are: all of them


@pytest.mark.parametrize("method", ["llm_judge", "self_certainty", "implicit_reward"])
def test_bstar_with_a_judge_that_runs_a_model_is_refused_naming_the_key(method):
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["sample"]["bstar"] = {"enabled": True}
    raw["judge"]["method"] = method
    with pytest.raises(ConfigError, match="sample.bstar.enabled"):
        parse_params(raw)


def test_a_bad_temperature_grid_is_refused_naming_the_key():
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["sample"]["bstar"] = {"enabled": True, "temperatures": [0.7, 0.0]}
    with pytest.raises(ConfigError, match="sample.bstar.temperatures"):
        parse_params(raw)


def test_off_the_stage_writes_the_params_own_choice_without_a_model(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text((ROOT / "params.yaml").read_text())
    out = tmp_path / "bstar.json"
    bstar_stage.main(["--iteration", "it1", "--prompts", str(tmp_path / "absent.parquet"),
                      "--model", str(tmp_path / "no-model"), "--out", str(out), "--params", str(params)])
    assert art.read_json(out) == {"enabled": False, "temperature": 0.7, "threshold": 1.0}
