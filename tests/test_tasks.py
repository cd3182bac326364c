"""Tasks: answers read and checked the way the field does it, word problems and their rewrites,
the user's GSM8K/MATH files, model-written paraphrases, and log-prob judges."""

from __future__ import annotations

import json
import random

import pandas as pd
import pytest
import torch
import yaml

from self_improve import artifacts as art
from self_improve.config import EvolveConfig, JudgeConfig, TaskConfig
from self_improve.errors import ConfigError
from self_improve.tasks import ProposeInput, task_for
from self_improve.tasks.answers import Extracted, equivalent, extract, gold_answer, normalise
from self_improve.tasks.word_math import Generator, WordProblem, parse

from .conftest import ROOT, TINY, deep_merge, run_all

# (response, answer, form): verbose chains of thought, several numbers, \boxed{} with fractions,
# #### with commas, units, negative numbers, no answer
EXTRACTION = [
    ("Natalia sold 48/2 = 24 clips in May.\nAltogether she sold 48 + 24 = 72 clips.\n#### 72", "72", "gsm8k"),
    ("#### 1,234", "1234", "gsm8k"),
    ("She pays 3 * $4 = $12 per week, so in 10 weeks $120.\n#### $120", "120", "gsm8k"),
    ("He has 5 + 3 = 8 apples. #### 8. Then he eats 2.", "8", "gsm8k"),
    ("Two answers? #### 5 and later #### 6", "6", "gsm8k"),
    ("The answer is 1,000 dollars.", "1000", "answer_is"),
    ("First, 12 + 30 = 42. Then 42 - 2 = 40. The final answer is 40.", "40", "answer_is"),
    ("Final answer: -7", "-7", "answer_is"),
    ("Answer: 3/4", "0.75", "answer_is"),
    ("The answer is $42$.", "42", "answer_is"),
    ("So the answer is 12.50.", "12.5", "answer_is"),
    ("We get $x = \\boxed{\\frac{1}{2}}$.", "0.5", "boxed"),
    ("Thus $\\boxed{\\dfrac{5}{6}}$ of the cake is eaten.", "5/6", "boxed"),
    ("$\\sqrt{48} = \\boxed{4\\sqrt{3}}$", "4\\sqrt{3}", "boxed"),
    ("First $\\boxed{3}$ is wrong; redoing it gives $\\boxed{9}$.", "9", "boxed"),
    ("The remainder is \\boxed{-2}.", "-2", "boxed"),
    ("\\boxed{\\text{72 apples}}", "72", "boxed"),
    ("Sam has 5 apples and buys 14 more, so 5 + 14 = 19 apples.", "19", "last_number"),
    ("There were 20 eggs. 20 - 8 = 12 eggs are left in the box.", "12", "last_number"),
    ("The temperature dropped to -5 degrees.", "-5", "last_number"),
    ("72.0", "72", "last_number"),
    ("He runs 3.5 km a day, so in 4 days he runs 14 km", "14", "last_number"),
    ("It costs $1,250.00 in total", "1250", "last_number"),
    ("12 / 3 = 4 per box", "4", "last_number"),
    ("There are 12 eggs and 3 boxes, so each box gets 12/3", "4", "last_number"),
    ("About 50% of them", "50", "last_number"),
    ("Leo has 7-2=5 left", "5", "last_number"),
    ("68", "68", "last_number"),
    ("I am not sure how to solve this problem.", None, None),
    ("", None, None),
    ("The answer is unknown.", None, None),
    ("Let me think step by step about the apples.", None, None),
]


@pytest.mark.parametrize("response,answer,form", EXTRACTION)
def test_extraction_reads_the_stated_answer_and_records_its_form(response, answer, form):
    assert extract(response) == Extracted(answer, form)


def test_extraction_table_is_broad():
    forms = {f for _, _, f in EXTRACTION}
    assert len(EXTRACTION) >= 30 and forms == {"gsm8k", "answer_is", "boxed", "last_number", None}


