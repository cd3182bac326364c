"""research/sum_share.py: a kept run's held-out answers read beside the sum of the question's numbers."""

import json

import pandas as pd
import pytest

from research import sum_share
from self_improve.stage import derive_seed
from self_improve.config import TaskConfig
from self_improve.tasks import task_for

PARAMS = {"seed": 3, "task.name": "word_math", "task.max_number": 30, "task.max_factor": 12,
          "task.heldout_size": 60, "task.ttt_size": 12, "task.dev_size": 12}


def kept_run(folder, params=PARAMS):
    """A kept run whose it0 answers every problem right and whose it1 answers the sum to every one."""
    task = task_for(TaskConfig(**{k.split(".", 1)[1]: v for k, v in params.items() if k.startswith("task.")}))
    held = task.sets(derive_seed(params["seed"], "split"), 0).heldout
    sums = sum_share.question_sums(task, list(held["prompt"]))
    rows = [dict(iteration=it, set="heldout", prompt_id=pid, category=cat, answer=gold, pred=pred,
                 correct=pred == gold)
            for it, preds in (("it0", held["answer"]), ("it1", sums))
            for pid, cat, gold, pred in zip(held["prompt_id"], held["category"], held["answer"], preds)]
    (folder / "run-s3").mkdir()
    pd.DataFrame(rows).to_parquet(folder / "run-s3" / "answers.parquet")
    (folder / "run-s3.json").write_text(json.dumps({"experiment": "run-s3", "params_set": params}))
    return held, sums


def test_sum_share_reads_the_shortcut_per_operation(tmp_path):
    held, sums = kept_run(tmp_path)
    task = task_for(TaskConfig(name="word_math"))
    assert sum_share.question_sums(task, ["Ann has 12 apples and gets 7 more. How many?\nAnswer."]) == ["19"]
    sum_share.main([str(tmp_path)])
    table = (tmp_path / "sum_share.md").read_text().splitlines()
    it0 = next(r for r in table if r.startswith("| run-s3 | it0 |")).split(" | ")
    it1 = next(r for r in table if r.startswith("| run-s3 | it1 |")).split(" | ")
    header = next(r for r in table if r.startswith("| run |")).split(" | ")
    assert header[3:6] == ["add", "mul", "sub"]
    assert it1[2:6] == ["1.000"] * 4  # every answer is the sum
    assert it1[7] == "1.000"  # ... which is right on every add problem
    add_right = (held["answer"] == pd.Series(sums, index=held.index))[held["category"] == "add"].mean()
    assert add_right == 1.0 and it0[6] == "1.000"


def test_sum_share_refuses_answers_of_another_set(tmp_path):
    kept_run(tmp_path, PARAMS)
    (tmp_path / "run-s3.json").write_text(json.dumps({"experiment": "run-s3", "params_set": PARAMS | {"seed": 4}}))
    with pytest.raises(SystemExit, match="gold answers differ"):
        sum_share.main([str(tmp_path)])


GYM = {"seed": 2, "task.name": "reasoning_gym", "task.heldout_size": 24, "task.ttt_size": 6, "task.dev_size": 6,
       "task.datasets": [{"name": "basic_arithmetic", "label": "ba", "weight": 1,
                          "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
                                     "allow_parentheses": False, "allow_negation": False,
                                     "operators": ["+", "-", "*"]}}]}


def test_sum_share_reads_a_reasoning_gym_run_per_operation(tmp_path):
    """The arithmetic mix's categories name the expression's operation: the table has a column each."""
    pytest.importorskip("reasoning_gym")
    held, sums = kept_run(tmp_path, GYM)
    sum_share.main([str(tmp_path)])
    table = (tmp_path / "sum_share.md").read_text().splitlines()
    header = next(r for r in table if r.startswith("| run |")).split(" | ")
    cats = sorted(held["category"].unique())
    assert set(cats) <= {"ba.add", "ba.mul", "ba.sub"} and header[3:3 + len(cats)] == cats
    it1 = next(r for r in table if r.startswith("| run-s3 | it1 |")).split(" | ")
    assert it1[2:3 + len(cats)] == ["1.000"] * (1 + len(cats))


def test_sum_share_refuses_a_task_without_operations(tmp_path):
    kept_run(tmp_path)
    (tmp_path / "run-s3.json").write_text(json.dumps({"experiment": "run-s3",
                                                      "params_set": PARAMS | {"task.name": "arithmetic"}}))
    with pytest.raises(SystemExit, match="not one of word_math, reasoning_gym"):
        sum_share.main([str(tmp_path)])
