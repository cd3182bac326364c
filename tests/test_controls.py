"""The literature's control arms as judges (random, format, validity_only), the shortcut floors and the
per-category figures evaluate writes, each on a known input with a known output."""

import pandas as pd
import pytest

from self_improve.config import JudgeConfig, PairsConfig, TaskConfig
from self_improve.evaluation import gains, train_coverage
from self_improve.floors import floor_metrics, floor_table, policy_answers
from self_improve.judges import JudgeContext, judge_samples
from self_improve.pairs import build
from self_improve.tasks import task_for

from .test_label_free import QUESTION, _samples

# --- control arms ------------------------------------------------------------------------------------


def test_random_reward_is_seeded_uniform_and_knows_nothing_of_the_answer():
    s = pd.concat([_samples(["12", "9"] * 50, prompt_id=f"p{i}") for i in range(4)], ignore_index=True)
    a = judge_samples(s, JudgeConfig(method="random"), JudgeContext(seed=3))
    b = judge_samples(s, JudgeConfig(method="random"), JudgeContext(seed=3))
    c = judge_samples(s, JudgeConfig(method="random"), JudgeContext(seed=4))
    r = a["reward"].astype(float)
    assert list(r) == list(b["reward"].astype(float)) and list(r) != list(c["reward"].astype(float))
    assert r.between(0, 1).all() and 0.4 < r.mean() < 0.6 and r.nunique() == len(r)
    right = s["pred"] == "12"
    assert abs(r[right].mean() - r[~right].mean()) < 0.1  # the truth does not move it
    # the same sample keeps its reward whatever else is judged with it
    alone = judge_samples(s.iloc[[5]], JudgeConfig(method="random"), JudgeContext(seed=3))
    assert float(alone["reward"].iloc[0]) == float(r.iloc[5])


def test_random_is_held_to_a_pair_budget_by_a_seeded_draw():
    s = pd.concat([_samples(["12", "9", "7"], prompt_id=f"p{i}") for i in range(10)], ignore_index=True)
    judged = judge_samples(s, JudgeConfig(method="random"), JudgeContext(seed=0))
    every, _ = build(judged, PairsConfig(), seed=1)
    assert len(every) == 10
    four, _ = build(judged, PairsConfig(max_pairs=4), seed=1)
    assert len(four) == 4 and set(four["prompt_id"]) < set(every["prompt_id"])
    assert four.equals(build(judged, PairsConfig(max_pairs=4), seed=1)[0])
    assert len(build(judged, PairsConfig(max_pairs=40), seed=1)[0]) == 10


def test_format_rewards_a_short_uncut_response_that_ends_with_its_answer():
    responses = ["12", "9 + 3 = 12", "The answer is 12.", "12 apples, because 9 + 3",  # last number 3, not 12
                 "x" * 300 + " 12", "9 + 3 = 12", "no number here"]
    s = _samples(["12", "12", "12", "12", "12", "12", None], responses=responses)
    s.loc[5, "truncated"] = True
    out = judge_samples(s, JudgeConfig(method="format", format_max_chars=200))
    assert list(out["reward"].astype(float)) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    # right or wrong alike (the gold is 12): a well-formed wrong answer gets 1
    wrong = judge_samples(_samples(["13"], responses=["13"]), JudgeConfig(method="format"))
    assert float(wrong["reward"].iloc[0]) == 1.0


def test_validity_only_is_the_checks_verdict_alone_without_a_vote():
    responses = ["9 + 3 = 12", "Tom has 9 marbles.", "9 + 3 = 13 so 13", "3", "no answer"]
    s = _samples(["12", "9", "13", "3", None], responses=responses)
    first = judge_samples(s, JudgeConfig(method="validity_only"))  # restates: the first number only
    assert list(first["reward"].astype(float)) == [1.0, 0.0, 0.0, 1.0, 0.0]
    anyn = judge_samples(s, JudgeConfig(method="validity_only", restates="any"))
    assert list(anyn["reward"].astype(float)) == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert first["label"].isna().all()  # no vote, no label


# --- the shortcut floors -----------------------------------------------------------------------------


def test_policies_read_only_the_question():
    got = policy_answers([QUESTION, "Calculate 4 - 7.", "no numbers"], ["5", "7", "5", "3"])
    # "4 - 7": the numbers 4 and 7 (a minus between spaces is the operation), their sum 11
    assert got == {"sum": ["12", "11", None], "first": ["9", "4", None],
                   "last": ["3", "7", None], "mode": ["5", "5", "5"]}


def _word_math(**over):
    cfg = {"name": "word_math", "max_number": 20, "max_factor": 6, "heldout_size": 60, "ttt_size": 30,
           "instruction": "Answer with the final number only.", **over}
    task = task_for(TaskConfig(**cfg))
    return task, task.sets(0, 0)


def test_the_floor_is_the_best_policy_and_addition_gives_the_sum_away():
    task, sets = _word_math()
    table = floor_table(task, sets.heldout, sets.ttt)
    m = floor_metrics(table)
    assert m["floor/sum/add"] == 1.0 and m["floor/sum/sub"] == 0.0  # a + b is right on every sum only
    assert m["floor"] == max(m[f"floor/{p}"] for p in ("sum", "first", "last", "mode")) == m["floor/sum"]
    assert m["floor"] == pytest.approx(sum(m[f"floor/{c}"] for c in ("add", "sub", "mul")) / 3)
    # a model that answers the sum everywhere gains nothing over the floor; one that solves all, the rest
    answers = pd.DataFrame({"set": "heldout", "prompt_id": table["prompt_id"], "correct": table["sum"]})
    same = floor_metrics(table, answers)
    assert same["floor_gain"] == 0 and same["floor_gain_lo"] == same["floor_gain_hi"] == 0
    solved = floor_metrics(table, answers.assign(correct=1.0))
    assert solved["floor_gain"] == pytest.approx(1 - m["floor"]) and solved["floor_gain_lo"] > 0
    assert solved["floor_gain/add"] == 0 and solved["floor_gain_lo/sub"] > 0