@pytest.mark.parametrize("answer,gold,same", [
    ("1,000", "1000", True), ("1000", "1,000", True), ("72.0", "72", True), ("72", "72.00", True),
    ("\\frac{1}{2}", "0.5", True), ("0.5", "1/2", True), ("-3", "-3", True), ("3", "-3", False),
    ("2\\sqrt{3}", "\\sqrt{12}", True), ("\\frac{3}{4}", "\\dfrac{6}{8}", True), ("x+1", "1+x", True),
    ("41", "42", False), ("0.33", "1/3", False), (None, "1", False), ("1", None, False),
])
def test_equivalence_numbers_exactly_the_rest_by_math_verify(answer, gold, same):
    a = normalise(answer) if answer is not None else None
    g = normalise(gold) if gold is not None else None
    assert equivalent(a, g) is same


def test_gold_answers_as_data_sets_write_them():
    assert gold_answer("Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 72") == "72"
    assert gold_answer("So $x = \\boxed{\\frac{1}{2}}$.") == "0.5"
    assert gold_answer("#### 1,680") == "1680"
    assert gold_answer("  17 ") == "17" and gold_answer("") is None and gold_answer(None) is None


def test_math_verify_off_the_main_thread_does_not_use_signals():
    import threading

    got = []
    t = threading.Thread(target=lambda: got.append(equivalent("2\\sqrt{2}", "\\sqrt{8}")))
    t.start()
    t.join()
    assert got == [True]


# --- word_math ---------------------------------------------------------------------------------------

def test_word_problems_parse_back_in_every_phrasing():
    for style in range(27):
        p = WordProblem(12, (("add", 5), ("sub", 4), ("div", 13)), "Mia", "coins", style)
        assert parse(p.prompt) == p and p.answer == "1"
    with pytest.raises(ValueError):
        parse("What is 2+2?")


def test_word_math_rewrites_keep_the_gold_answer_and_the_problem():
    gen, rng = Generator(20), random.Random(0)
    for chain in [("add",), ("sub",), ("mul",), ("div",), ("add", "sub"), ("sub", "mul", "add"), ("add", "div")]:
        for _ in range(20):
            p = gen.problem(chain, rng)
            if p is None:
                continue
            assert p.solution.endswith(f"#### {p.answer}") and gold_answer(p.solution) == p.answer
            rewrites = gen.rewrites(p, 3, rng)
            assert len(rewrites) == 3 and len({q.prompt for q in rewrites} | {p.prompt}) == 4
            for q in rewrites:
                assert q.answer == p.answer and parse(q.prompt).key == p.key and q.category == p.category
            m = gen.mutate(p, rng)
            assert m is None or (m.category == p.category and m.key != p.key and int(m.answer) >= 0)


def test_word_math_sets_are_disjoint_in_any_wording_and_balanced():
    cfg = TaskConfig(name="word_math", heldout_size=40, ttt_size=40, levels=["add", "sub", "mul+div"])
    task = task_for(cfg)
    sets = task.sets(0, 40)
    keys = {name: {task.parse(p).key for p in df["prompt"]}
            for name, df in (("heldout", sets.heldout), ("ttt", sets.ttt), ("seed", sets.seed))}
    assert not keys["heldout"] & keys["ttt"] and not keys["heldout"] & keys["seed"]
    assert sets.heldout["category"].value_counts().to_dict() == {"add": 14, "sub": 13, "mul+div": 13}
    assert all(r.endswith(f"#### {gold_answer(r)}") for r in sets.seed["response"])
    inp = ProposeInput(EvolveConfig(strategy="eva", fresh=30, rewrites=2), "it1", 0, sets.ttt, sets.heldout,
                       art.empty_table(art.JUDGMENTS))
    out = task.propose(inp)
    assert not {task.parse(p).key for p in out["prompt"]} & keys["heldout"]
    for _, group in out.groupby("group_id"):
        assert group["answer"].nunique() == 1 and len(group) == 3
    assert (out["source"] == "fresh").sum() == 30 * 3


