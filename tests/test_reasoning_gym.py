"""The reasoning_gym task: reasoning-gym's datasets graded by their own scorers, sets disjoint and
seeded, bad datasets refused before any stage runs, and a loop on a chat model."""

import re

import pytest
import yaml

from self_improve import artifacts as art
from self_improve.config import TaskConfig
from self_improve.errors import ConfigError
from self_improve.floors import metric_name
from self_improve.tasks import task_for

from .conftest import ROOT

pytest.importorskip("reasoning_gym")

DATASETS = [
    {"name": "chain_sum", "label": "chain_sum-2", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1,
                                                             "max_digits": 1}},
    {"name": "chain_sum", "label": "chain_sum-3", "config": {"min_terms": 3, "max_terms": 3, "min_digits": 1,
                                                             "max_digits": 2}},
    {"name": "basic_arithmetic", "weight": 0.5},
    {"name": "gsm_symbolic"},
]


def _task(**over):
    cfg = {"name": "reasoning_gym", "heldout_size": 40, "ttt_size": 20, "datasets": DATASETS,
           "instruction": "Answer with the final number only.", **over}
    return task_for(TaskConfig(**cfg))


def _key(prompt):
    return " ".join(prompt.lower().split())


def test_sets_are_seeded_disjoint_by_content_and_split_by_weight():
    task = _task()
    a, b = task.sets(0, 30), task.sets(0, 30)
    assert a.heldout.equals(b.heldout) and a.ttt.equals(b.ttt) and a.seed.equals(b.seed)
    assert not a.heldout.equals(task.sets(1, 30).heldout)
    held, ttt, seed = ({_key(p) for p in df["prompt"]} for df in (a.heldout, a.ttt, a.seed))
    assert len(held) == 40 and len(ttt) == 20 and len(seed) == 30
    assert not held & ttt and not held & seed and not ttt & seed
    # weights 1, 1, 0.5, 1 of 40: 11.4, 11.4, 5.7, 11.4 -> 12, 11, 6, 11 (largest remainders, ties to the first)
    entries = a.heldout["category"].map(task.entry_label)
    assert entries.value_counts().to_dict() == {"chain_sum-2": 12, "chain_sum-3": 11,
                                                "basic_arithmetic": 6, "gsm_symbolic": 11}
    # an arithmetic expression's category names its operations: a policy that learns one of them shows
    for cat, question in zip(a.heldout["category"], a.heldout["prompt"]):
        entry, _, ops = cat.partition(".")
        if entry == "gsm_symbolic":
            assert not ops  # a word problem has no expression in its metadata
            continue
        assert ops and all(op in ("add", "sub", "mul", "div") for op in ops.split("+")), cat
        assert ("+" in question.split("\n")[0]) == ("add" in ops.split("+")), (cat, question)
    assert task.categories(a) == sorted(set(a.heldout["category"]) | set(a.ttt["category"]))
    assert all(p.endswith("\nAnswer with the final number only.") for p in a.heldout["prompt"])


def test_a_category_names_its_entry_and_its_operations():
    from self_improve.tasks.reasoning_gym import category_of

    assert category_of("chain_sum-2x12", {"expression": "34 - 21"}) == "chain_sum-2x12.sub"
    assert category_of("basic_arithmetic", {"expression": "-3 * 4 + 2 - 1"}) == "basic_arithmetic.add+sub+mul"
    assert category_of("gsm_symbolic", {"question": "Sam has 3 apples"}) == "gsm_symbolic"
    task = _task()
    assert task.entry_label("chain_sum-2.sub") == "chain_sum-2" and task.entry_label("gsm_symbolic") == "gsm_symbolic"
    assert task.entry_label("nope.add") is None and task.entry_label(None) is None


def test_a_dev_set_leaves_held_out_and_test_time_as_they_were_and_is_disjoint():
    plain, with_dev = _task().sets(0, 10), _task(dev_size=16).sets(0, 10)
    assert plain.heldout.equals(with_dev.heldout) and plain.ttt.equals(with_dev.ttt)
    dev = {_key(p) for p in with_dev.dev["prompt"]}
    assert len(dev) == 16
    assert not dev & {_key(p) for df in (with_dev.heldout, with_dev.ttt, with_dev.seed) for p in df["prompt"]}


