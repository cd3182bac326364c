"""Choosing an iteration without labels (self_improve/choice.py): the signals on known answers, the
rule on known histories, the rewrites evaluate asks the second wording with."""

import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest

from self_improve.choice import RULE, SAMPLE_SET, VIEW_SET, Rule, base_samples, per_problem, recommend, signals
from self_improve.config import TaskConfig
from self_improve.evaluation import rewritten
from self_improve.tasks import task_for

HIGHEST = Rule(min_agreement_gain=0.05, pick="highest")  # the rule's earlier settings, which these tests pin


def _eval(preds, views, valid=None, frozen=None, restates=None):
    """EVAL rows: test-time problem i answered `preds[i]` as posed and `views[i]` in its rewrite."""
    n = len(preds)
    rows = [{"set": "ttt", "prompt_id": f"p{i}", "pred": p, "valid": None if valid is None else valid[i],
             "frozen_yes": None if frozen is None else frozen[i],
             "restates": None if restates is None else restates[i]} for i, p in enumerate(preds)]
    rows += [{"set": VIEW_SET, "prompt_id": f"p{i}", "pred": v, "valid": None, "frozen_yes": None}
             for i, v in enumerate(views) if i < n]
    rows += [{"set": "heldout", "prompt_id": "h0", "pred": "1", "valid": True, "frozen_yes": None}]
    return pd.DataFrame(rows)


def test_signals_count_agreeing_wordings_invalid_answers_and_distinct_answers():
    df = _eval(["12", "7", None, "3"], ["12", "8", None, "3"], valid=[True, False, None, True],
               restates=[False, True, None, False])
    per = per_problem(df)
    assert per["lf_restate_share"].tolist()[:2] == [0.0, 1.0] and per["lf_restate_share"].isna().tolist()[2]
    assert list(per["lf_agreement"]) == [1.0, 0.0, 0.0, 1.0]  # no answer in either wording: no agreement
    assert list(per["lf_invalid_share"]) == [0.0, 1.0, 1.0, 0.0]  # no answer counts as invalid
    s = signals(df)
    assert s["lf_agreement"] == 0.5 and s["lf_invalid_share"] == 0.5
    assert s["lf_restate_share"] == pytest.approx(1 / 3)  # over the answered problems
    assert s["lf_distinct"] == 3 / 4 and s["lf_n"] == 4
    assert "lf_frozen_yes" not in s and "lf_agreement_gain" not in s


def test_signals_gain_is_paired_over_the_same_problems():
    base = _eval(["1", "2", "3", "4"], ["1", "9", "9", "9"], valid=[True] * 4, frozen=[0.5, 0.5, 0.5, 0.5])
    new = _eval(["1", "2", "3", "4"], ["1", "2", "3", "9"], valid=[True] * 4, frozen=[0.7, 0.7, 0.7, 0.7])
    s = signals(new, base)
    assert s["lf_agreement_gain"] == pytest.approx(0.5)
    assert s["lf_agreement_gain_lo"] <= 0.5 <= s["lf_agreement_gain_hi"]
    assert s["lf_frozen_yes"] == pytest.approx(0.7) and s["lf_frozen_yes_gain"] == pytest.approx(0.2)
    assert s["lf_invalid_share_gain"] == 0.0


def test_mode_share_counts_the_commonest_answer_and_its_paired_rise():
    base = _eval(["1", "2", "3", "4", "5", None], ["1", "2", "3", "4", "5", None])
    new = _eval(["7", "7", "7", "4", "5", None], ["7", "7", "7", "4", "9", None])
    assert list(per_problem(new)["lf_mode_share"]) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]  # no answer: not the mode
    s = signals(new, base)
    assert s["lf_mode_share"] == 0.5 and s["lf_mode_share_gain"] == pytest.approx(0.5 - 1 / 6)
    assert s["lf_agreement"] == pytest.approx(4 / 6)


def _with_samples(df, drawn):
    """`df` plus the base model's sampled answers: `drawn[i]`, the answers drawn for problem i."""
    rows = [{"set": SAMPLE_SET, "prompt_id": f"p{i}", "pred": p, "valid": None, "frozen_yes": None}
            for i, preds in enumerate(drawn) for p in preds]
    return pd.concat([df, pd.DataFrame(rows)], ignore_index=True)