def test_sec_steers_the_whole_mix_when_asked():
    """sec_scope mix: the bandit allocates as many problems as the test-time set and the fresh ones
    together; each category takes its test-time problems first and fresh draws for the rest, so a
    category the curriculum favours fills the mix. sec_scope fresh keeps every test-time problem."""
    from self_improve.curriculum import BanditState, allocate

    cfg = TaskConfig(name="word_math", heldout_size=30, ttt_size=30, levels=["add", "sub", "mul"], max_number=30,
                     max_factor=12)  # V3's ranges: enough distinct problems for every draw
    task = task_for(cfg)
    sets = task.sets(0, 30)
    state = BanditState(q={"add": 0.0, "mul": 0.5, "sub": 0.1}, temperature=0.5)
    base = dict(strategy="sec", fresh=12, rewrites=0)
    whole = task.propose(ProposeInput(EvolveConfig(**base, sec_scope="mix"), "it1", 3, sets.ttt, sets.heldout,
                                      art.empty_table(art.JUDGMENTS), curriculum=state))
    fresh = task.propose(ProposeInput(EvolveConfig(**base), "it1", 3, sets.ttt, sets.heldout,
                                      art.empty_table(art.JUDGMENTS), curriculum=state))
    assert (fresh["source"] == "ttt").sum() == 30 and (fresh["source"] == "fresh").sum() == 12
    assert len(whole) == 42  # the same budget
    want = allocate(state, 42, random.Random(3))  # the same draw: the mix's allocation is the first use of the rng
    got = whole["category"].value_counts().to_dict()
    assert got == {c: n for c, n in want.items() if n}
    ttt_by = sets.ttt["category"].value_counts().to_dict()
    for cat, n in want.items():  # test-time problems first, fresh draws only past them
        used = whole[(whole["category"] == cat) & (whole["source"] == "ttt")]
        assert len(used) == min(n, ttt_by[cat]) and set(used["prompt"]) <= set(sets.ttt["prompt"])
        assert (whole[whole["category"] == cat]["source"] == "fresh").sum() == max(0, n - ttt_by[cat])
    assert got["mul"] > got["add"]  # the favoured category takes more of the mix


def test_word_math_sets_are_stratified_by_level_and_a_level_that_runs_out_is_named():
    # one-step mul with numbers to 30 and factors to 5 has 116 distinct problems, fewer than a third of 512
    with pytest.raises(ConfigError, match="task.heldout_size: word_math level 'mul' ran out of distinct "
                                          "problems at 116 of the 170 .*max_factor 5"):
        task_for(TaskConfig(name="word_math", max_number=30, heldout_size=512, ttt_size=128)).sets(0, 0)
    # factors to 12: 319, enough for a third of held-out, test-time and dev alike
    task = task_for(TaskConfig(name="word_math", max_number=30, max_factor=12, heldout_size=512, ttt_size=128,
                               dev_size=128))
    sets = task.sets(0, 16)
    assert sets.heldout["category"].value_counts().to_dict() == {"add": 171, "sub": 171, "mul": 170}
    for df in (sets.ttt, sets.dev):
        assert df["category"].value_counts().to_dict() == {"add": 43, "sub": 43, "mul": 42}
    held, ttt, dev = ({task.parse(p).key for p in df["prompt"]} for df in (sets.heldout, sets.ttt, sets.dev))
    assert (len(held), len(ttt), len(dev)) == (512, 128, 128)
    assert not held & ttt and not held & dev and not ttt & dev
    assert max(int(task.parse(p).problem.steps[0][1]) for p, c in zip(sets.heldout["prompt"], sets.heldout["category"])
               if c == "mul") == 12
    # the test-time set runs out after the held-out set took its share: named too
    with pytest.raises(ConfigError, match="task.ttt_size: word_math level 'mul'"):
        task_for(TaskConfig(name="word_math", max_number=30, heldout_size=300, ttt_size=100)).sets(0, 0)


def test_word_math_instruction_line_is_shown_and_parsed_back():
    task = task_for(TaskConfig(name="word_math", heldout_size=4, ttt_size=4, instruction="End with: #### N"))
    sets = task.sets(0, 0)
    assert all(p.endswith("\nEnd with: #### N") for p in sets.heldout["prompt"])
    assert task.parse(sets.heldout["prompt"][0]).answer == sets.heldout["answer"][0]


