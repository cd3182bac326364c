"""Judge-quality measures, checked by hand on tiny examples: AUC, Kendall tau, CREAM consistency,
the reward-hacking alarm and the head-to-head win rate."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from stages.lib.quality import consistency_from_tau, kendall_tau, reward_hacking_alarm, roc_auc, win_rate


def test_roc_auc_by_hand():
    assert roc_auc([0.1, 0.2, 0.8, 0.9], [0, 0, 1, 1]) == 1.0
    assert roc_auc([0.9, 0.8, 0.2, 0.1], [0, 0, 1, 1]) == 0.0
    assert roc_auc([3, 3, 3, 3], [0, 1, 0, 1]) == 0.5
    # positives 0.35, 0.8 vs negatives 0.1, 0.4: 3 of 4 pairs ordered right
    assert roc_auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)


def test_roc_auc_drops_nulls_and_needs_both_classes():
    rewards = [0.1, None, 0.8, np.nan, 0.3, 5.0, pd.NA]
    correct = [0, 1, 1, 0, None, np.nan, 0]
    assert roc_auc(rewards, correct) == 1.0  # only rows 0 and 2 remain
    assert roc_auc(pd.Series([0.2, 0.9, None], dtype="Float64"), pd.Series([0, 1, 1], dtype="Float64")) == 1.0
    assert roc_auc([0.1, 0.9], [1, 1]) is None
    assert roc_auc([0.1, None], [0, 1]) is None
    assert roc_auc([], []) is None
    with pytest.raises(ValueError):
        roc_auc([0.1, 0.2], [0, 2])
    with pytest.raises(ValueError):
        roc_auc([0.1, 0.2], [0])


def test_kendall_tau_by_hand():
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # pairs (1,2) C, (1,3) C, (2,3) D -> (2 - 1) / 3
    assert kendall_tau([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3)
    # tau-b with a tie in a: 2 concordant, 0 discordant, 1 tie in a: 2 / sqrt((3 - 1) * 3)
    assert kendall_tau([1, 1, 2], [1, 2, 3]) == pytest.approx(2 / math.sqrt(6))
    assert kendall_tau([1, None, 2, 3], [1, 5, 2, np.nan]) == pytest.approx(1.0)


def test_kendall_tau_without_rank_information():
    assert kendall_tau([1], [1]) is None
    assert kendall_tau([], []) is None
    assert kendall_tau([2, 2, 2], [1, 2, 3]) is None
    assert kendall_tau([1, 2, None], [3, None, 4]) is None


def test_consistency_from_tau():
    assert consistency_from_tau(1.0) == 1.0
    assert consistency_from_tau(-1.0) == 0.0
    assert consistency_from_tau(0.0) == 0.5
    assert consistency_from_tau(0.5) == 0.75
    assert consistency_from_tau(None) == 0.5
    assert consistency_from_tau(float("nan")) == 0.5


def test_alarm_fires_when_reward_rises_and_judge_quality_falls():
    history = [
        {"iteration": "it0", "reward_mean": 0.50, "judge_auc": 0.82, "judge_accuracy": 0.75},
        {"iteration": "it1", "reward_mean": 0.55, "judge_auc": 0.83, "judge_accuracy": 0.76},
        {"iteration": "it2", "reward_mean": 0.61, "judge_auc": 0.80, "judge_accuracy": None},
        {"iteration": "it3", "reward_mean": 0.72, "judge_auc": 0.70, "judge_accuracy": 0.70},
    ]
    alarms = reward_hacking_alarm(history)
    assert alarms == [
        "it2: reward_mean rose 0.55 -> 0.61 while judge_auc fell 0.83 -> 0.80 (reward hacking?)",
        # judge_accuracy is compared with it1, the latest iteration that has it; keys in QUALITY_KEYS order
        "it3: reward_mean rose 0.55 -> 0.72 while judge_accuracy fell 0.76 -> 0.70 (reward hacking?)",
        "it3: reward_mean rose 0.61 -> 0.72 while judge_auc fell 0.80 -> 0.70 (reward hacking?)",
    ]


def test_alarm_fires_when_heldout_accuracy_falls():
    history = [{"iteration": 0, "reward_mean": 0.4, "accuracy": 0.60},
               {"iteration": 1, "reward_mean": 0.7, "accuracy": 0.52}]
    (alarm,) = reward_hacking_alarm(history)
    assert alarm.startswith("it1: reward_mean rose 0.40 -> 0.70 while accuracy fell 0.60 -> 0.52")


def test_alarm_quiet_when_healthy_or_within_tolerance_or_missing():
    healthy = [
        {"iteration": "it0", "reward_mean": 0.50, "judge_auc": 0.70, "accuracy": 0.50},
        {"iteration": "it1", "reward_mean": 0.60, "judge_auc": 0.75, "accuracy": 0.55},
        {"iteration": "it2", "reward_mean": 0.70, "judge_auc": 0.745, "accuracy": 0.55},  # flat within tol
        {"iteration": "it3", "reward_mean": 0.65, "judge_auc": 0.60, "accuracy": 0.40},  # both fell: no
    ]
    assert reward_hacking_alarm(healthy) == []
    missing = [
        {"iteration": "it0", "reward_mean": None, "judge_auc": 0.9},
        {"iteration": "it1", "reward_mean": 0.7, "judge_auc": None, "accuracy": float("nan")},
        {"iteration": "it2", "reward_mean": 0.9, "judge_auc": 0.5},
        {"iteration": "it3"},
    ]
    assert reward_hacking_alarm(missing) == []
    assert reward_hacking_alarm([]) == []
    noisy = [{"reward_mean": 0.50, "judge_auc": 0.80}, {"reward_mean": 0.55, "judge_auc": 0.795}]
    assert reward_hacking_alarm(noisy) == []
    assert reward_hacking_alarm(noisy, tol=0.001) == [
        "it1: reward_mean rose 0.50 -> 0.55 while judge_auc fell 0.8000 -> 0.7950 (reward hacking?)"
    ]


def test_win_rate_by_hand():
    new = [5, 3, 4, None, 2, 4.5]
    old = [4, 3, 5, 1, None, 2]
    # judged prompts 0, 1, 2, 5: win, tie, loss, win
    assert win_rate(new, old) == {"win_rate": 2.5 / 4, "judged": 4, "wins": 2, "ties": 1, "losses": 1}
    assert win_rate([None, 1], [2, None]) == {"win_rate": None, "judged": 0, "wins": 0, "ties": 0,
                                                 "losses": 0}
    with pytest.raises(ValueError):
        win_rate([1, 2], [1])


def _report(tmp_path, history, capsys):
    import json

    import yaml

    from stages import report

    from .conftest import TINY

    (tmp_path / "params.yaml").write_text(yaml.safe_dump(TINY))
    paths = []
    for step, m in enumerate(history):
        p = tmp_path / f"it{step}.json"
        p.write_text(json.dumps({"iteration": f"it{step}", "step": step, **m}))
        paths.append(str(p))
    report.main(["--params", str(tmp_path / "params.yaml"), "--metrics", *paths, "--summary",
                 str(tmp_path / "summary.md"), "--figures", str(tmp_path / "fig"), "--table", str(tmp_path / "t.csv")])
    return (tmp_path / "summary.md").read_text(), capsys.readouterr().out


def test_the_report_raises_the_alarm_for_a_hacked_history_and_only_then(tmp_path, capsys):
    base = {"accuracy": 0.4, "maj_accuracy": 0.4, "ttt_accuracy": 0.4}
    hacked = [base, {**base, "reward_mean": 0.5, "judge_auc": 0.80},
              {**base, "reward_mean": 0.7, "judge_auc": 0.70}, {**base, "reward_mean": 0.9, "judge_auc": 0.60}]
    (tmp_path / "a").mkdir()
    summary, out = _report(tmp_path / "a", hacked, capsys)
    assert "Reward-hacking alarm: FIRED" in summary
    assert "it2: reward_mean rose 0.50 -> 0.70 while judge_auc fell 0.80 -> 0.70" in summary
    # the last lines printed (what `dvc repro` ends on): the alarm and its two firings
    assert out.rstrip().splitlines()[-3:][0] == "REWARD-HACKING ALARM:"
    healthy = [base, {**base, "reward_mean": 0.5, "judge_auc": 0.70, "accuracy": 0.5},
               {**base, "reward_mean": 0.7, "judge_auc": 0.75, "accuracy": 0.6},
               {**base, "reward_mean": 0.9, "judge_auc": 0.80, "accuracy": 0.7}]
    (tmp_path / "b").mkdir()
    summary, out = _report(tmp_path / "b", healthy, capsys)
    assert "Reward-hacking alarm: quiet" in summary and "REWARD-HACKING ALARM" not in out