def test_base_support_looks_answers_up_among_the_base_models_samples():
    base = _with_samples(_eval(["1", "2", "3", None], ["1", "2", "9", None]),
                         [["1", "1", "4"], ["5", None], ["3", "3"], [None, None]])
    assert base_samples(base) == {"p0": {"1", "4"}, "p1": {"5"}, "p2": {"3"}, "p3": set()}
    assert list(per_problem(base, base_samples(base))["lf_base_support"]) == [1.0, 0.0, 1.0, 0.0]
    s0 = signals(base)  # it0: its own samples
    assert s0["lf_base_support"] == 0.5 and "lf_base_support_gain" not in s0
    new = _eval(["4", "5", "8", "8"], ["4", "5", "8", "8"])  # itN has no samples: it0's are read
    assert list(per_problem(new, base_samples(base))["lf_base_support"]) == [1.0, 1.0, 0.0, 0.0]
    s = signals(new, base)
    assert s["lf_base_support"] == 0.5 and s["lf_base_support_gain"] == 0.0
    assert per_problem(new)["lf_base_support"].isna().all()  # no samples anywhere: no signal
    assert "lf_base_support" not in signals(new) and "lf_supported_agreement" not in signals(new)
    # agreement on an answer the base gives: p0 (4, sampled) and p1 (5) count; p2 agrees on 8, never sampled
    assert list(per_problem(new, base_samples(base))["lf_supported_agreement"]) == [1.0, 1.0, 0.0, 0.0]
    assert list(per_problem(base, base_samples(base))["lf_supported_agreement"]) == [1.0, 0.0, 0.0, 0.0]
    assert s["lf_supported_agreement"] == 0.5 and s["lf_supported_agreement_gain"] == 0.25


def test_a_task_without_rewrites_has_no_agreement():
    df = _eval(["1", "2"], [], valid=[True, True])
    assert per_problem(df)["lf_agreement"].isna().all()
    assert "lf_agreement" not in signals(df)


def _row(it, agree, lo, invalid_lo=-0.1, distinct=0.5, frozen_hi=None, restate_lo=-0.1, mode=0.03, mode_lo=-0.01,
         support=None, support_hi=None):
    return {"iteration": it, "lf_agreement": agree, "lf_agreement_gain_lo": lo, "lf_invalid_share_gain_lo": invalid_lo,
            "lf_distinct": distinct, "lf_frozen_yes_gain_hi": frozen_hi, "lf_restate_share_gain_lo": restate_lo,
            "lf_mode_share": mode, "lf_mode_share_gain_lo": mode_lo, "lf_base_support": support,
            "lf_base_support_gain_hi": support_hi}


def test_recommend_takes_the_highest_agreement_that_rose_by_the_minimum_beyond_noise():
    h = [{"iteration": "it0", "lf_agreement": 0.4, "lf_distinct": 0.5, "lf_mode_share": 0.03},
         _row("it1", 0.5, 0.06), _row("it2", 0.6, 0.1), _row("it3", 0.7, 0.03), _row("it4", 0.8, -0.01)]
    rec = recommend(h, HIGHEST)
    assert rec["iteration"] == "it2"  # it3 and it4 agree more, but their low ends are under 0.05
    assert [rec["rows"][it]["candidate"] for it in ("it1", "it2", "it3", "it4")] == [True, True, False, False]
    assert recommend(h, Rule(0.0, pick="highest"))["iteration"] == "it3"  # any rise beyond noise
    low = recommend(h, Rule(0.2, pick="highest"))
    assert low["iteration"] == "it0" and "low end above +0.20" in low["reason"]


def test_recommend_latest_takes_the_last_candidate_and_says_why():
    h = [{"iteration": "it0", "lf_agreement": 0.4, "lf_distinct": 0.5, "lf_mode_share": 0.03},
         _row("it1", 0.5, 0.06), _row("it2", 0.7, 0.2), _row("it3", 0.6, 0.04), _row("it4", 0.8, -0.01)]
    rec = recommend(h, Rule(0.02, pick="latest"))
    assert rec["iteration"] == "it3"  # the latest whose rise clears 0.02, not the highest (it2)
    assert rec["reason"].startswith("the latest of 3 candidate(s): cross-view agreement 0.600")
    assert recommend(h, Rule(0.05, pick="latest"))["iteration"] == "it2"
    with pytest.raises(ValueError, match="pick"):
        Rule(pick="best")