# --- the user's GSM8K / MATH files ----------------------------------------------------------------------

GSM8K = {"name": "math_file", "prompt_file": str(ROOT / "data/inputs/gsm8k_sample.jsonl"),
         "columns": {"prompt": "question", "answer": "answer"}}
MATH = {"name": "math_file", "prompt_file": str(ROOT / "data/inputs/math_sample.jsonl"),
        "columns": {"prompt": "problem", "answer": "solution", "category": "type"}}


@pytest.mark.parametrize("task", [GSM8K, MATH], ids=["gsm8k", "math"])
def test_gold_solutions_fed_back_as_responses_are_all_verified_right(task):
    cfg = TaskConfig(**task)
    t = task_for(cfg)
    rows = [json.loads(line) for line in open(cfg.prompt_file)]
    sets = t.sets(0, 0)
    gold = dict(zip(pd.concat([sets.heldout, sets.ttt])["prompt"], pd.concat([sets.heldout, sets.ttt])["answer"]))
    assert len(gold) == len(rows) == 12
    for row in rows:
        solution = row[cfg.columns["answer"]]
        assert t.verify(t.extract(solution).answer, gold[row[cfg.columns["prompt"]]]) == 1.0
    assert t.verify(None, "72") == 0.0 and t.verify("71", "72") == 0.0


@pytest.mark.parametrize("line,where", [
    ('{"question": "", "answer": "#### 1"}', "row 2, column 'question': empty"),
    ('{"question": "How many?", "answer": null}', "row 2, column 'answer': no answer"),
    ('{"question": 7, "answer": "#### 1"}', "row 2, column 'question': question must be a string"),
    ('{"answer": "#### 1"}', "row 2, column 'question': question is missing"),
    ('not json', "row 2: not valid JSON"),
])
def test_a_malformed_math_file_is_refused_naming_file_row_and_column(tmp_path, line, where):
    from self_improve.errors import ConfigError

    f = tmp_path / "gsm.jsonl"
    f.write_text('{"question": "What is 2+3?", "answer": "2+3=5\\n#### 5"}\n' + line + "\n")
    with pytest.raises(ConfigError) as err:
        task_for(TaskConfig(**{**GSM8K, "prompt_file": str(f)})).sets(0, 0)
    assert str(err.value).startswith(f"{f}: {where}")


def test_a_separate_heldout_file_is_held_out_and_never_trained_on(tmp_path):
    rows = [json.loads(line) for line in open(ROOT / "data/inputs/gsm8k_sample.jsonl")]
    held = tmp_path / "held.jsonl"
    held.write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))
    sets = task_for(TaskConfig(**GSM8K, heldout_file=str(held))).sets(0, 0)
    assert list(sets.heldout["prompt"]) == [r["question"] for r in rows[:3]]
    assert len(sets.ttt) == 9 and not set(sets.ttt["prompt"]) & set(sets.heldout["prompt"])
    assert len(sets.seed) == 9 and all("####" in r for r in sets.seed["response"])


def test_paraphrases_keep_every_number_and_are_not_near_duplicates():
    task = task_for(TaskConfig(**GSM8K))
    q = "Tom reads 15 pages a day. How many pages does he read in 2 weeks?"
    written = [["Rewritten question: Each day Tom reads 15 pages; how many pages in 2 weeks?",
                "Tom reads 16 pages a day. How many pages in 2 weeks?",
                q, "", "\"Over 2 weeks, how many pages does Tom read at 15 pages daily?\""]]
    kept, dropped = task.paraphrases([q], 5, lambda template, prompts, n: written, [])
    assert kept == [["Each day Tom reads 15 pages; how many pages in 2 weeks?",
                     "Over 2 weeks, how many pages does Tom read at 15 pages daily?"]]
    assert dropped == {"changed_numbers": 1, "empty": 1, "near_duplicate": 1}
    # a paraphrase that is (nearly) a held-out question never reaches training
    held = ["Over 2 weeks, how many pages does Tom read at 15 pages a day?"]
    kept, dropped = task.paraphrases([q], 5, lambda template, prompts, n: written, held)
    assert kept == [["Each day Tom reads 15 pages; how many pages in 2 weeks?"]]
    assert dropped == {"changed_numbers": 1, "empty": 1, "near_duplicate": 1, "near_heldout": 1}


