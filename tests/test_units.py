"""Pure units: tasks, judges, pairs, losses, atomic writes."""

import random

import pandas as pd
import pytest

from self_improve import artifacts as art
from self_improve.config import JudgeConfig, PairsConfig, TaskConfig
from self_improve.judges import JudgeContext, judge_quality, judge_samples, vote_label
from self_improve.pairs import build
from self_improve.tasks import arithmetic
from self_improve.tasks.arithmetic import ArithmeticTask, Problem, extract_answer, verify


def test_extract_and_verify():
    assert extract_answer("68") == "68"
    assert extract_answer(" 068abc") == "68"
    assert extract_answer("-5") == "-5"
    assert extract_answer("") is None
    assert extract_answer("x68") is None
    assert extract_answer(None) is None
    assert verify("68", "68") == 1.0
    assert verify(None, "68") == 0.0
    assert verify("68", None) is None


def test_split_is_disjoint_including_commuted_forms():
    task = ArithmeticTask(TaskConfig(heldout_size=100, ttt_size=200))
    heldout, ttt, train = task.split(seed=1, train_size=500)
    assert (len(heldout), len(ttt), len(train)) == (100, 200, 500)
    held = {p.unordered for p in heldout}
    assert not held & {p.unordered for p in ttt + train}
    assert not set(ttt) & set(train)
    assert task.split(seed=1, train_size=500) == (heldout, ttt, train)


def test_rewrites_share_the_answer_and_avoid_forbidden():
    task = ArithmeticTask(TaskConfig())
    p = Problem(23, 45)
    forbidden = {(33, 35)}
    rw = task.rewrites(p, 5, random.Random(0), forbidden)
    assert len(rw) == 5 and len(set(rw)) == 5 and p not in rw
    assert rw[0] == Problem(45, 23)
    for q in rw:
        assert q.answer == p.answer and q.unordered not in forbidden
        assert 10 <= q.a <= 99 and 10 <= q.b <= 99


