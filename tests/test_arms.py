"""The per-category and control-arm tables of kept loops (runners/arms.py), on kept results whose
figures are known."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from runners import arms
from self_improve import artifacts as art

pytestmark = pytest.mark.unit


def _kept(out, judge, seed, it0, it3, floor, correct3, agreement=None):
    """A kept result: it0 and it3 metrics of two categories and its held-out answers at it3; `agreement`:
    the label-free signal at it0 and it3 (supported agreement) with its gain's low end at it3."""
    cats = ["add"] * 4 + ["mul"] * 4
    m0 = {"accuracy": it0, "floor": floor, "accuracy/add": it0, "accuracy/mul": it0,
          "floor/add": 2 * floor, "floor/mul": 0.0, "floor_gain": it0 - floor, "floor_gain_lo": it0 - floor - 0.1}
    g = it3 - it0
    m3 = {"accuracy": it3, "accuracy/add": it3, "accuracy/mul": it3, "accuracy_gain": g, "accuracy_gain_lo": g - 0.1,
          "floor_gain": it3 - floor, "floor_gain_lo": it3 - floor - 0.1,
          **{f"{k}/{c}": v for c in ("add", "mul") for k, v in
             (("accuracy_gain", g), ("accuracy_gain_lo", g - 0.1))},
          "floor_gain/add": it3 - 2 * floor, "floor_gain_lo/add": it3 - 2 * floor - 0.1,
          "floor_gain/mul": it3, "floor_gain_lo/mul": it3 - 0.1}
    if agreement is not None:
        (a0, a3, lo) = agreement
        m0["lf_supported_agreement"], m3["lf_supported_agreement"], m3["lf_supported_agreement_gain_lo"] = a0, a3, lo
    (out / f"{judge}-s{seed}.json").write_text(json.dumps({"judge": judge, "seed": seed,
                                                            "metrics": {"it0": m0, "it3": m3}}))
    rows = pd.DataFrame({"iteration": "it3", "set": "heldout", "prompt_id": [f"h{i}" for i in range(8)],
                         "category": cats, "answer": "1", "response": "1", "pred": "1",
                         "correct": [float(c) for c in correct3], "truncated": False, "valid": True,
                         "restates": False, "frozen_yes": None})
    (out / f"{judge}-s{seed}").mkdir()
    art.write_table(rows, out / f"{judge}-s{seed}" / "answers.parquet", art.KEPT_EVAL)


def test_the_gain_that_counts_is_over_the_higher_of_it0_and_the_floor(tmp_path):
    for seed in (0, 1):
        _kept(tmp_path, "rule", seed, it0=0.2, it3=0.5, floor=0.3, correct3=[1, 1, 1, 1, 0, 0, 0, 0])
        _kept(tmp_path, "random", seed, it0=0.2, it3=0.25, floor=0.3, correct3=[1, 1, 0, 0, 0, 0, 0, 0])
    arms.write(tmp_path)
    table = (tmp_path / "categories.md").read_text()
    rule_all = next(line for line in table.splitlines() if line.startswith("| rule"))
    cells = [c.strip() for c in rule_all.strip("|").split("|")]
    # it0 0.2 under the floor 0.3: the gain counted is over the floor, +0.2, its low end +0.1
    assert cells[2:] == ["0.200 +- 0.000", "0.500 +- 0.000", "0.300 +- 0.000", "+0.200 +- 0.000", "+0.100",
                         "+0.300 +- 0.000"]
    add = [c.strip() for c in table.splitlines()[table.splitlines().index(rule_all) + 1].strip("|").split("|")]
    assert add[1] == "add" and add[4] == "0.600 +- 0.000" and add[5] == "-0.100 +- 0.000"  # the floor solves addition
    controls = (tmp_path / "controls.md").read_text()
    row = next(line for line in controls.splitlines() if line.startswith("| rule | random"))
    assert "+0.250 +- 0.000" in row and "s0 [" in row and "s1 [" in row  # 4 of 8 right against 2 of 8, paired
    assert not any(line.startswith("| random |") for line in controls.splitlines())  # a control is not set against controls