def test_recommend_without_rewrites_reads_the_base_support():
    base = {"iteration": "it0", "lf_base_support": 0.6, "lf_distinct": 0.4, "lf_mode_share": 0.2}
    held = {"iteration": "it1", "lf_base_support": 0.62, "lf_base_support_gain_lo": -0.06, "lf_distinct": 0.45,
            "lf_mode_share": 0.15}
    lost = {"iteration": "it2", "lf_base_support": 0.45, "lf_base_support_gain_lo": -0.25, "lf_distinct": 0.3,
            "lf_mode_share": 0.2}
    rec = recommend([base, held, lost], Rule(0.02, -0.10, "latest"))
    assert rec["iteration"] == "it1" and "base support" in rec["reason"]
    assert not rec["rows"]["it2"]["candidate"]
    none = recommend([base, held], Rule(0.02, None, "latest"))
    assert none["iteration"] == "it0" and "min_support_gain None" in none["reason"]


def test_the_product_rule_is_the_fitted_one():
    fitted = json.loads((Path(__file__).resolve().parents[1] / "research/results/choice_check.json").read_text())
    assert fitted["fitted"]["rule"] == dataclasses.asdict(RULE)  # regenerate with `python -m research.choice_check`


def test_recommend_vetoes_invalid_share_up_distinct_halved_mode_doubled_frozen_down():
    base = {"iteration": "it0", "lf_agreement": 0.4, "lf_distinct": 0.5, "lf_invalid_share": 0.2,
            "lf_frozen_yes": 0.6}
    h = [base | {"lf_mode_share": 0.03}, _row("it1", 0.9, 0.3, invalid_lo=0.05), _row("it2", 0.9, 0.3, distinct=0.2),
         _row("it3", 0.9, 0.3, frozen_hi=-0.01), _row("it4", 0.9, 0.3, restate_lo=0.02),
         _row("it5", 0.9, 0.3, mode=0.25, mode_lo=0.15)]
    rec = recommend(h, HIGHEST)
    assert rec["iteration"] == "it0" and "no iteration" in rec["reason"]
    assert "restating the question's numbers" in rec["rows"]["it4"]["vetoes"][0]
    assert "invalid share up" in rec["rows"]["it1"]["vetoes"][0]
    assert "distinct answers halved" in rec["rows"]["it2"]["vetoes"][0]
    assert "frozen judge" in rec["rows"]["it3"]["vetoes"][0]
    assert "commonest answer's share up 0.030 -> 0.250" in rec["rows"]["it5"]["vetoes"][0]
    # doubled but within noise, or beyond noise but under twice: no veto
    assert recommend([h[0], _row("it1", 0.9, 0.3, mode=0.07, mode_lo=-0.01)], HIGHEST)["iteration"] == "it1"
    assert recommend([h[0], _row("it1", 0.9, 0.3, mode=0.05, mode_lo=0.01)], HIGHEST)["iteration"] == "it1"
    # the invalid share's veto is a setting (off in the fitted rule)
    assert recommend([h[0], h[1]], Rule(0.05, invalid_veto=False))["iteration"] == "it1"


def test_the_restatement_veto_can_let_pass_a_rise_the_agreement_outpaced():
    base = {"iteration": "it0", "lf_agreement": 0.2, "lf_distinct": 0.5, "lf_mode_share": 0.03}
    skill = {**_row("it1", 0.42, 0.12, restate_lo=0.05), "lf_agreement_gain": 0.22, "lf_restate_share_gain": 0.19}
    drift = {**_row("it2", 0.45, 0.15, restate_lo=0.6), "lf_agreement_gain": 0.25, "lf_restate_share_gain": 0.8}
    assert recommend([base, skill, drift], Rule(0.02, pick="latest"))["iteration"] == "it0"  # any rise vetoes
    scoped = recommend([base, skill, drift], Rule(0.02, pick="latest", restate_veto="over_signal"))
    assert scoped["iteration"] == "it1"  # restatements rose less than the agreement: they cannot make up its gain
    assert "restating the question's numbers" in scoped["rows"]["it2"]["vetoes"][0]
    with pytest.raises(ValueError, match="restate_veto"):
        Rule(restate_veto="never")