def test_vote_label():
    assert vote_label(["1", "1", "2"], 0.2) == "1"
    assert vote_label(["1", "2"], 0.2) is None  # tie
    assert vote_label([None, None], 0.2) is None
    assert vote_label(["1", "2", "3", "4", "5", "6"], 0.2) is None  # tie at the top
    assert vote_label(["1", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10"], 0.2) is None  # share 2/11


def _samples(rows):
    df = pd.DataFrame(rows, columns=["prompt_id", "group_id", "pred", "answer"])
    df["iteration"] = "it1"
    df["variant"] = 0
    df["source"] = "ttt"
    df["category"] = "c"
    df["prompt"] = df["prompt_id"]
    df["sample_id"] = [f"{p}/s{i}" for i, p in enumerate(df["prompt_id"])]
    df["response"] = df["pred"].fillna("??")
    return df


def test_majority_vote_and_co_reward():
    s = _samples([
        ("a/v0", "a", "5", "7"), ("a/v0", "a", "5", "7"), ("a/v0", "a", "7", "7"),
        ("a/v1", "a", "7", "7"), ("a/v1", "a", "7", "7"), ("a/v1", "a", None, "7"),
    ])
    mv = judge_samples(s, JudgeConfig(method="majority_vote"))
    # per prompt: v0's majority is the wrong "5", v1's is "7"
    assert list(mv["label"]) == ["5", "5", "5", "7", "7", "7"]
    assert list(mv["reward"]) == [1.0, 1.0, 0.0, 1.0, 1.0, 0.0]
    assert mv["correct"].isna().all()  # no task's check given: no ground truth to compare with
    co = judge_samples(s, JudgeConfig(method="co_reward"), JudgeContext(verify=arithmetic.verify))
    # pooled over the rewrites, "7" wins 3 to 2, so v0's wrong majority is overruled
    assert set(co["label"]) == {"7"}
    assert list(co["reward"]) == [0.0, 0.0, 1.0, 1.0, 1.0, 0.0]
    assert list(co["correct"]) == [0.0, 0.0, 1.0, 1.0, 1.0, 0.0]
    q = judge_quality(co, verify=arithmetic.verify)
    assert q["judge_accuracy"] == 1.0 and q["label_accuracy"] == 1.0
    assert judge_quality(co)["label_accuracy"] is None  # no judge assumes one task's check


def test_self_judges_never_see_ground_truth():
    s = _samples([("a", "a", "1", "2"), ("a", "a", "3", "2")])
    out = judge_samples(s, JudgeConfig(method="majority_vote"))
    assert out["reward"].isna().all()  # a tie: no verdict, and the answer "2" is not used
    assert out["label"].isna().all()
    ver = judge_samples(s, JudgeConfig(method="verifier"), JudgeContext(verify=arithmetic.verify))
    assert list(ver["reward"]) == [0.0, 0.0]
    with pytest.raises(ValueError, match="verifier needs the task's check"):
        judge_samples(s, JudgeConfig(method="verifier"))


def _judged(rewards, responses=None, prompt="p"):
    n = len(rewards)
    return pd.DataFrame({
        "iteration": "it1", "prompt_id": prompt, "prompt": prompt,
        "sample_id": [f"{prompt}/s{i}" for i in range(n)],
        "response": responses or [f"r{i}" for i in range(n)],
        "reward": pd.array(rewards, dtype="Float64"),
        "correct": pd.array([None] * n, dtype="Float64"),
    })


def test_pairs_highest_vs_lowest_ties_and_nulls_dropped():
    df = pd.concat([
        _judged([1.0, 0.0, None, 0.5], prompt="a"),
        _judged([1.0, 1.0], prompt="tie"),
        _judged([None, None], prompt="null"),
        _judged([1.0, 0.0], responses=["same", "same"], prompt="same"),
    ])
    pairs, best = build(df, PairsConfig(), seed=0)
    assert list(pairs["prompt_id"]) == ["a"]
    row = pairs.iloc[0]
    assert (row["chosen"], row["rejected"]) == ("r0", "r1")
    assert (row["chosen_reward"], row["rejected_reward"]) == (1.0, 0.0)
    assert sorted(best["prompt_id"]) == ["a", "same", "tie"]
    assert (pairs["chosen"] != pairs["rejected"]).all()


def test_pairs_are_seeded():
    df = _judged([1.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    a = build(df, PairsConfig(), seed=3)[0]
    assert a.equals(build(df, PairsConfig(), seed=3)[0])
    picks = {tuple(build(df, PairsConfig(), seed=s)[0].iloc[0][["chosen", "rejected"]]) for s in range(20)}
    assert len(picks) > 1


def test_pairs_margin():
    df = _judged([0.6, 0.5])
    assert len(build(df, PairsConfig(min_margin=0.2), seed=0)[0]) == 0
    assert len(build(df, PairsConfig(min_margin=0.05), seed=0)[0]) == 1


def test_atomic_write_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out.parquet"
    with pytest.raises(RuntimeError):
        with art.atomic_path(target) as tmp:
            tmp.write_text("partial")
            raise RuntimeError("crash")
    assert list(tmp_path.iterdir()) == []


def test_write_json_keeps_the_last_whole_file_and_optionally_the_key_order(tmp_path):
    target = tmp_path / "figures.json"
    art.write_json({"b": 1, "a": 2}, target, sort_keys=False)
    assert list(art.read_json(target)) == ["b", "a"]
    with pytest.raises(TypeError):  # not serialisable: fails mid-write
        art.write_json({"b": 1, "a": object()}, target)
    assert art.read_json(target) == {"b": 1, "a": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["figures.json"]


def test_parquet_roundtrip_is_byte_identical(tmp_path):
    df = pd.DataFrame({"iteration": ["it1"], "prompt_id": ["p"], "prompt": ["1+2="], "response": ["3"],
                       "reward": [None], "correct": [1.0]})
    art.write_table(df, tmp_path / "a.parquet", art.SFT, {"x": 1})
    art.write_table(df, tmp_path / "b.parquet", art.SFT, {"x": 1})
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    back = art.read_table(tmp_path / "a.parquet", art.SFT)
    assert back["reward"].isna().all()
    assert art.read_provenance(tmp_path / "a.parquet") == {"x": 1}
    with pytest.raises(art.ArtifactError, match="missing columns"):
        art.read_table(tmp_path / "a.parquet", art.PAIRS)