def test_a_rule_is_set_against_the_kept_rules_it_extends(tmp_path):
    _kept(tmp_path, "scpo", 0, it0=0.2, it3=0.25, floor=0.3, correct3=[1, 1, 0, 0, 0, 0, 0, 0])
    _kept(tmp_path, "scpo+gate", 0, it0=0.2, it3=0.5, floor=0.3, correct3=[1, 1, 1, 1, 0, 0, 0, 0])
    _kept(tmp_path, "random", 0, it0=0.2, it3=0.25, floor=0.3, correct3=[1, 0, 0, 0, 0, 0, 0, 0])
    arms.write(tmp_path)
    rows = [line for line in (tmp_path / "controls.md").read_text().splitlines() if line.startswith("| scpo")]
    assert [r.split("|")[2].strip() for r in rows] == ["random", "random", "scpo"]
    assert "+0.250" in rows[-1]  # 4 of 8 right against scpo's 2 of 8
    assert arms.extended("a+b+c", {"a": [], "a+b": [], "a+c": []}) == ["a", "a+b"]
    # a tagged run (another curriculum or trainer) is set against the same rule untagged, then its parts
    assert arms.extended("sec-a+b", {"a": [], "a+b": [], "sec-a+b": []}) == ["a+b", "a"]
    assert arms.extended("sec-a+b", {"a": []}) == []


def test_a_label_free_arm_is_set_against_the_oracle(tmp_path):
    _kept(tmp_path, "scpo+gate", 0, it0=0.2, it3=0.5, floor=0.3, correct3=[1, 1, 1, 1, 0, 0, 0, 0])
    _kept(tmp_path, "verifier", 0, it0=0.2, it3=0.75, floor=0.3, correct3=[1, 1, 1, 1, 1, 1, 0, 0])
    arms.write(tmp_path)
    lines = (tmp_path / "controls.md").read_text().splitlines()
    rows = [line for line in lines if line.startswith("| scpo+gate")]
    assert rows[-1].split("|")[2].strip() == "verifier" and "-0.250" in rows[-1]  # how far from gold: 4 of 8 against 6
    assert not any(line.startswith("| verifier | verifier") for line in lines)  # the oracle is not set against itself


def test_results_kept_before_categories_write_no_table(tmp_path):
    (tmp_path / "old-s0.json").write_text(json.dumps({"judge": "old", "seed": 0,
                                                       "metrics": {"it0": {"accuracy": 0.1}, "it1": {"accuracy": 0.2}}}))
    arms.write(tmp_path)
    assert not (tmp_path / "categories.md").exists()


def _bar(tmp_path, chosen: bool = False) -> dict[str, list[str]]:
    """bar.md's rows by arm: at the last iteration, or (`chosen`) at the iteration the choice keeps."""
    arms.write(tmp_path)
    last, _, at_chosen = (tmp_path / "bar.md").read_text().partition("## At the iteration the label-free choice keeps")
    rows = [line for line in (at_chosen if chosen else last).splitlines() if line.startswith("| ") and "---" not in line]
    return {cells[0]: cells for cells in ([c.strip() for c in r.strip("|").split("|")] for r in rows[1:])}


def test_the_bar_needs_three_seeds_the_floor_and_every_control(tmp_path):
    for seed in (0, 1, 2):
        _kept(tmp_path, "rule", seed, it0=0.2, it3=0.5, floor=0.3, correct3=[1, 1, 1, 1, 0, 0, 0, 0])
        _kept(tmp_path, "verifier", seed, it0=0.2, it3=0.5, floor=0.3, correct3=[1, 1, 1, 1, 0, 0, 0, 0])
        for control in arms.CONTROLS:
            _kept(tmp_path, control, seed, it0=0.2, it3=0.0, floor=0.3, correct3=[0] * 8)
    bar = _bar(tmp_path)
    assert bar["rule"][1:5] == ["3", "it3", "+0.200 +- 0.000", "+0.100"] and bar["rule"][6:] == ["none", "none", "yes"]
    assert bar["verifier"][-1] == "oracle"  # gold labels are read beside the bar, never as a label-free result
    assert set(bar) == {"rule", "verifier"}  # a control arm is not held to the bar