# --- through the stages, on a small pretrained chat model ------------------------------------------------

def _loop(tmp_path_factory, bpe_model_dir, name, over):
    work = tmp_path_factory.mktemp(name)
    raw = deep_merge(TINY, deep_merge({"model": {"base": str(bpe_model_dir), "max_length": 256},
                                       "sample": {"max_new_tokens": 8, "k": 2}, "evaluate": {"max_new_tokens": 8},
                                       "train": {"algorithm": "dpo", "batch_size": 8, "lora": {"r": 4, "alpha": 8}}},
                                      over))
    params = work / "params.yaml"
    params.write_text(yaml.safe_dump(raw))
    mp = pytest.MonkeyPatch()
    try:
        run_all(work, params, mp)
    finally:
        mp.undo()
    return work


@pytest.mark.loop
def test_word_math_loop_with_co_reward_on_a_chat_model(tmp_path_factory, bpe_model_dir):
    work = _loop(tmp_path_factory, bpe_model_dir, "word-math", {
        "task": {"name": "word_math", "heldout_size": 8, "ttt_size": 8},
        "evolve": {"fresh": 4, "keep_top": 2, "rewrites": 2}, "judge": {"method": "co_reward"}})
    prompts = art.read_table(work / "data/it1/prompts.parquet", art.PROMPTS)
    assert prompts.groupby("group_id")["variant"].nunique().eq(3).all()  # the generator's rewrites
    samples = art.read_table(work / "data/it1/samples.parquet", art.SAMPLES)
    assert set(samples["pred_form"].dropna()) <= {"gsm8k", "answer_is", "boxed", "last_number"}
    for it in ("it1", "it2", "it3"):
        m = art.read_json(work / "reports" / "iterations" / it / "metrics.json")
        assert m["rewrites_per_problem"] == 2.0
        judged = art.read_table(work / "data" / it / "judgments.parquet", art.JUDGMENTS)
        assert m["extract_failure_rate"] == pytest.approx(judged["pred"].isna().mean())
        assert "eval_extract_failure_rate" in m


@pytest.mark.loop
def test_math_file_loop_with_model_paraphrases_and_a_yes_logprob_judge(tmp_path_factory, bpe_model_dir):
    work = _loop(tmp_path_factory, bpe_model_dir, "gsm8k", {
        "task": GSM8K, "evolve": {"fresh": 4, "keep_top": 2, "rewrites": 1},
        "judge": {"method": "llm_judge", "mode": "yes_logprob"}})
    heldout = art.read_table(work / "data/task/heldout.parquet", art.PROMPTS)
    assert len(heldout) == 3 and heldout["answer"].notna().all()
    judged = art.read_table(work / "data/it1/judgments.parquet", art.JUDGMENTS)
    # nothing to parse: a verdict for every judgment that fits the context (max_length 256 here)
    scored = judged["reward"].dropna()
    assert len(scored) >= 0.75 * len(judged) and scored.between(0, 1).all() and judged["parse_rate"].isna().all()
    m = art.read_json(work / "reports/iterations/it1/metrics.json")
    assert "judge_auc" in m or judged["correct"].nunique() < 2
    assert "accuracy" in m and "win_rate" not in m  # answers: accuracy, not a rubric win rate