def test_recommend_vetoes_base_support_halved_beyond_noise():
    base = {"iteration": "it0", "lf_agreement": 0.4, "lf_distinct": 0.5, "lf_mode_share": 0.03, "lf_base_support": 0.8}
    rec = recommend([base, _row("it1", 0.9, 0.3, support=0.3, support_hi=-0.4)], HIGHEST)
    assert rec["iteration"] == "it0" and rec["rows"]["it1"]["vetoes"] == [
        "base support down 0.800 -> 0.300 (under 1/2, 95% high end -0.400)"]
    # fell beyond noise but kept over half (an improving run's answers leave some of it), or under half
    # within noise, or not recorded (results from before it was): no veto
    for support, hi in ((0.55, -0.2), (0.35, 0.01), (None, None)):
        assert recommend([base, _row("it1", 0.9, 0.3, support=support, support_hi=hi)], HIGHEST)["iteration"] == "it1"


def test_recommend_reads_the_supported_agreement_where_it_was_recorded():
    base = {"iteration": "it0", "lf_agreement": 0.5, "lf_supported_agreement": 0.45, "lf_distinct": 0.5,
            "lf_mode_share": 0.03}
    drifted = _row("it1", 0.65, 0.08) | {"lf_supported_agreement": 0.35, "lf_supported_agreement_gain_lo": -0.14}
    anchored = _row("it2", 0.6, 0.06) | {"lf_supported_agreement": 0.55, "lf_supported_agreement_gain_lo": 0.06}
    rec = recommend([base, drifted, anchored], HIGHEST)
    assert rec["iteration"] == "it2" and "supported agreement 0.550" in rec["reason"]
    assert not rec["rows"]["it1"]["candidate"]  # agreed more with itself, on answers the base never gives
    assert recommend([base, drifted], HIGHEST)["iteration"] == "it0"
    # kept before the support was recorded: the plain agreement
    plain = {k: v for k, v in base.items() if k != "lf_supported_agreement"}
    assert recommend([plain, drifted], HIGHEST)["iteration"] == "it1"


def test_recommend_without_signals_keeps_the_base_model():
    rec = recommend([{"iteration": "it0", "accuracy": 0.2}, {"iteration": "it1", "accuracy": 0.5}])
    assert rec["iteration"] == "it0" and "no label-free signals" in rec["reason"]
    with pytest.raises(ValueError):
        recommend([])


@pytest.mark.parametrize("name", ["word_math", "arithmetic"])
def test_rewritten_asks_each_test_time_problem_once_more_in_other_words(name):
    task = task_for(TaskConfig(name=name, heldout_size=40, ttt_size=20))
    ttt = task.sets(0, 10).ttt.head(20)
    a, b = rewritten(task, ttt, 3), rewritten(task, ttt, 3)
    assert a.equals(b) and len(a) >= 0.8 * len(ttt)  # the same rewrites at every iteration
    posed = ttt.set_index("prompt_id")
    for row in a.itertuples():
        assert row.prompt != posed.loc[row.prompt_id, "prompt"]
        assert task.verify(row.answer, posed.loc[row.prompt_id, "answer"])
        assert task.parse(row.prompt).key == task.parse(posed.loc[row.prompt_id, "prompt"]).key