def test_the_bar_is_missed_on_two_seeds_a_missing_control_or_a_lost_category(tmp_path):
    for seed in (0, 1):
        _kept(tmp_path, "rule", seed, it0=0.2, it3=0.5, floor=0.3, correct3=[1, 1, 1, 1, 0, 0, 0, 0])
        for control in arms.CONTROLS:
            _kept(tmp_path, control, seed, it0=0.2, it3=0.0, floor=0.3, correct3=[0] * 8)
    assert _bar(tmp_path)["rule"][-1] == "no"  # two seeds are not three
    _kept(tmp_path, "rule", 2, it0=0.2, it3=0.5, floor=0.3, correct3=[1, 1, 1, 1, 0, 0, 0, 0])
    for control in ("random", "format", "validity_only"):
        _kept(tmp_path, control, 2, it0=0.2, it3=0.0, floor=0.3, correct3=[0] * 8)
    bar = _bar(tmp_path)["rule"]
    assert bar[-1] == "no" and bar[6] == "majority_vote (s2)"  # not looped at seed 2: the bar cannot be read there
    _kept(tmp_path, "majority_vote", 2, it0=0.2, it3=0.0, floor=0.3, correct3=[0] * 8)
    assert _bar(tmp_path)["rule"][-1] == "yes"
    kept = tmp_path / "rule-s1.json"
    r = json.loads(kept.read_text())
    r["metrics"]["it3"]["accuracy_gain_hi/mul"] = -0.05  # multiplication fell below it0 by an interval at seed 1
    kept.write_text(json.dumps(r))
    assert _bar(tmp_path)["rule"][6:] == ["none", "mul (s1)", "no"]


def test_the_bar_at_the_iteration_the_label_free_choice_keeps(tmp_path):
    """The gain a user keeps is the one at the recommended iteration: a run whose signal rose is read at it3,
    one whose signal never cleared the rule's minimum gain kept the base model, and no gain."""
    for seed in (0, 1, 2):
        _kept(tmp_path, "rule", seed, it0=0.2, it3=0.5, floor=0.3, correct3=[1, 1, 1, 1, 0, 0, 0, 0],
              agreement=(0.3, 0.5, 0.1))
        _kept(tmp_path, "flat", seed, it0=0.2, it3=0.5, floor=0.3, correct3=[1, 1, 1, 1, 0, 0, 0, 0],
              agreement=(0.3, 0.31, -0.05 if seed == 1 else 0.1))
        for control in arms.CONTROLS:
            _kept(tmp_path, control, seed, it0=0.2, it3=0.0, floor=0.3, correct3=[0] * 8)
    assert arms.chosen_iteration(json.loads((tmp_path / "rule-s0.json").read_text())) == "it3"
    last, chosen = _bar(tmp_path), _bar(tmp_path, chosen=True)
    assert last["flat"][-1] == "yes" and last["flat"][2] == "it3"
    assert chosen["rule"][2:5] == ["s0 it3, s1 it3, s2 it3", "+0.200 +- 0.000", "+0.100"] and chosen["rule"][-1] == "yes"
    # seed 1 kept it0, 0.1 under the floor 0.3 (low end -0.2); the controls' it0 answers were not kept
    assert chosen["flat"][2] == "s0 it3, s1 it0, s2 it3" and chosen["flat"][4] == "-0.200" and chosen["flat"][-1] == "no"


def _settings(out, name, judge, tag, seed, fresh):
    """Give a kept result the settings it ran with (a curriculum drawing `fresh` problems when set)."""
    kept = out / f"{name}-s{seed}.json"
    r = json.loads(kept.read_text())
    extra = ["-S", "evolve.strategy=sec", "-S", f"evolve.fresh={fresh}"] if fresh else []
    r.update(judge=judge, tag=tag, args=["-S", "evolve.strategy=fixed", "-S", "evolve.fresh=8", *extra, "-S", "train.epochs=1",
                                         "-S", f"seed={seed}"])
    kept.write_text(json.dumps(r))