@pytest.mark.loop
def test_co_reward_on_a_math_file_asks_the_model_for_paraphrases(tmp_path_factory, bpe_model_dir):
    work = _loop(tmp_path_factory, bpe_model_dir, "gsm8k-co", {
        "task": GSM8K, "evolve": {"strategy": "fixed", "rewrites": 2}, "judge": {"method": "co_reward"}})
    prov = art.read_provenance(work / "data/it1/prompts.parquet")
    assert prov["paraphrases_asked"] == 2 * 9
    prompts = art.read_table(work / "data/it1/prompts.parquet", art.PROMPTS)
    kept = (prompts["variant"] > 0).sum()
    assert kept == prov["paraphrases_kept"]


# --- log-prob judges ----------------------------------------------------------------------------------------

def test_next_token_probs_match_a_plain_forward_pass_whatever_the_batch(bpe_model_dir):
    from self_improve.engines.hf import chat_format, label_token_ids, next_token_probs
    from self_improve.models.loading import load_model

    model, tok = load_model(bpe_model_dir, device="cpu")
    turns = ["1+2=", "Is 23+45=68 right?", "99+99="]
    together = next_token_probs(model, tok, turns, ["1", "2", "3"], prefill="Score: ", progress=False)
    chat = chat_format(model, tok)
    ids_of = label_token_ids(tok, ["1", "2", "3"])
    for turn, got in zip(turns, together):
        ids = torch.tensor([chat.prompt_ids(turn) + tok("Score: ", add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            p = torch.softmax(model(input_ids=ids).logits[0, -1].float(), -1)
        assert got == pytest.approx([float(p[i].sum()) for i in ids_of], abs=1e-5)
    alone = [next_token_probs(model, tok, [t], ["1", "2", "3"], prefill="Score: ", progress=False)[0] for t in turns]
    for a, b in zip(together, alone):
        assert a == pytest.approx(b, abs=1e-5)


def test_score_logprob_is_the_expected_rubric_score(bpe_model_dir):
    from self_improve.engines.hf import next_token_probs
    from self_improve.config import judge_of
    from self_improve.judges import JudgeContext, ModelHandle
    from self_improve.judges.rubric import render
    from self_improve.models.loading import load_model

    model, tok = load_model(bpe_model_dir, device="cpu")
    template = "Rate 1 to 5: {instruction} <response>{response}</response>"  # the rubric is too long for this model
    frame = pd.DataFrame({"prompt_id": ["a", "a", "b"], "prompt": ["1+2=", "1+2=", "5+5="],
                          "response": ["3", "4", "10"]})
    cfg = JudgeConfig(method="llm_judge", mode="score_logprob")
    v = judge_of("llm_judge").function()(frame, cfg, JudgeContext(policy=ModelHandle(model, tok), template=template,
                                                                      progress=False))
    for (prompt, response), got in zip(zip(frame["prompt"], frame["response"]), v.reward):
        p = next_token_probs(model, tok, [render(template, prompt, response)], [str(k) for k in range(1, 6)],
                             prefill="Score: ", progress=False)[0]
        assert got == pytest.approx(sum((k + 1) * pk for k, pk in enumerate(p)) / sum(p) / 5)


@pytest.mark.parametrize("section,value,message", [
    ("task", {"levels": ["add", "pow"]}, "task.levels: 'pow' is not a chain of 1 to 3 of add, sub, mul, div"),
    ("task", {"levels": ["add+add+add+add"]}, "task.levels: 'add+add+add+add' is not a chain"),
    ("task", {"columns": {"question": "q"}}, "task.columns: 'question' is not one of prompt, answer, category"),
    ("task", {"columns": {"answer": "a"}}, "task.columns: the mapping needs `prompt`"),
    ("task", {"name": "math_file", "columns": {"prompt": "q"}}, "task.columns: math_file needs `answer`"),
    ("judge", {"mode": "vibes"}, "judge.mode: Input should be 'generate', 'score_logprob' or 'yes_logprob'"),
])
def test_bad_task_and_judge_values_are_refused_naming_the_key(section, value, message):
    from self_improve.config import load_params, parse_params
    from self_improve.errors import ConfigError

    raw = load_params(ROOT / "params.yaml").model_dump(mode="json")
    raw[section] = {**raw[section], **value}
    with pytest.raises(ConfigError) as err:
        parse_params(raw)
    assert message in str(err.value)
