"""The loop's early stop (self_improve/stopping.py, `stop` in params.yaml): when it stops, that it
stays stopped, and the iterations after it train nothing and pass the model on."""

from __future__ import annotations

import pytest
import yaml

from self_improve import artifacts as art
from self_improve.config import StopConfig
from self_improve.stopping import decide, rising

from .conftest import run_all

ON = StopConfig(enabled=True, patience=2)


def _it(name, agree, lo, **kw):
    return {"iteration": name, "lf_agreement": agree, "lf_agreement_gain_lo": lo, "lf_distinct": 0.5,
            "lf_mode_share": 0.03, **kw}


BASE = {"iteration": "it0", "lf_agreement": 0.2, "lf_distinct": 0.5, "lf_mode_share": 0.03}


def test_off_or_too_early_it_never_stops():
    flat = [BASE, _it("it1", 0.2, -0.1), _it("it2", 0.2, -0.1)]
    assert not decide(flat, StopConfig()).stopped  # off (the default)
    assert not decide(flat[:2], ON).stopped  # one iteration: too few to tell with patience 2
    assert not decide([], ON).stopped


def test_it_stops_once_the_recommended_iteration_is_patience_behind():
    rising = [BASE, _it("it1", 0.3, 0.05), _it("it2", 0.4, 0.1)]
    assert not decide(rising, ON).stopped  # it2, the latest, is the recommended one
    flat_after = rising + [_it("it3", 0.4, 0.01)]
    assert not decide(flat_after, ON).stopped  # it2 is one behind
    stop = decide(flat_after + [_it("it4", 0.38, 0.0)], ON)
    assert stop.stopped and stop.at == "it4"
    assert stop.reason.startswith("the recommended iteration (it2) is 2 behind the latest (it4)")
    never = decide([BASE, _it("it1", 0.2, -0.05), _it("it2", 0.21, -0.04)], ON)
    assert never.stopped and "(it0) is 2 behind" in never.reason
    assert not decide([BASE, _it("it1", 0.2, -0.05), _it("it2", 0.21, -0.04)], StopConfig(enabled=True, patience=3)).stopped


def test_a_signal_still_rising_keeps_the_loop_going():
    """The rule recommends it0 (no gain clears its 95% interval), but the agreement set a new high in the
    last `patience` iterations by more than the rule's minimum gain: the loop goes on and says why. A new
    high by less, or a fall, stops it. The seed-2 V3 loop that stopped at it3 while rising, replayed."""
    three = StopConfig(enabled=True, patience=3)
    seed2 = [BASE | {"lf_agreement": 0.133}, _it("it1", 0.102, -0.094), _it("it2", 0.125, -0.086),
             _it("it3", 0.180, -0.047)]
    go = decide(seed2, three)
    assert not go.stopped and go.at is None
    assert go.reason == ("the recommended iteration (it0) is 3 behind the latest (it3), but its cross-view agreement "
                         "is still rising: 0.180 at it3, above every earlier iteration's (at most 0.133) by more than +0.02")
    strict = decide(seed2, StopConfig(enabled=True, patience=3, while_rising=False))  # the recommendation alone
    assert strict.stopped and strict.at == "it3" and strict.reason.startswith("the recommended iteration (it0) is 3 behind")
    assert rising(seed2, 3) and not rising(seed2, 4)  # it0 alone before the window; nothing before it
    level = seed2[:3] + [_it("it3", 0.150, -0.06)]  # +0.017 over it0: not more than the minimum gain
    assert rising(level, 3) is None and decide(level, three).stopped
    # later: a new high at it3 keeps it4 going with patience 2; none in it3-it4 above it0-it2 stops it5
    later = seed2 + [_it("it4", 0.17, -0.05)]
    assert not decide(later, ON).stopped
    fell = later + [_it("it5", 0.16, -0.06)]
    stop = decide(fell, ON)
    assert stop.stopped and stop.at == "it5" and "(it0) is 5 behind" in stop.reason
    # the base support (no rewrites) is a guard that held, not a signal that rises: no exception
    guard = [{"iteration": "it0", "lf_base_support": 0.6}] + [
        {"iteration": f"it{i}", "lf_base_support": 0.6 + 0.1 * i, "lf_base_support_gain_lo": -0.2} for i in (1, 2)]
    assert rising(guard, 2) is None and decide(guard, ON).stopped


def test_a_rise_the_choice_vetoes_does_not_keep_the_loop_going():
    """The plain vote on V3 (seed 0, six iterations) drifted onto answers that restate the question's
    numbers: its supported agreement rose 0.062 -> 0.430 by it3 while held-out fell 0.143 -> 0.008,
    and the choice vetoed every iteration. Such a rise is not one the loop goes on for: with patience 3
    it stops after it3."""
    three = StopConfig(enabled=True, patience=3)
    base = BASE | {"lf_agreement": 0.078, "lf_restate_share": 0.180}
    drift = [base] + [_it(f"it{i}", a, lo, lf_restate_share=r, lf_restate_share_gain_lo=rlo)
                      for i, a, lo, r, rlo in ((1, 0.219, 0.062, 0.641, 0.359), (2, 0.469, 0.289, 0.977, 0.727),
                                               (3, 0.492, 0.313, 0.984, 0.734))]
    assert rising(drift, 3) is None
    stop = decide(drift, three)
    assert stop.stopped and stop.at == "it3" and "(it0) is 3 behind the latest (it3)" in stop.reason
    # the same rise without the restatements: still rising, the loop goes on
    clean = [base] + [_it(f"it{i}", a, -0.01) for i, a in ((1, 0.219), (2, 0.469), (3, 0.492))]
    assert rising(clean, 3) and not decide(clean, three).stopped
    # one clean new high among vetoed ones is enough
    mixed = drift[:3] + [_it("it3", 0.30, -0.01)]
    assert "0.300 at it3" in rising(mixed, 3) and not decide(mixed, three).stopped


