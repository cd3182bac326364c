"""Screening seeds' base models without a loop (research/base_screen.py): the table, bad input refused,
a failing seed keeping no table. That only it0's stages run, that their figures are the loop's own
it0 and that a done workspace is read rather than rerun is tested beside the plain loop
(tests/test_plain.py), whose seed it screens."""

from __future__ import annotations

import pytest

from research import base_screen


@pytest.mark.unit
def test_seeds_and_ranges_are_read_once_each_in_order():
    assert base_screen.parse_seeds(["14-16", "3", "3", "15"]) == [3, 14, 15, 16]
    with pytest.raises(SystemExit, match="'a-b' is not a seed"):
        base_screen.parse_seeds(["a-b"])


@pytest.mark.unit
def test_table_gives_the_agreement_the_base_never_samples_and_the_seeds_over_a_share():
    results = {7: {"accuracy": 0.108, "lf_agreement": 0.701, "lf_supported_agreement": 0.518, "lf_distinct": 0.027},
               3: {"accuracy": 0.45, "lf_agreement": 0.47, "lf_supported_agreement": 0.469, "lf_distinct": 0.2},
               5: {"accuracy": 0.3}}  # kept before the signals: blank cells
    text = base_screen.table(results, above=0.10)
    rows = [line for line in text.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [r.split(" | ")[0] for r in rows] == ["| 3", "| 5", "| 7"]
    assert rows[2] == "| 7 | 0.108 | 0.701 | 0.518 | 0.183 | 0.027 |"
    assert rows[1] == "| 5 | 0.300 |  |  |  |  |"
    assert text.rstrip().endswith("over 0.1 of the problems: 7 (1 of 3).")
    assert "over" not in base_screen.table(results)


@pytest.mark.unit
def test_a_seed_override_or_a_malformed_one_is_refused_before_any_workspace(tmp_path):
    for bad, named in ((["seed=3"], "seeds come from --seeds"), (["task.heldout_size"], "expected key=value")):
        with pytest.raises(SystemExit, match=named):
            base_screen.main(["--seeds", "1", "--workdir", str(tmp_path / "w"), *[x for b in bad for x in ("-S", b)]])
    assert not (tmp_path / "w").exists()


@pytest.mark.unit
def test_a_recipe_sets_the_params_under_the_overrides_and_a_missing_one_is_refused(tmp_path):
    import yaml
    raw = yaml.safe_load(base_screen.params_text(4, base_screen.with_recipe("smollm2-v2", ["task.heldout_size=64"])))
    assert raw["seed"] == 4 and raw["model"]["base"] == "models/smollm2-135m-instruct"
    assert raw["task"]["instruction"] == "Answer with the final number only."  # a recipe string read back whole
    assert raw["task"]["heldout_size"] == 64 and raw["task"]["ttt_size"] == 128  # -S wins where both set a key
    assert base_screen.with_recipe(None, ["a=1"]) == ["a=1"]
    with pytest.raises(SystemExit, match="--recipe: recipe nope.*not found"):
        base_screen.main(["--seeds", "1", "--recipe", "nope", "--workdir", str(tmp_path / "w")])
    assert not (tmp_path / "w").exists()


@pytest.mark.loop
def test_a_failing_base_names_the_seed_and_keeps_no_table(tmp_path, capsys):
    out = tmp_path / "screen.md"
    with pytest.raises(SystemExit, match="failed on seeds 2"):
        base_screen.main(["--seeds", "2", "-S", "task.heldout_size=-1", "--workdir", str(tmp_path / "w"),
                          "--out", str(out)])
    assert not out.exists()
    err = capsys.readouterr().err
    assert "seed 2: the base stages failed" in err and "task.heldout_size" in err