def test_no_floor_where_a_policy_is_the_task():
    arithmetic = task_for(TaskConfig(heldout_size=20, ttt_size=20))
    sets = arithmetic.sets(0, 0)
    assert floor_table(arithmetic, sets.heldout, sets.ttt).empty and floor_metrics(floor_table(
        arithmetic, sets.heldout, sets.ttt)) == {}
    task, sets = _word_math(levels=["add"])  # word problems of one operation, addition: the sum is the task
    assert floor_metrics(floor_table(task, sets.heldout, sets.ttt)) == {}


# --- per-category gains and the training mix ---------------------------------------------------------


def test_gains_per_category_are_paired_within_the_category():
    ids = [f"h{i}" for i in range(40)]
    cats = ["add"] * 20 + ["mul"] * 20
    base = pd.DataFrame({"set": "heldout", "prompt_id": ids, "category": cats, "correct": [0.0] * 40})
    new = base.assign(correct=[1.0] * 20 + [0.0] * 20)  # addition learnt, multiplication not
    g = gains(base, new)
    assert g["accuracy_gain"] == 0.5 and g["accuracy_gain/add"] == 1.0 and g["accuracy_gain/mul"] == 0.0
    assert g["accuracy_gain_lo/add"] == 1.0 and g["accuracy_gain_hi/mul"] == 0.0
    assert g["accuracy_gain_lo"] < 0.5 < g["accuracy_gain_hi"]


def test_train_coverage_is_the_least_trained_categorys_share_against_its_held_out_share():
    held = pd.DataFrame({"category": ["add"] * 4 + ["sub"] * 4 + ["mul"] * 4})
    even = pd.DataFrame({"category": ["add", "sub", "mul"] * 5})
    assert train_coverage(even, held) == {"train_coverage": pytest.approx(1.0)}
    no_mul = pd.DataFrame({"category": ["add"] * 6 + ["sub"] * 4})
    assert train_coverage(no_mul, held) == {"train_coverage": 0.0}
    assert train_coverage(even, held.assign(category="add")) == {}  # one category: nothing to cover


def test_the_summary_shows_each_category_its_gain_and_the_floor():
    from self_improve.reporting import category_markdown

    df = pd.DataFrame([{"iteration": "it0", "accuracy/add": 0.2, "accuracy/sub": 0.1, "floor": 0.5,
                        "floor/add": 1.0, "floor/sub": 0.0},
                       {"iteration": "it1", "accuracy/add": 0.9, "accuracy/sub": 0.05,
                        "accuracy_gain/add": 0.7, "accuracy_gain_lo/add": 0.6, "accuracy_gain_hi/add": 0.8,
                        "accuracy_gain/sub": -0.05, "accuracy_gain_lo/sub": -0.1, "accuracy_gain_hi/sub": 0.0,
                        "floor_gain": -0.025, "floor_gain_lo": -0.05, "floor_gain_hi": 0.0,
                        "floor_gain/add": -0.1, "floor_gain_lo/add": -0.2, "floor_gain_hi/add": 0.0,
                        "floor_gain/sub": 0.05, "floor_gain_lo/sub": 0.0, "floor_gain_hi/sub": 0.1}])
    text = "\n".join(category_markdown(df))
    assert "floor" in text and "0.500" in text and "-0.025 [-0.050, +0.000]" in text
    assert "| add | 0.200 | 0.900 | +0.700 [+0.600, +0.800] | 1.000 | -0.100 [-0.200, +0.000] |" in text
    assert "| sub | 0.100 | 0.050 | -0.050 [-0.100, +0.000] | 0.000 | +0.050 [+0.000, +0.100] |" in text
    assert category_markdown(pd.DataFrame([{"iteration": "it0", "accuracy": 0.3}])) == []


def test_the_summary_names_the_rule_not_only_its_method():
    import yaml

    from self_improve.reporting import judge_name

    rule = yaml.safe_load(open("configs/rules/co_reward+validity_any.yaml"))["judge"]
    assert judge_name(JudgeConfig(**rule)) == "co_reward+validity+restates=any"
    assert judge_name(JudgeConfig(method="co_reward")) == "co_reward"  # defaults name nothing more
    gated = JudgeConfig(method="vote_share", min_share=0.5, low_consensus="penalise")
    assert judge_name(gated) == "vote_share+min_share=0.5+low_consensus=penalise"
    assert judge_name(JudgeConfig(method="random")) != judge_name(JudgeConfig(method="format"))
    # a stage reads params through its declared view: the report declares the whole judge section
    from self_improve.stage import Declared
    from self_improve.config import load_params
    from stages.report import PARAMS

    params = load_params()
    view = Declared(params.model_copy(update={"judge": JudgeConfig(**rule)}), PARAMS, "report")
    assert judge_name(view.judge) == "co_reward+validity+restates=any"