def test_the_summary_says_where_the_loop_went_on_while_rising():
    """A stop that was due but not taken (the signal still rising) is said in the summary, with its reason,
    beside the iteration it let run; a loop that stopped says that instead."""
    import pandas as pd

    from self_improve.reporting import choice_markdown

    three = StopConfig(enabled=True, patience=3)
    seed2 = [BASE | {"lf_agreement": 0.133}, _it("it1", 0.102, -0.094), _it("it2", 0.125, -0.086),
             _it("it3", 0.180, -0.047)]
    go = decide(seed2, three)
    rows = seed2 + [_it("it4", 0.2, -0.04, stopped=0.0, stop_reason=go.reason)]
    text = "\n".join(choice_markdown(pd.DataFrame(rows)))
    assert (f"**The loop went on where the stop was due** (`stop.while_rising`): before it4, {go.reason}."
            in text) and "stopped after" not in text
    assert "went on" not in "\n".join(choice_markdown(pd.DataFrame(seed2)))


def test_once_stopped_it_stays_stopped():
    row = _it("it5", 0.5, 0.3, stopped=1.0, stop_at="it3", stop_reason="the recommended iteration (it1) ...")
    stop = decide([BASE, row], ON)
    assert stop.stopped and stop.at == "it3" and stop.reason.startswith("the recommended iteration (it1)")


def test_the_alarm_stops_it_only_when_asked():
    fell = [BASE | {"accuracy": 0.5, "accuracy_se": 0.02},
            _it("it1", 0.5, 0.2, accuracy=0.3, accuracy_se=0.02, accuracy_gain_hi=-0.1)]
    assert not decide(fell, ON).stopped
    stop = decide(fell, StopConfig(enabled=True, on_alarm=True))
    assert stop.stopped and stop.at == "it1" and stop.reason.startswith("the reward-hacking alarm fired")


@pytest.mark.loop
def test_a_stopped_loop_trains_nothing_and_passes_the_model_on(tmp_path, tiny_raw, monkeypatch):
    """Patience 1 on the tiny loop: the iteration after one that did not pass the rule poses no prompts,
    samples, judges and trains nothing, evaluates to the same answers, and the summary says why."""
    tiny_raw["stop"] = {"enabled": True, "patience": 1}
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(tiny_raw))
    import stages.evaluate

    opened = []  # the models evaluate loads an engine for: a stopped iteration's answers are given again
    real = stages.evaluate.open_sampler
    monkeypatch.setattr(stages.evaluate, "open_sampler", lambda model, *a, **kw: opened.append(model) or real(model, *a, **kw))
    run_all(tmp_path, params, monkeypatch)
    history = art.read_json(tmp_path / "data/it3/history.json")
    assert [r["iteration"] for r in history] == ["it0", "it1", "it2", "it3"]
    cfg = StopConfig(enabled=True, patience=1)
    stopped = []
    for n, it in enumerate(("it1", "it2", "it3"), start=1):
        want = decide(history[:n], cfg)
        got = art.read_json(tmp_path / f"data/{it}/stop.json")
        assert got == want.to_dict() and bool(history[n]["stopped"]) == want.stopped
        if want.stopped:
            stopped.append(it)
            prev = history[n - 1]["iteration"]
            assert len(art.read_table(tmp_path / f"data/{it}/prompts.parquet", art.PROMPTS)) == 0
            assert len(art.read_table(tmp_path / f"data/{it}/samples.parquet", art.SAMPLES)) == 0
            assert art.read_json(tmp_path / f"data/{it}/train_metrics.json")["train_examples"] == 0
            same = art.read_table(tmp_path / f"data/{it}/eval.parquet", art.EVAL)
            before = art.read_table(tmp_path / f"data/{prev}/eval.parquet", art.EVAL)
            before = before[before["set"] != "ttt_sample"]  # it0's base samples are drawn once
            assert same["response"].tolist() == before["response"].tolist()  # the model passed on
            assert history[n]["accuracy"] == history[n - 1]["accuracy"]
    # the tiny base's 30 test-time problems: no 2-point rise of agreement beyond noise at it1
    assert stopped, "expected the tiny loop to stop (it1 did not pass the rule)"
    assert opened == [f"data/{it}/model" for it in ("it0", "it1", "it2", "it3") if it not in stopped]
    summary = (tmp_path / "reports/summary.md").read_text()
    assert f"**The loop stopped after {history[1 + ['it1', 'it2', 'it3'].index(stopped[0])]['stop_at']}**" in summary
