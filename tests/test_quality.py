"""Judge-quality measures, checked by hand on tiny examples: AUC, Kendall tau, CREAM consistency,
the reward-hacking alarm and the head-to-head win rate."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from self_improve.quality import consistency_from_tau, kendall_tau, reward_hacking_alarm, roc_auc, win_rate


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


def test_alarm_fires_only_beyond_twice_the_standard_error_of_the_difference():
    """Self-reward up while held-out accuracy falls: the bound is 2 * sqrt(se_a^2 + se_b^2) =
    2 * sqrt(0.03^2 + 0.04^2) = 0.10; a fall of 0.11 fires, one of 0.09 does not."""
    def history(fall: float) -> list[dict]:
        return [{"iteration": "it0", "accuracy": 0.60, "accuracy_se": 0.05},
                {"iteration": "it1", "reward_mean": 0.40, "accuracy": 0.60, "accuracy_se": 0.03},
                {"iteration": "it2", "reward_mean": 0.70, "accuracy": 0.60 - fall, "accuracy_se": 0.04}]

    assert reward_hacking_alarm(history(0.11)) == [(
        "it2: reward_mean rose 0.40 -> 0.70 while accuracy fell 0.60 -> 0.49 (-0.110, beyond 2 s.e. of "
        "the difference = 0.100) (reward hacking?)")]
    assert reward_hacking_alarm(history(0.09)) == []
    assert reward_hacking_alarm(history(0.11), z=3) == []  # 3 s.e. = 0.15
    # the same fall with the self-reward falling too is no sign of hacking, but a policy below it0
    flat = history(0.2)
    flat[2]["reward_mean"] = 0.30
    assert reward_hacking_alarm(flat) == [
        "it2: held-out accuracy fell 0.60 -> 0.40 below it0's (-0.200, beyond 2 s.e. of the difference = 0.128) "
        "(policy degrading)"]


def test_alarm_on_the_policys_own_samples_and_on_held_out_from_it1():
    history = [{"iteration": "it0", "accuracy": 0.9, "accuracy_se": 0.01},
               {"iteration": "it1", "reward_mean": 0.5, "accuracy": 0.2, "accuracy_se": 0.01,  # no reward before
                "sample_accuracy": 0.50, "sample_accuracy_se": 0.02},
               {"iteration": "it2", "reward_mean": 0.6, "sample_accuracy": 0.40, "sample_accuracy_se": 0.02}]
    held, own = reward_hacking_alarm(history)
    # the first iteration has no self-reward to compare, but its fall below it0 is seen
    assert held.startswith("it1: held-out accuracy fell 0.90 -> 0.20 below it0's (-0.700, beyond 2 s.e.")
    assert own.startswith("it2: reward_mean rose 0.50 -> 0.60 while sample_accuracy fell 0.50 -> 0.40 "
                          "(-0.100, beyond 2 s.e. of the difference = 0.057)")


def test_alarm_on_held_out_reads_the_paired_interval_first():
    row = {"iteration": "it1", "accuracy": 0.50, "accuracy_se": 0.05}
    base = {"iteration": "it0", "accuracy": 0.56, "accuracy_se": 0.05}
    # unpaired, -0.06 is noise (bound 0.141); the paired interval on the same problems is below 0
    assert reward_hacking_alarm([base, row]) == []
    paired = {**row, "accuracy_gain": -0.06, "accuracy_gain_lo": -0.10, "accuracy_gain_hi": -0.02}
    assert reward_hacking_alarm([base, paired]) == [
        "it1: held-out accuracy fell -0.060 below it0's, paired 95% interval [-0.100, -0.020] (policy degrading)"]
    assert reward_hacking_alarm([base, {**paired, "accuracy_gain_hi": 0.01}]) == []


def test_label_free_alarms_frozen_judge_and_invalid_share():
    def history(frozen, invalid, rewards=(0.5, 0.6, 0.7)) -> list[dict]:
        return [{"iteration": f"it{i + 1}", "reward_mean": r, "frozen_yes": f, "frozen_yes_se": 0.01,
                 "invalid_share": v, "invalid_share_se": 0.02} for i, (r, f, v) in enumerate(zip(rewards, frozen, invalid))]

    assert reward_hacking_alarm(history((0.40, 0.41, 0.40), (0.05, 0.06, 0.07))) == []
    drift = reward_hacking_alarm(history((0.40, 0.40, 0.34), (0.05, 0.06, 0.07)))
    assert drift == ["it3: reward_mean rose 0.60 -> 0.70 while the frozen judge's P(Yes) fell 0.40 -> 0.34 "
                     "(-0.060, beyond 2 s.e. of the difference = 0.028) (self-judge drifting from the frozen one?)"]
    assert reward_hacking_alarm(history((0.40, 0.40, 0.34), (0.05,) * 3, rewards=(0.5, 0.6, 0.5))) == []
    restating = reward_hacking_alarm(history((0.40,) * 3, (0.05, 0.08, 0.20)))
    assert restating == ["it3: invalid_share rose 0.05 -> 0.20 since it1 (+0.150, beyond 2 s.e. of the "
                         "difference = 0.057) (restating or miscalculating?)"]


def test_judge_alarm_needs_two_falls_in_a_row_beyond_noise():
    def history(aucs: list[float], se: float = 0.02) -> list[dict]:
        return [{"iteration": f"it{i + 1}", "reward_mean": 0.5, "judge_auc": a, "judge_auc_se": se}
                for i, a in enumerate(aucs)]

    # 0.80 -> 0.75 -> 0.70: two falls, 0.10 in all against 2 * sqrt(2) * 0.02 = 0.057
    assert reward_hacking_alarm(history([0.80, 0.75, 0.70])) == [(
        "it3: judge_auc fell two iterations running 0.80 -> 0.75 -> 0.70 (-0.100, beyond 2 s.e. of the "
        "difference = 0.057) while sample_accuracy did not rise beyond its noise (judge degrading?)")]
    assert reward_hacking_alarm(history([0.80, 0.75, 0.70], se=0.04)) == []  # bound 0.113: noise
    assert reward_hacking_alarm(history([0.80, 0.70, 0.72])) == []  # one fall, then a rise
    assert reward_hacking_alarm(history([0.80, 0.78, 0.77])) == []  # two falls, 0.03 in all: noise
    # the same falls while the policy's own accuracy rose beyond noise (0.30 -> 0.40, bound 0.028)
    improving = history([0.80, 0.75, 0.70])
    for row, acc in zip(improving, (0.30, 0.35, 0.40)):
        row.update(sample_accuracy=acc, sample_accuracy_se=0.01)
    assert reward_hacking_alarm(improving) == []
    for row, acc in zip(improving, (0.30, 0.31, 0.32)):  # a rise within noise does not excuse it
        row.update(sample_accuracy=acc)
    assert [a[:3] for a in reward_hacking_alarm(improving)] == ["it3"]
    # a policy right more often on its own prompts while held-out accuracy falls beyond noise is no
    # excuse (implicit_reward: sample accuracy 0.33 -> 0.41 while held-out fell 0.48 -> 0.31)
    for row, acc, held in zip(improving, (0.30, 0.35, 0.40), (0.48, 0.46, 0.31)):
        row.update(sample_accuracy=acc, accuracy=held, accuracy_se=0.02)
    assert reward_hacking_alarm(improving) == [(
        "it3: judge_auc fell two iterations running 0.80 -> 0.75 -> 0.70 (-0.100, beyond 2 s.e. of the "
        "difference = 0.057) while held-out accuracy fell 0.480 -> 0.310 beyond its noise (judge degrading?)")]
    improving[-1]["accuracy"] = 0.44  # -0.04 against 2 s.e. of 0.057: noise, the improvement excuses it
    assert reward_hacking_alarm(improving) == []
    # four iterations falling: fires at it3 and at it4
    assert [a[:3] for a in reward_hacking_alarm(history([0.9, 0.8, 0.7, 0.6]))] == ["it3", "it4"]


def test_alarm_quiet_when_healthy_or_missing_values_or_standard_errors():
    healthy = [
        {"iteration": "it0", "accuracy": 0.50, "accuracy_se": 0.02},
        {"iteration": "it1", "reward_mean": 0.60, "judge_auc": 0.75, "judge_auc_se": 0.01, "accuracy": 0.55,
         "accuracy_se": 0.02},
        {"iteration": "it2", "reward_mean": 0.70, "judge_auc": 0.74, "judge_auc_se": 0.01, "accuracy": 0.54,
         "accuracy_se": 0.02},
        {"iteration": "it3", "reward_mean": 0.80, "judge_auc": 0.76, "judge_auc_se": 0.01, "accuracy": 0.58,
         "accuracy_se": 0.02},
    ]
    assert reward_hacking_alarm(healthy) == []
    no_se = [{"iteration": "it1", "reward_mean": 0.1, "accuracy": 0.9, "judge_auc": 0.9},
             {"iteration": "it2", "reward_mean": 0.5, "accuracy": 0.1, "judge_auc": 0.5},
             {"iteration": "it3", "reward_mean": 0.9, "accuracy": 0.0, "judge_auc": 0.1}]
    assert reward_hacking_alarm(no_se) == []  # metrics of older runs: nothing to test against
    missing = [{"iteration": "it1", "reward_mean": None, "accuracy": 0.9, "accuracy_se": 0.01},
               {"iteration": "it2", "reward_mean": 0.7, "accuracy": float("nan"), "accuracy_se": 0.01},
               {"iteration": "it3"}]
    assert reward_hacking_alarm(missing) == []
    assert reward_hacking_alarm([]) == []


def test_standard_errors_by_hand():
    from self_improve.quality import auc_se, binomial_se, cluster_se

    assert binomial_se(0.5, 100) == pytest.approx(0.05)
    assert binomial_se(None, 10) is None and binomial_se(0.5, 0) is None
    # two groups of two: group means 1.0 and 0.0, sd 0.7071 over sqrt(2) groups = 0.5
    assert cluster_se([1, 1, 0, 0], ["a", "a", "b", "b"]) == pytest.approx(0.5)
    assert cluster_se([1, 0, None], ["a", "a", "b"]) is None  # one group with data
    # the same values as independent items would claim less noise than as two clusters
    assert cluster_se([1, 1, 0, 0], ["a", "b", "c", "d"]) == pytest.approx(0.2887, abs=1e-4)
    rewards = [0.9, 0.8, 0.7, 0.2, 0.6, 0.4, 0.3, 0.1] * 5
    correct = [1, 1, 0, 0, 1, 0, 1, 0] * 5
    groups = [i // 2 for i in range(40)]
    se = auc_se(rewards, correct, groups)
    assert se == auc_se(rewards, correct, groups)  # seeded: the same figure every time
    assert 0.03 < se < 0.2
    perfect = auc_se([1.0, 0.0] * 10, [1, 0] * 10, list(range(20)))
    assert perfect == 0.0  # every resample ranks every correct sample first
    assert auc_se([0.5] * 4, [1] * 4, [0, 0, 1, 1]) is None  # one class: no AUC


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
    for step, m in enumerate(history):
        d = tmp_path / "iterations" / f"it{step}"
        d.mkdir(parents=True)
        (d / "metrics.json").write_text(json.dumps({"iteration": f"it{step}", "step": step, **m}))
        (d / "examples.json").write_text(json.dumps({"judged": [], "pairs": [], "datasets": {}}))
    report.main(["--params", str(tmp_path / "params.yaml"), "--iterations", str(tmp_path / "iterations"),
                 "--summary", str(tmp_path / "summary.md"), "--figures", str(tmp_path / "fig"),
                 "--table", str(tmp_path / "t.csv")])
    return (tmp_path / "summary.md").read_text(), capsys.readouterr().out


def test_the_report_raises_the_alarm_for_a_hacked_history_and_only_then(tmp_path, capsys):
    base = {"accuracy": 0.4, "maj_accuracy": 0.4, "ttt_accuracy": 0.4}
    hacked = [base, {**base, "reward_mean": 0.5, "judge_auc": 0.80, "judge_auc_se": 0.01},
              {**base, "reward_mean": 0.7, "judge_auc": 0.70, "judge_auc_se": 0.01},
              {**base, "reward_mean": 0.9, "judge_auc": 0.60, "judge_auc_se": 0.01,
               "sample_accuracy": 0.3, "sample_accuracy_se": 0.01}]
    hacked[1] = {**hacked[1], "sample_accuracy": 0.5, "sample_accuracy_se": 0.01}
    hacked[2] = {**hacked[2], "sample_accuracy": 0.5, "sample_accuracy_se": 0.01}
    (tmp_path / "a").mkdir()
    summary, out = _report(tmp_path / "a", hacked, capsys)
    assert "Reward-hacking alarm: FIRED" in summary
    assert "- it3: judge_auc fell two iterations running 0.80 -> 0.70 -> 0.60" in summary
    assert "- it3: reward_mean rose 0.70 -> 0.90 while sample_accuracy fell 0.50 -> 0.30" in summary
    # the last lines printed (what `dvc repro` ends on): the alarm and its two firings
    assert out.rstrip().splitlines()[-3:][0] == "REWARD-HACKING ALARM:"
    healthy = [base, {**base, "reward_mean": 0.5, "judge_auc": 0.70, "judge_auc_se": 0.01, "accuracy": 0.5,
                      "accuracy_se": 0.01},
               {**base, "reward_mean": 0.7, "judge_auc": 0.75, "judge_auc_se": 0.01, "accuracy": 0.6,
                "accuracy_se": 0.01},
               {**base, "reward_mean": 0.9, "judge_auc": 0.80, "judge_auc_se": 0.01, "accuracy": 0.7,
                "accuracy_se": 0.01}]
    (tmp_path / "b").mkdir()
    summary, out = _report(tmp_path / "b", healthy, capsys)
    assert "Reward-hacking alarm: quiet" in summary and "REWARD-HACKING ALARM" not in out


def test_paired_gain_on_known_answers():
    from self_improve.quality import paired_gain

    g = paired_gain([1, 0, 1, 0, None], [1, 1, 1, 0, 1])  # the fifth problem has no answer before: left out
    assert g["gain"] == pytest.approx(0.25) and g["n"] == 4
    assert 0.0 <= g["lo"] <= 0.25 <= g["hi"] <= 0.75
    assert paired_gain([1, 0, 1, 0], [1, 1, 1, 0]) == paired_gain([1, 0, 1, 0], [1, 1, 1, 0])  # seeded
    same = paired_gain([1, 0, 1, 1, 0], [1, 0, 1, 1, 0])
    assert same["gain"] == same["lo"] == same["hi"] == 0.0  # the same answers: no doubt about no gain
    assert paired_gain([], []) is None


def test_paired_interval_is_narrower_than_the_two_runs_noise():
    """Two runs that share most answers: their difference is known far better than either binomial s.e. says."""
    from self_improve.quality import binomial_se, paired_gain

    before = [1] * 50 + [0] * 50
    after = [1] * 50 + [1] * 10 + [0] * 40  # ten more right, none lost
    g = paired_gain(before, after)
    assert g["gain"] == pytest.approx(0.10) and g["lo"] > 0.0
    unpaired = 1.96 * (binomial_se(0.5, 100) ** 2 + binomial_se(0.6, 100) ** 2) ** 0.5
    assert g["hi"] - g["lo"] < unpaired