def test_the_bar_reads_controls_on_the_arms_own_problems(tmp_path):
    """A rule trained on a curriculum's fresh draws is held to controls looped under the same curriculum:
    controls under the recipe's fixed problems are shown in controls.md, marked, and never read toward the bar."""
    for seed in (0, 1, 2):
        _kept(tmp_path, "mix-rule", seed, it0=0.2, it3=0.5, floor=0.3, correct3=[1, 1, 1, 1, 0, 0, 0, 0])
        _settings(tmp_path, "mix-rule", "rule", "mix", seed, fresh=128)
        for control in arms.CONTROLS:
            _kept(tmp_path, control, seed, it0=0.2, it3=0.0, floor=0.3, correct3=[0] * 8)
            _settings(tmp_path, control, control, None, seed, fresh=None)
    bar = _bar(tmp_path)
    assert bar["mix-rule"][-1] == "no" and bar["mix-rule"][6] == "; ".join(f"{c} (s0, s1, s2)" for c in arms.CONTROLS)
    assert "| mix-rule | random (other settings) | 3 |" in (tmp_path / "controls.md").read_text()
    for seed in (0, 1, 2):
        for control in arms.CONTROLS:
            _kept(tmp_path, f"mix-{control}", seed, it0=0.2, it3=0.125, floor=0.3, correct3=[1] + [0] * 7)
            _settings(tmp_path, f"mix-{control}", control, "mix", seed, fresh=128)
    bar = _bar(tmp_path)
    assert set(bar) == {"mix-rule"}  # a tagged control is a control, not an arm held to the bar
    assert bar["mix-rule"][6:] == ["none", "none", "yes"] and "(mix-" in bar["mix-rule"][5]
    controls = (tmp_path / "controls.md").read_text()
    assert "| mix-rule | mix-random | 3 |" in controls and "(other settings) |" not in controls


def test_a_seed_is_read_from_the_run_that_is_its_loop_today(tmp_path):
    _kept(tmp_path, "rule", 0, it0=0.2, it3=0.5, floor=0.3, correct3=[1, 1, 1, 1, 0, 0, 0, 0])
    _kept(tmp_path, "rule", 1, it0=0.2, it3=0.2, floor=0.3, correct3=[0] * 8)  # cut short by an older stop
    _kept(tmp_path, "nostop", 1, it0=0.2, it3=0.5, floor=0.3, correct3=[1, 1, 1, 1, 0, 0, 0, 0])  # carried on
    assert arms.load(tmp_path)["rule"][1]["metrics"]["it3"]["accuracy"] == 0.2
    (tmp_path / arms.SAME_LOOP).write_text("rule:\n  1:\n    run: nostop-s1\n    why: >-\n      cut by an\n      older stop\n")
    groups = arms.load(tmp_path)
    assert [r["seed"] for r in groups["rule"]] == [0, 1] and groups["rule"][1]["metrics"]["it3"]["accuracy"] == 0.5
    assert groups["rule"][1]["read_for"] == "s1 reads nostop-s1: cut by an older stop"
    assert "read_for" not in groups["nostop"][0]  # its own arm reads it as it is
    arms.write(tmp_path)
    assert "rule, s1 reads nostop-s1: cut by an older stop" in (tmp_path / "bar.md").read_text()
    for bad in ("rule:\n  1:\n    run: nosuch-s1\n    why: x\n", "rule:\n  0:\n    run: nostop-s1\n    why: x\n",
                "rule:\n  1:\n    run: nostop-s1\n", "other:\n  1:\n    run: nostop-s1\n    why: x\n"):
        (tmp_path / arms.SAME_LOOP).write_text(bad)
        with pytest.raises(SystemExit, match=arms.SAME_LOOP):
            arms.load(tmp_path)