def test_choice_check_counts_replayed_loops_on_their_replayed_signals(tmp_path):
    from research.choice_check import replayed
    rows = [{"iteration": "it0", "accuracy": 0.2, "lf_agreement": 0.1}, {"iteration": "it1", "accuracy": 0.3, "lf_agreement": 0.4}]
    kept = {"cpu/run-s0": [{**r, "accuracy": r["accuracy"] + 0.01} for r in rows], "gpu/run-s0": rows}
    replay = [{"run": "gpu-run-s0", "history": [{"iteration": "it0", "accuracy": 0.2, "lf_supported_agreement": 0.1},
                                                {"iteration": "it1", "accuracy": 0.3, "lf_supported_agreement": 0.2}]}]
    path = tmp_path / "replay.json"
    path.write_text(json.dumps(replay))
    [(name, got)] = replayed(path, kept)
    assert name == "gpu/run-s0"  # the same name, and the same held-out accuracies
    assert got[1] == {"iteration": "it1", "accuracy": 0.3, "lf_supported_agreement": 0.2}  # recorded lf_* replaced
    replay[0]["history"][1]["accuracy"] = 0.32  # not a kept loop
    path.write_text(json.dumps(replay))
    with pytest.raises(SystemExit, match="'gpu-run-s0' matches 0 kept results"):
        replayed(path, kept)
    with pytest.raises(SystemExit, match="--replayed .*missing.json"):
        replayed(tmp_path / "missing.json", kept)


def test_the_clean_agreement_leaves_out_answers_the_task_rules_out():
    """Wordings that agree on an answer the task rules out (the sum of the question's numbers on a
    subtraction) count for the supported agreement, not for the clean one; without ruled-out answers the
    shortcut signals are not recorded, so a task that names none records what it did before."""
    df = _eval(["12", "40", "5", None], ["12", "40", "6", None])
    support = {f"p{i}": {"12", "40", "5"} for i in range(4)}
    per = per_problem(df, support, {"p0": frozenset(), "p1": frozenset({"40"}), "p2": frozenset({"5"})})
    assert list(per["lf_supported_agreement"]) == [1.0, 1.0, 0.0, 0.0]
    assert list(per["lf_clean_agreement"]) == [1.0, 0.0, 0.0, 0.0]
    assert per["lf_shortcut_share"].tolist()[:3] == [0.0, 1.0, 1.0] and per["lf_shortcut_share"].isna().tolist()[3]
    assert not {"lf_clean_agreement", "lf_shortcut_share"} & set(signals(df))
    sampled = pd.concat([df, pd.DataFrame([{"set": SAMPLE_SET, "prompt_id": f"p{i}", "pred": a}
                                            for i in range(4) for a in ("12", "40", "5")])])
    on = signals(df, sampled, {"p1": frozenset({"40"})})
    assert on["lf_clean_agreement"] == pytest.approx(0.25) and on["lf_shortcut_share"] == pytest.approx(1 / 3)
    assert on["lf_clean_agreement_gain"] == 0.0


def test_near_best_takes_the_latest_candidate_whose_agreement_has_not_fallen_beyond_noise():
    """A six-iteration loop collapsing onto the shortcut: the clean agreement peaks, then falls while every
    iteration stays a candidate. `near_best` keeps the peak; where the signal only wobbles within one s.e.
    of the highest it is `latest`. With `shortcut` off the rule reads the supported agreement."""
    def row(it, clean, lo, supported):
        return {"iteration": it, "lf_clean_agreement": clean, "lf_clean_agreement_se": 0.04,
                "lf_clean_agreement_gain_lo": lo, "lf_supported_agreement": supported,
                "lf_supported_agreement_gain_lo": lo, "lf_distinct": 0.5, "lf_mode_share": 0.03}
    h = [row("it0", 0.06, None, 0.06), row("it1", 0.17, 0.04, 0.17), row("it2", 0.21, 0.07, 0.21),
         row("it3", 0.28, 0.13, 0.28), row("it4", 0.22, 0.08, 0.26), row("it5", 0.20, 0.06, 0.31),
         row("it6", 0.16, 0.03, 0.36)]
    near = Rule(0.02, -0.10, "near_best", False, shortcut=True)
    rec = recommend(h, near)
    assert rec["iteration"] == "it3"
    assert "within one s.e. of the highest supported agreement on answers the task does not rule out" in rec["reason"]
    assert recommend(h, dataclasses.replace(near, pick="latest"))["iteration"] == "it6"
    assert recommend(h, dataclasses.replace(near, shortcut=False))["iteration"] == "it6"  # the sum agrees too
    wobble = h[:4] + [row("it4", 0.25, 0.10, 0.30)]
    assert recommend(wobble, near)["iteration"] == "it4"  # 0.25 is within 0.04 of 0.28