def test_gold_is_right_and_a_wrong_answer_wrong_for_every_dataset():
    task = _task()
    sets = task.sets(0, 0)
    for row in sets.heldout.itertuples():
        assert task.verify(row.answer, row.answer, row.category) == 1.0, row
        wrong = str(int(float(row.answer)) + 1)
        assert task.verify(wrong, row.answer, row.category) == 0.0, row
        assert task.verify(None, row.answer, row.category) == 0.0
    assert task.verify("5", None, "chain_sum-2") is None


def test_a_missing_answer_read_from_a_table_is_wrong_not_an_error():
    import pandas as pd

    task = _task()
    row = task.sets(0, 0).heldout.iloc[0]
    preds = pd.DataFrame({"pred": [row.answer, None]})["pred"]  # pandas >= 3 holds the None as NaN
    assert [task.verify(p, row.answer, row.category) for p in preds] == [1.0, 0.0]
    assert task.verify(float("nan"), row.answer, None) == 0.0


def test_grading_agrees_with_the_datasets_own_scorers_on_real_looking_responses():
    import reasoning_gym
    from reasoning_gym.utils import extract_answer

    task = _task()
    cases = []
    for i, entry_cfg in enumerate(DATASETS):
        ds = reasoning_gym.create_dataset(entry_cfg["name"], size=6, seed=100 + i, **entry_cfg.get("config", {}))
        label = entry_cfg.get("label", entry_cfg["name"])
        for entry in ds:
            gold = str(entry["answer"])
            other = str(int(float(gold)) + 7)
            for text in (f"<answer>{gold}</answer>", f"Let me think. <answer>{other}</answer>",
                         f"<answer> {gold} </answer>", f"<answer>{gold}.0</answer>", f"<answer>+{gold}</answer>"):
                cases.append((ds, entry, label, text))
    agree = 0
    for ds, entry, label, text in cases:
        theirs = ds.score_answer(extract_answer(text), entry) >= 1.0
        ours = task.verify(task.extract(text).answer, str(entry["answer"]), label) == 1.0
        agree += theirs == ours
        if "+" not in text and ".0<" not in text:  # formats the scorers themselves disagree on
            assert theirs == ours, (text, entry["answer"])
    assert agree / len(cases) >= 0.8


@pytest.mark.parametrize("datasets,match", [
    ([{"name": "no_such_dataset"}], r"task.datasets\[0\]"),
    ([{"name": "chain_sum", "config": {"no_such_key": 1}}], r"task.datasets\[0\]"),
    ([{"name": "chain_sum", "config": {"min_terms": 5, "max_terms": 2}}], r"task.datasets\[0\]"),
])
def test_bad_datasets_are_refused_naming_the_entry(datasets, match):
    with pytest.raises(ConfigError, match=match):
        _task(datasets=datasets)


BASIC_NO_PARENS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "allow_parentheses": False,
                   "allow_negation": False}


def test_basic_arithmetic_division_without_parentheses_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"task.datasets\[1\].config.operators: .*Calculate 5 / 9"):
        _task(datasets=[DATASETS[0], {"name": "basic_arithmetic", "config": BASIC_NO_PARENS}])
    _task(datasets=[{"name": "basic_arithmetic", "config": {**BASIC_NO_PARENS, "operators": ["+", "-", "*"]}}])


def test_the_refused_setting_has_wrong_gold_answers_and_the_gym_recipes_setting_none():
    """Why the refusal: reasoning-gym's own draws, the question's expression evaluated against the
    gold. Without parentheses its `/` problems mostly disagree (if none did, the refusal could go);
    without `/` (the smollm2-gym recipe's setting) every gold is the expression's value."""
    gym = pytest.importorskip("reasoning_gym")

    def value(expression: str) -> float | None:  # digits, spaces and + - * / only
        try:
            return eval(expression)
        except ZeroDivisionError:  # "7 / 0" is drawn too, with a number for its gold
            return None

    def wrong(config):
        ds = gym.create_dataset("basic_arithmetic", size=400, seed=0, **config)
        return [e for e in ds if value(e["metadata"]["expression"]) != float(e["answer"])]

    divisions = [e for e in wrong(BASIC_NO_PARENS) if "/" in e["question"]]
    assert len(divisions) > 40, divisions[:3]  # 83 of 91 with seed 0
    recipe = yaml.safe_load((ROOT / "configs/recipes/smollm2-gym.yaml").read_text())
    basic = next(d for d in recipe["task"]["datasets"] if d["name"] == "basic_arithmetic")
    assert wrong(basic["config"]) == []


