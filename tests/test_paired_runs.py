"""Two kept runs set against each other problem by problem (research/paired_runs.py), and the answers
a kept run carries for it (runners/experiments.py keep_answers)."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest

from research import paired_runs
from runners.experiments import ROOT, keep_answers
from self_improve import artifacts as art
from self_improve.quality import paired_gain


def eval_rows(it: str, correct: list[int], *, which: str = "heldout", gold: list[str] | None = None,
              ids: list[str] | None = None) -> pd.DataFrame:
    n = len(correct)
    return pd.DataFrame({"iteration": it, "set": which, "prompt_id": ids or [f"h{i}" for i in range(n)],
                         "category": ["add", "mul"] * (n // 2) + ["add"] * (n % 2), "answer": gold or [str(i) for i in range(n)], "response": "long text " * 20,
                         "pred": [str(i) if c else "x" for i, c in enumerate(correct)],
                         "correct": [float(c) for c in correct], "truncated": False, "valid": True,
                         "restates": False, "frozen_yes": None})


def kept_run(tmp_path, name: str, per_it: dict[str, list[int]], **kw) -> pd.DataFrame:
    rows = pd.concat([eval_rows(it, c, **kw) for it, c in per_it.items()], ignore_index=True)
    path = tmp_path / name / "answers.parquet"
    path.parent.mkdir(parents=True)
    art.write_table(rows, path, art.KEPT_EVAL)
    return rows


@pytest.mark.unit
def test_a_kept_workspace_keeps_every_iterations_answers_with_their_texts_and_categories(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy2(ROOT / "params.yaml", work / "params.yaml")  # loop: it1..it3
    for it, c in (("it0", [1, 0, 0]), ("it1", [1, 1, 0])):
        (work / "data" / it).mkdir(parents=True)
        art.write_table(eval_rows(it, c), work / "data" / it / "eval.parquet", art.EVAL)
    (work / "data" / "it9").mkdir()  # an iteration the params do not list (left by an older run)
    art.write_table(eval_rows("it9", [0, 0, 0]), work / "data" / "it9" / "eval.parquet", art.EVAL)
    kept = art.read_table(keep_answers(work, tmp_path / "answers.parquet"), art.KEPT_EVAL)
    assert list(kept.columns) == art.EVAL.names  # responses and categories: a claim re-read after the workspace is gone
    assert (kept["response"] == "long text " * 20).all() and list(kept["category"][:3]) == ["add", "mul", "add"]
    assert kept.groupby("iteration")["correct"].sum().to_dict() == {"it0": 1.0, "it1": 2.0}
    (tmp_path / "unevaluated").mkdir()
    shutil.copy2(ROOT / "params.yaml", tmp_path / "unevaluated" / "params.yaml")
    assert keep_answers(tmp_path / "unevaluated", tmp_path / "none.parquet") is None
    assert not (tmp_path / "none.parquet").exists()


@pytest.mark.unit
def test_two_runs_of_one_seed_compare_problem_by_problem(tmp_path):
    a = kept_run(tmp_path, "a", {"it0": [1, 0, 0, 1, 0, 0, 1, 0], "it3": [1, 0, 0, 1, 0, 0, 1, 0]})
    b = kept_run(tmp_path, "b", {"it0": [1, 0, 0, 1, 0, 0, 1, 0], "it3": [1, 1, 1, 1, 0, 0, 1, 1]})
    table = paired_runs.compare(a, b)
    assert list(table["iteration"]) == ["it0", "it3"]
    it0, it3 = table.iloc[0], table.iloc[1]
    assert (it0["a"], it0["b"], it0["difference"], it0["lo"], it0["hi"]) == (0.375, 0.375, 0.0, 0.0, 0.0)
    assert (it3["a"], it3["b"], it3["difference"], it3["n"]) == (0.375, 0.75, 0.375, 8)
    want = paired_gain(a[a["iteration"] == "it3"]["correct"], b[b["iteration"] == "it3"]["correct"])
    assert (it3["lo"], it3["hi"]) == (want["lo"], want["hi"]) and 0 < it3["lo"] < 0.375 < it3["hi"]
    # the command reads the report directories and prints the same row
    paired_runs.main([str(tmp_path / "a"), str(tmp_path / "b"), "--iteration", "it3",
                      "--out", str(tmp_path / "cmp.md")])
    text = (tmp_path / "cmp.md").read_text()
    assert "| it3 | 8 | 0.375 | 0.750 | +0.375 [" in text and "it0 |" not in text


@pytest.mark.unit
def test_runs_that_answered_other_problems_are_refused_naming_one(tmp_path):
    kept_run(tmp_path, "a", {"it3": [1, 0, 1]})
    kept_run(tmp_path, "b", {"it3": [1, 0, 1]}, ids=["h0", "h1", "h7"])
    kept_run(tmp_path, "c", {"it3": [1, 0, 1]}, gold=["0", "1", "99"])
    with pytest.raises(SystemExit, match="h2 is answered by a only"):
        paired_runs.main([str(tmp_path / "a"), str(tmp_path / "b")])
    with pytest.raises(SystemExit, match="problem h2 has gold '2' in a and '99' in c"):
        paired_runs.main([str(tmp_path / "a"), str(tmp_path / "c")])
    with pytest.raises(SystemExit, match="file not found"):
        paired_runs.main([str(tmp_path / "a"), str(tmp_path / "nowhere")])
    assert not list(tmp_path.glob("*.md"))