def test_the_fit_takes_the_first_rule_within_one_standard_error_of_the_best_recall(monkeypatch):
    """choice_check's fit: of the rules with at most max_below picks below it0 on the target, the first in
    the grid's order whose recall is within one binomial s.e. of the best; a run more is not a new rule."""
    import research.choice_check as cc

    rules = [Rule(0.05), Rule(0.02), Rule(0.0)]
    tallies = {}

    def tally(runs, rule, key):
        within, below = tallies[rule.min_agreement_gain]
        return {"gained": 153, "within": within, "recall": within / 153, "below": below}

    monkeypatch.setattr(cc, "grid", lambda: rules)
    monkeypatch.setattr(cc, "tally", tally)
    tallies.update({0.05: (138, 0), 0.02: (139, 0), 0.0: (150, 2)})  # s.e. of 139/153: 3.6 runs
    assert cc.fit([], max_below=0)[0] == rules[0]
    tallies[0.05] = (130, 0)  # beyond one s.e. of the best allowed: the best
    assert cc.fit([], max_below=0)[0] == rules[1]
    assert cc.fit([], max_below=2)[0] == rules[2]  # the third allowed, and best by far
    tallies.update({0.05: (140, 3), 0.02: (145, 1)})  # none allowed: the fewest below
    assert cc.fit([], max_below=0)[0] == rules[1]


def test_the_invalid_drop_variant_takes_an_iteration_answering_validly_more_with_its_signal_held():
    from research.choice_invalid_drop import choose
    base = {"iteration": "it0", "lf_agreement": 0.4, "lf_distinct": 0.5, "lf_mode_share": 0.03}
    valid = {**_row("it1", 0.41, -0.05), "lf_agreement_gain_hi": 0.07, "lf_invalid_share_gain_hi": -0.2}
    fell = {**_row("it2", 0.30, -0.2), "lf_agreement_gain_hi": -0.01, "lf_invalid_share_gain_hi": -0.3}
    assert recommend([base, valid, fell], RULE)["iteration"] == "it0"  # no agreement rise beyond noise
    assert choose([base, valid, fell], RULE, "every run") == "it1"  # it2's agreement fell beyond noise
    vetoed = {**valid, "lf_restate_share_gain_lo": 0.05}  # answers restating the question's numbers rose
    assert choose([base, vetoed], RULE, "every run") == "it0"
    gym = [{"iteration": "it0", "lf_base_support": 0.6, "lf_distinct": 0.4, "lf_mode_share": 0.2},
           {"iteration": "it1", "lf_base_support": 0.5, "lf_base_support_gain_lo": -0.2, "lf_base_support_gain_hi": 0.01,
            "lf_invalid_share_gain_hi": -0.2, "lf_distinct": 0.4, "lf_mode_share": 0.2}]
    assert choose(gym, RULE, "every run") == "it1" and choose(gym, RULE, "agreement only") == "it0"


def test_choice_check_tells_label_free_arms_from_controls_and_gold_labels():
    """The misses table's kinds: a control arm by its judge (a real-model loop's result, or a tiny run's
    `judge-<name>` variant), gold labels by the verifier or an oracle variant, anything else a label-free arm."""
    from research.choice_check import KINDS, kind_of
    arm, control, gold = KINDS
    assert kind_of("smollm2_gym_long/mix128-majority_vote-s2", {"judge": "majority_vote"}) == control
    assert kind_of("smollm2_v3_arms/format-s0", {"judge": "format"}) == control
    assert kind_of("seeds/judge-majority_vote/s1", {}) == control
    assert kind_of("seeds/judge-verifier/s0", {}) == gold
    assert kind_of("bstar/sample-bstar-oracle/s2", {}) == gold
    assert kind_of("smollm2_v3_arms/verifier-s1", {"judge": "verifier"}) == gold
    assert kind_of("smollm2_v3_long/long1-sec-co_reward-validity_any-shortcut-s2",
                   {"judge": "co_reward+validity_any+shortcut"}) == arm
    assert kind_of("seeds/judge-self_certainty/s0", {}) == arm and kind_of("seeds/default/s0", {}) == arm