def test_too_few_distinct_problems_is_refused():
    tiny = [{"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}]
    with pytest.raises(ConfigError, match=r"too few distinct problems"):
        _task(datasets=tiny, heldout_size=400).sets(0, 0)


@pytest.mark.parametrize("task,match", [
    ({"datasets": [{"name": "nope"}]}, "task.datasets[0]"),
    ({"datasets": [{"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1,
                                                    "max_digits": 1}}], "heldout_size": 400}, "too few distinct"),
])
def test_check_params_refuses_a_bad_dataset_before_any_stage(tmp_path, tiny_raw, capsys, monkeypatch, task, match):
    from stages import check_params

    monkeypatch.chdir(tmp_path)
    raw = {**tiny_raw, "task": {**tiny_raw["task"], "name": "reasoning_gym", **task}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(SystemExit) as err:
        check_params.main(["--out", "data/params.ok", "--params", "params.yaml"])
    assert err.value.code != 0
    assert match in capsys.readouterr().err
    assert not (tmp_path / "data/params.ok").exists()


def test_a_mix_the_curriculum_cannot_steer_is_refused_naming_the_key(tmp_path, tiny_raw, capsys, monkeypatch):
    """`sec` on a file of the user's poses `evolve.fresh` of its test-time problems by category and has no
    fresh draws to fill a category with: `sec_scope: mix` is refused by check_params (before any stage) and
    by propose, not ignored; reasoning_gym and the procedural tasks draw fresh problems, and take it."""
    from self_improve.config import EvolveConfig
    from self_improve.tasks.base import check_scope
    from stages import check_params

    mix = EvolveConfig(strategy="sec", sec_scope="mix")
    gsm = task_for(TaskConfig(name="math_file", prompt_file=str(ROOT / "data/inputs/gsm8k_sample.jsonl")))
    with pytest.raises(ConfigError, match="evolve.sec_scope: mix .* task 'math_file'"):
        check_scope(gsm, mix)
    check_scope(gsm, EvolveConfig(strategy="sec"))  # fresh: the file task's own way
    check_scope(_task(), mix)
    check_scope(task_for(TaskConfig(name="word_math")), mix)
    monkeypatch.chdir(tmp_path)
    raw = {**tiny_raw, "task": {**tiny_raw["task"], "name": "math_file",
                                "prompt_file": str(ROOT / "data/inputs/gsm8k_sample.jsonl")},
           "evolve": {**tiny_raw.get("evolve", {}), "strategy": "sec", "sec_scope": "mix"}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(SystemExit) as err:
        check_params.main(["--out", "data/params.ok", "--params", "params.yaml"])
    assert err.value.code != 0 and "evolve.sec_scope" in capsys.readouterr().err
    assert not (tmp_path / "data/params.ok").exists()


LADDER = [
    {"name": "chain_sum", "label": "easy", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1,
                                                      "max_digits": 1}},
    {"name": "chain_sum", "label": "hard", "config": {"min_terms": 3, "max_terms": 3, "min_digits": 1,
                                                      "max_digits": 2}},
]


def _mix_input(task, sets, q, iteration="it1", seed=11, fresh=24):
    from self_improve.config import EvolveConfig
    from self_improve.curriculum import BanditState
    from self_improve.tasks import ProposeInput

    state = BanditState(q=q, temperature=0.05)
    return ProposeInput(EvolveConfig(strategy="sec", sec_scope="mix", fresh=fresh, rewrites=0), iteration, seed,
                        sets.ttt, sets.heldout, sets.ttt.iloc[:0], curriculum=state, rewrites=False)


def test_sec_with_mix_steers_the_whole_mix_over_levels_with_fresh_draws():
    """The bandit's allocation of test-time and fresh problems together: a category the bandit favours
    takes all its test-time problems, then fresh draws of its own level and operation, each with the
    dataset's gold, never a held-out or test-time question; seeded by the iteration."""
    from self_improve.curriculum import allocate
    import random

    task = _task(datasets=LADDER, heldout_size=40, ttt_size=20)
    sets = task.sets(0, 0)
    cats = task.categories(sets)
    hard = [c for c in cats if c.startswith("hard.")]
    q = {c: (1.0 if c in hard else 0.0) for c in cats}  # the bandit favours the hard level
    inp = _mix_input(task, sets, q)
    df = task.propose(inp)
    want = allocate(inp.curriculum, len(sets.ttt) + 24, random.Random(11))
    assert sum(want[c] for c in hard) == len(df)  # temperature 0.05: every problem goes to the hard level
    assert df["category"].value_counts().to_dict() == {c: n for c, n in want.items() if n}
    fresh = df[df["source"] == "fresh"]
    posed_ttt = df[df["source"] == "ttt"]
    assert set(posed_ttt["category"]) <= set(hard) and len(fresh) == len(df) - len(posed_ttt)
    assert len(posed_ttt) == sets.ttt["category"].isin(hard).sum()  # its test-time problems first
    assert inp.stats["fresh_by_category"] == {c: n for c, n in (fresh["category"].value_counts()).items()}
    keys = {_key(p) for p in (*sets.heldout["prompt"], *sets.ttt["prompt"])}
    assert not keys & {_key(p) for p in fresh["prompt"]} and fresh["prompt"].is_unique
    for prompt, answer, cat in zip(fresh["prompt"], fresh["answer"], fresh["category"]):
        expression = task.question(prompt).rsplit(":", 1)[1].strip().rstrip("=").strip()  # "4 - 1 - 7 ="
        assert len(expression.split()) == 5 and str(eval(expression)) == answer and cat.startswith("hard.")
        ops = {"+": "add", "-": "sub"}
        assert cat == "hard." + "+".join(o for o in ("add", "sub") if o in {ops[t] for t in expression.split()[1::2]})
    assert df.equals(task.propose(_mix_input(task, sets, q)))  # the same iteration seed: the same mix
    other = task.propose(_mix_input(task, sets, q, iteration="it2", seed=12))
    assert set(other.loc[other["source"] == "fresh", "prompt"]) != set(fresh["prompt"])


def test_fresh_draws_that_run_out_of_distinct_problems_say_so():
    """A level with few distinct problems gives what it has, and the prompts' provenance counts the rest."""
    task = _task(datasets=LADDER, heldout_size=40, ttt_size=20)
    sets = task.sets(0, 0)
    easy = [c for c in task.categories(sets) if c.startswith("easy.")]
    inp = _mix_input(task, sets, {c: (1.0 if c in easy else 0.0) for c in task.categories(sets)}, fresh=600)
    df = task.propose(inp)
    assert df["prompt"].is_unique and set(df["category"]) <= set(easy)
    assert sum(inp.stats["fresh_short"].values()) > 0  # 2 one-digit terms: 200 problems at most
    assert len(df) + sum(inp.stats["fresh_short"].values()) == len(sets.ttt) + 600


@pytest.mark.loop
def test_a_loop_on_reasoning_gym_with_a_chat_model(tmp_path_factory, bpe_model_dir):
    from tests.test_tasks import _loop

    work = _loop(tmp_path_factory, bpe_model_dir, "gym", {
        "task": {"name": "reasoning_gym", "heldout_size": 8, "ttt_size": 8, "datasets": DATASETS[:2],
                 "instruction": "Answer with the final number only."},
        "evolve": {"fresh": 4, "keep_top": 2, "rewrites": 1}, "judge": {"method": "majority_vote"}})
    heldout = art.read_table(work / "data/task/heldout.parquet", art.PROMPTS)
    assert set(heldout["category"].str.split(".").str[0]) == {"chain_sum-2", "chain_sum-3"}
    counts = heldout["category"].map(metric_name).value_counts()  # a metric key's characters: add+sub -> add_sub
    for it in ("it0", "it1", "it2", "it3"):
        m = art.read_json(work / "reports" / "iterations" / it / "metrics.json")
        assert m["heldout_n"] == 8
        per = {c: m[f"accuracy/{c}"] for c in counts.index}  # per dataset / level and operation
        assert m["accuracy"] == pytest.approx(sum(per[c] * n for c, n in counts.items()) / 8)
        # the shortcut floors: each policy, the best as the floor, per category, and the gain over it
        assert m["floor"] == max(m[f"floor/{p}"] for p in ("sum", "first", "last", "mode"))
        assert all(f"floor/{c}" in m for c in counts.index)
        assert m["floor_gain_lo"] <= m["floor_gain"] <= m["floor_gain_hi"]
        if it != "it0":  # per category gains over it0 with paired intervals, and the training mix's coverage
            for c in counts.index:
                assert m[f"accuracy_gain_lo/{c}"] <= m[f"accuracy_gain/{c}"] <= m[f"accuracy_gain_hi/{c}"]
                assert m[f"accuracy_gain/{c}"] == pytest.approx(per[c] - art.read_json(
                    work / "reports" / "iterations" / "it0" / "metrics.json")[f"accuracy/{c}"])
            assert 0 <= m["train_coverage"]
        answers = art.read_table(work / "data" / it / "eval.parquet", art.EVAL)
        held = answers[answers["set"] == "heldout"]
        task = _task(datasets=DATASETS[:2])
        cats = dict(zip(heldout["prompt_id"], heldout["category"]))
        assert m["accuracy"] == pytest.approx(held["correct"].astype(float).mean())
        assert list(held["correct"]) == [task.verify(p if isinstance(p, str) else None, a, cats[i])
                                         for p, a, i in zip(held["pred"], held["answer"], held["prompt_id"])]
        # each test-time problem answered in its second wording too: the choice reads the cross-view agreement
        assert (answers["set"] == "ttt_view").sum() == 8 and 0 <= m["lf_supported_agreement"] <= m["lf_agreement"] <= 1


@pytest.mark.unit
def test_fresh_draws_every_iteration_are_a_recipe():
    """`smollm2-gym long fresh-mix`: sec steers the whole mix, the 128 test-time problems and 128 drawn
    new from reasoning-gym each iteration, none a held-out or test-time question, other ones at it2."""
    from self_improve import recipes
    from self_improve.config import parse_params
    from self_improve.curriculum import BanditState
    from self_improve.tasks import ProposeInput

    names = ["smollm2-gym", "long", "fresh-mix"]
    raw = recipes.apply(yaml.safe_load((ROOT / "params.yaml").read_text()), recipes.load_all(names, ROOT))
    params = parse_params(raw, " ".join(names))
    assert (params.evolve.strategy.value, params.evolve.sec_scope.value, params.evolve.fresh) == ("sec", "mix", 128)
    task = task_for(params.task)
    sets = task.sets(0, params.prepare.train_size)
    flat = BanditState(q={c: 0.0 for c in task.categories(sets)}, temperature=params.evolve.sec_temperature)

    def posed(iteration, seed):
        return task.propose(ProposeInput(params.evolve, iteration, seed, sets.ttt, sets.heldout, sets.ttt.iloc[:0],
                                         curriculum=flat, rewrites=False))

    it1, it2 = posed("it1", 1), posed("it2", 2)
    fresh = it1[it1["source"] == "fresh"]
    assert len(it1) == 256 and len(fresh) == 128 and it1["prompt"].is_unique
    assert not {_key(p) for p in (*sets.heldout["prompt"], *sets.ttt["prompt"])} & {_key(p) for p in fresh["prompt"]}
    assert set(fresh["prompt"]) != set(it2.loc[it2["source"] == "fresh", "prompt"])


def test_each_gym_arithmetic_problem_has_a_second_wording_that_evaluate_answers():
    """The task's second wording of a test-time problem: the other template, operands reversed where the
    operation commutes, answered by the evaluate stage beside the first (evaluation.rewritten) as a task
    with rewrites is."""
    from self_improve.evaluation import rewritten
    from self_improve.tasks.reasoning_gym import other_wording as view

    assert view("Calculate 4 * 7.") == "State the final answer to the following arithmetic problem: 7 * 4 ="
    assert view("State the final answer to the following arithmetic problem: 87 - 80 =") == "Calculate 87 - 80."
    assert view("State the final answer to the following arithmetic problem: 1 + 4 + 9 =") == "Calculate 9 + 4 + 1."
    assert view("Calculate 2 - 3 * 4.") == "State the final answer to the following arithmetic problem: 2 - 3 * 4 ="
    assert view("What is 3 + 4?") is None
    task = _task(datasets=DATASETS[:2])  # chain_sum: every question one expression
    ttt = task.sets(0, 10).ttt
    views = rewritten(task, ttt, 0)
    assert list(views["prompt_id"]) == list(ttt["prompt_id"]) and not set(views["prompt"]) & set(ttt["prompt"])
    for posed, other in zip(ttt["prompt"], views["prompt"]):
        assert other.endswith("\nAnswer with the final number only.")
        assert sorted(re.findall(r"\d+", posed)) == sorted(re.findall(r"\d+", other))  # the same numbers
        assert task.question(posed).startswith("Calculate") != task.question(other).startswith("Calculate")
    mixed = _task(datasets=DATASETS).sets(0, 10).ttt  # gsm_symbolic's word problems have no second wording
    words = mixed["category"].str.startswith("gsm_symbolic")
    assert words.any() and set(rewritten(_task(datasets=DATASETS), mixed, 0)["prompt_id"]) == set(mixed["prompt_id"][~words])
