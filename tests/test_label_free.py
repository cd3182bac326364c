"""The label-free rules, each on a known input with a known output: ScPO's vote share and vote-margin
weights, RESTRAIN's gate, Self-Harmony's cross-view label, the validity check, the frozen judge."""


import pandas as pd
import pytest
import torch

from self_improve.config import JudgeConfig, PairsConfig, TaskConfig, parse_params
from self_improve.judges import JudgeContext, ModelHandle, judge_samples
from self_improve.judges.validity import copied_sentence, false_calculation, invalid_reason, numbers
from self_improve.judges.votes import answer_scores, frozen_weights, harmonic_scores, top_answer
from self_improve.pairs import build
from self_improve.tasks import task_for
from self_improve.training.losses import dpo_loss, weighted_mean, with_nll

from .conftest import TINY, deep_merge

QUESTION = "Tom has 9 marbles. He buys 3 more marbles. How many marbles does Tom have now?"


def _samples(preds, prompt_id="p", variants=None, responses=None, prompt=QUESTION):
    n = len(preds)
    return pd.DataFrame({
        "iteration": "it1", "prompt_id": prompt_id, "group_id": "g",
        "variant": variants if variants is not None else [0] * n, "source": "ttt", "category": "c",
        "prompt": prompt, "answer": "12", "sample_id": [f"{prompt_id}/s{i}" for i in range(n)],
        "response": responses if responses is not None else [f"So the answer is {p}." for p in preds],
        "pred": preds, "pred_form": "answer_is", "truncated": False,
    })


# ScPO: reward = vote share, pairs most- vs least-voted, weighted by the vote margin


def test_vote_share_rewards_each_answer_by_its_votes_and_pairs_carry_the_vote_margin():
    s = _samples(["12"] * 5 + ["9", "9", None])
    out = judge_samples(s, JudgeConfig(method="vote_share", min_share=0.5))
    assert list(out["reward"]) == [5 / 8] * 5 + [2 / 8, 2 / 8, 0.0]
    assert set(out["label"]) == {"12"}
    pairs, _ = build(out, PairsConfig(weight="margin"), seed=0)
    (row,) = pairs.to_dict("records")
    assert row["chosen"] == "So the answer is 12." and row["rejected"] == "So the answer is None."
    assert row["weight"] == pytest.approx(5 / 8)  # (5 votes - 0 votes) / k
    unweighted, _ = build(out, PairsConfig(), seed=0)
    assert unweighted["weight"].isna().all()


def test_the_vote_gate_skips_prompts_without_a_majority_and_unanimous_prompts_give_no_pair():
    # RESTRAIN / ScPO: a top answer under half the votes gives no verdict at all
    split = judge_samples(_samples(["1", "1", "2", "3", "4"]), JudgeConfig(method="vote_share", min_share=0.5))
    assert split["reward"].isna().all() and split["label"].isna().all()
    half = judge_samples(_samples(["1", "1", "2", "3"]), JudgeConfig(method="vote_share", min_share=0.5))
    assert list(half["reward"]) == [0.5, 0.5, 0.25, 0.25]
    same = judge_samples(_samples(["7"] * 4), JudgeConfig(method="majority_vote", min_share=0.5))
    assert list(same["reward"]) == [1.0] * 4
    pairs, _ = build(same, PairsConfig(), seed=0)
    assert pairs.empty  # unanimous: nothing to prefer


def test_weighted_preference_loss_is_the_mean_of_weight_times_loss_and_zero_weight_gives_no_gradient():
    pc = torch.tensor([-1.0, -2.0], requires_grad=True)
    pr, rc, rr = torch.tensor([-3.0, -1.0]), torch.tensor([-2.0, -2.0]), torch.tensor([-2.0, -2.0])
    w = torch.tensor([0.75, 0.0])
    loss, _ = dpo_loss(pc, pr, rc, rr, 0.5, w)
    per = -torch.nn.functional.logsigmoid(0.5 * ((pc - rc) - (pr - rr)))
    assert loss.item() == pytest.approx(float((w * per).sum() / 2))
    loss.backward()
    assert pc.grad[1].item() == 0.0 and pc.grad[0].item() < 0
    plain, _ = dpo_loss(pc, pr, rc, rr, 0.5)
    assert plain.item() == pytest.approx(weighted_mean(per, torch.ones(2)).item())
    nll = torch.tensor([2.0, 4.0])
    assert with_nll(torch.tensor(0.0), nll, 1.0, w).item() == pytest.approx(0.75)
    with pytest.raises(ValueError, match="weights must be >= 0"):
        weighted_mean(per, torch.tensor([1.0, -1.0]))


# Self-Harmony: the harmonic mean of an answer's shares in the original wording and its rewrites


def test_harmonic_label_needs_both_views_where_the_pooled_vote_ties():
    preds = ["7", "7", "7", "9", "9", "9", "8", "8"]
    variants = [0, 0, 0, 0, 1, 1, 1, 1]
    assert harmonic_scores(preds, variants) == pytest.approx({"7": 0.0, "9": 2 * 0.25 * 0.5 / 0.75, "8": 0.0})
    s = _samples(preds, variants=variants).assign(prompt_id=[f"v{v}" for v in variants])
    pooled = judge_samples(s, JudgeConfig(method="co_reward"))
    assert pooled["label"].isna().all()  # 7 and 9 tie at 3 votes each
    harmony = judge_samples(s, JudgeConfig(method="co_reward", cross_view="harmonic"))
    assert set(harmony["label"]) == {"9"}
    assert list(harmony["reward"]) == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    gated = judge_samples(s, JudgeConfig(method="co_reward", cross_view="harmonic", min_harmony=0.5))
    assert gated["label"].isna().all()  # 0.333 < 0.5
    assert harmonic_scores(["7", "7"], [0, 0]) == {}  # no rewrite: no second view


def test_harmonic_is_refused_for_a_judge_without_rewrites():
    with pytest.raises(ValueError, match="cross_view: harmonic compares co_reward"):
        JudgeConfig(method="majority_vote", cross_view="harmonic")


# the validity check


def test_validity_reasons_on_known_responses():
    assert numbers("Tom has 9 marbles and 1,200 more, 3.5") == ["9", "1200", "3.5"]
    assert invalid_reason(QUESTION, "Tom has 9 marbles.", "9") == "restates"
    assert invalid_reason(QUESTION, "He buys 3 more marbles.", "3") == "copies"
    assert copied_sentence(QUESTION, "He buys 3 more marbles.", "3") == "He buys 3 more marbles."
    assert invalid_reason(QUESTION, "9 + 3 = 13. The answer is 13.", "13") == "false_calc"
    assert invalid_reason(QUESTION, "9 + 3 = 12. The answer is 12.", "12") is None
    assert invalid_reason(QUESTION, "I do not know", None) is None
    assert false_calculation("2 + 3 + 4 = 9") is None  # a chain's tail is not read as 3 + 4 = 9
    assert false_calculation("12 x 3 = 36, 7 / 2 = 3.5, 5 - 8 = -3") is None
    assert false_calculation("6 * 7 = 41") == "6 * 7 = 41"


def test_word_math_right_answers_are_never_rejected_for_restating():
    one = task_for(TaskConfig(name="word_math", max_number=100, heldout_size=500, ttt_size=10))
    for prompt, answer in zip(one.sets(0, 0).heldout["prompt"], one.sets(0, 0).heldout["answer"]):
        assert invalid_reason(one.question(prompt), f"The answer is {answer}.", answer) is None, prompt
    two = task_for(TaskConfig(name="word_math", levels=["add+sub", "sub+add", "mul+sub"], max_number=20,
                              heldout_size=300, ttt_size=10))
    sets = two.sets(0, 0)
    back_to_start = 0
    for prompt, answer in zip(sets.heldout["prompt"], sets.heldout["answer"]):
        q = two.question(prompt)
        first, n = numbers(q)[0], numbers(q)[2]
        bare = invalid_reason(q, f"The answer is {answer}.", answer)
        assert (bare == "restates") == (answer == first) and bare in (None, "restates"), q
        back_to_start += bare is not None
        worked = f"{int(answer) + int(n)} - {n} = {answer}. The answer is {answer}."
        assert invalid_reason(q, worked, answer) is None, q  # shown arriving at it: not a restatement
    assert 0 < back_to_start / len(sets.heldout) < 0.1  # a bare right answer that is the start is flagged


def test_invalid_samples_do_not_vote_are_never_chosen_and_are_rejected_first():
    preds = ["9", "9", "9", "12", "12", "5"]
    responses = ["Tom has 9 marbles."] * 3 + ["9 + 3 = 12. The answer is 12."] * 2 + ["The answer is 5."]
    s = _samples(preds, responses=responses)
    fooled = judge_samples(s, JudgeConfig(method="majority_vote"))
    assert set(fooled["label"]) == {"9"} and fooled["valid"].isna().all()
    checked = judge_samples(s, JudgeConfig(method="majority_vote", validity=True))
    assert set(checked["label"]) == {"12"}
    assert list(checked["valid"]) == [False] * 3 + [True] * 3
    assert list(checked["reward"]) == [0.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    for seed in range(5):
        pairs, best = build(checked, PairsConfig(), seed=seed)
        assert pairs["rejected"].tolist() == ["Tom has 9 marbles."]  # invalid before the valid wrong one
        assert pairs["chosen"].tolist() == ["9 + 3 = 12. The answer is 12."]
    # a ranking judge's invalid sample gets the lowest reward given
    ranked = judge_samples(s, JudgeConfig(method="vote_share", validity=True))
    assert list(ranked["reward"])[:3] == [0.0] * 3
    # an invalid sample is never chosen, even with the highest reward
    s2 = s.assign(valid=[False] + [True] * 5, reward=pd.array([1.0, 0.5, 0.5, 0.5, 0.5, 0.0], dtype="Float64"),
                  correct=pd.array([None] * 6, dtype="Float64"), consistency=None)
    pairs, best = build(s2, PairsConfig(sft_min_reward=0.5), seed=0)
    assert pairs["chosen_reward"].tolist() == [0.5] and best["reward"].tolist() == [0.5]


# the frozen judge


def test_frozen_weights_move_the_label_to_the_answer_the_frozen_judge_believes():
    preds = ["5", "5", "5", "5", "8", "8", "8", None]
    frozen = [0.2, 0.2, 0.2, 0.2, 0.9, 0.9, 0.9, None]
    shares = answer_scores(preds)
    assert shares == {"5": 0.5, "8": 0.375}
    weights = frozen_weights(preds, frozen)
    assert weights == pytest.approx({"5": 0.2, "8": 0.9})
    scores = {a: shares[a] * weights[a] for a in shares}
    assert top_answer(scores, 0.2, shares) == "8"
    assert top_answer(scores, 0.4, shares) is None  # the gate reads the vote share: 8 has 0.375


def test_frozen_judge_scores_with_the_base_model_on_real_samples(bpe_model_dir):
    from self_improve.judges.rubric import load_template
    from self_improve.models.loading import load_model

    handle = ModelHandle(*load_model(bpe_model_dir))
    template = load_template("self_improve/templates/judge_correct.txt")
    s = _samples(["12", "12", "9", "12"], responses=["12", "The answer is 12.", "9", "twelve: 12"])
    ctx = JudgeContext(frozen=handle, frozen_template=template, progress=False)
    out = judge_samples(s, JudgeConfig(method="vote_share", frozen="yes_logprob"), ctx)
    p_yes = [float(x) for x in out["frozen_yes"]]
    assert all(0 < p < 1 for p in p_yes)
    mean12 = (p_yes[0] + p_yes[1] + p_yes[3]) / 3
    assert list(out["reward"]) == pytest.approx([0.75 * mean12] * 2 + [0.25 * p_yes[2], 0.75 * mean12])
    with pytest.raises(ValueError, match="frozen: weighs the votes of a vote judge"):
        JudgeConfig(method="self_certainty", frozen="yes_logprob")
    with pytest.raises(ValueError, match="needs the base model"):
        judge_samples(s, JudgeConfig(method="vote_share", frozen="yes_logprob"), JudgeContext())


@pytest.mark.loop
def test_a_loop_with_the_label_free_rules_on_a_chat_model(tmp_path_factory, bpe_model_dir):
    """ScPO's vote share with its gate and margin weights, the validity check, the frozen judge and the
    inverse problems' check, through every stage of a real loop (DPO on a chat model, word problems, no maj@k)."""
    from self_improve import artifacts as art
    from tests.test_tasks import _loop

    work = _loop(tmp_path_factory, bpe_model_dir, "label-free", {
        "task": {"name": "word_math", "heldout_size": 8, "ttt_size": 8},
        "sample": {"k": 4, "temperature": 1.0}, "evaluate": {"k": 0},
        "evolve": {"fresh": 4, "keep_top": 2, "rewrites": 1},
        "judge": {"method": "vote_share", "min_share": 0.5, "validity": True, "frozen": "yes_logprob",
                  "frozen_mix": 0.5, "inverse": True, "max_new_tokens": 8},
        "pairs": {"weight": "margin"}})
    n_pairs = 0
    for it in ("it1", "it2", "it3"):
        judged = art.read_table(work / f"data/{it}/judgments.parquet", art.JUDGMENTS)
        assert judged["valid"].notna().all()
        assert judged["frozen_yes"].dropna().between(0, 1).all() and judged["frozen_yes"].notna().any()
        pairs = art.read_table(work / f"data/{it}/pairs.parquet", art.PAIRS)
        assert (pairs["weight"] == pairs["chosen_reward"] - pairs["rejected_reward"]).all()
        n_pairs += len(pairs)
        m = art.read_json(work / f"reports/iterations/{it}/metrics.json")
        assert m["invalid_share"] == pytest.approx(float((~judged["valid"].astype(bool)).mean()))
        assert "maj_accuracy" not in m and "accuracy" in m
        # the iteration chosen without labels: the frozen judge scores each model's test-time answers
        answers = art.read_table(work / f"data/{it}/eval.parquet", art.EVAL)
        ttt = answers[answers["set"] == "ttt"]
        assert ttt["frozen_yes"].notna().any() and answers.loc[answers["set"] != "ttt", "frozen_yes"].isna().all()
        assert m["lf_frozen_yes"] == pytest.approx(float(ttt["frozen_yes"].dropna().mean()))  # too long for the context: unjudged
        assert m["lf_frozen_yes_gain_lo"] <= m["lf_frozen_yes_gain"] <= m["lf_frozen_yes_gain_hi"]
    assert n_pairs > 0


def test_vote_signals_read_without_gold():
    from self_improve.evaluation import vote_signals

    s = _samples(["5", "5", "7", None, "5", "5", "5", "5"], variants=[0, 0, 0, 0, 1, 1, 1, 1])
    s = s.assign(prompt_id=[f"v{v}" for v in s["variant"]])
    sig = vote_signals(s)
    assert sig["vote_share"] == pytest.approx((2 / 4 + 4 / 4) / 2)
    assert sig["distinct_answers"] == pytest.approx((2 + 1) / 2)
    assert sig["cross_view_agreement"] == 1.0  # both wordings' top answer is 5
    other = s.assign(pred=["7", "7", "5", None, "5", "5", "5", "5"])
    assert vote_signals(other)["cross_view_agreement"] == 0.0
    assert vote_signals(s[s["variant"] == 0])["cross_view_agreement"] is None  # one wording: nothing to compare


# RESTRAIN: prompts without a trustworthy majority skipped or only penalised; a gate that may rise


def test_low_consensus_prompts_are_skipped_or_penalised():
    split = _samples(["12", "12", "9", "7"], prompt_id="split")  # top share 0.5 < gate 0.6
    clear = _samples(["12", "12", "12", "9"], prompt_id="clear")
    s = pd.concat([split, clear], ignore_index=True)
    skip = judge_samples(s, JudgeConfig(method="majority_vote", min_share=0.6))
    assert skip["reward"][:4].isna().all() and skip["penalised"][:4].tolist() == [False] * 4
    pen = judge_samples(s, JudgeConfig(method="majority_vote", min_share=0.6, low_consensus="penalise"))
    assert list(pen["reward"]) == [0.0] * 4 + [1.0, 1.0, 1.0, 0.0]
    assert list(pen["penalised"]) == [True] * 4 + [False] * 4 and pen["label"][:4].isna().all()
    from self_improve.pairs import groups

    g = groups(pen, penalty=0.5)
    assert (g.loc[g["prompt_id"] == "split", "advantage"] == -0.5).all()
    assert g.loc[g["prompt_id"] == "clear", "advantage"].sum() == pytest.approx(0.0)
    from self_improve.training.iteration import nft_data

    data = nft_data(g, 0.5)
    split_rows = data[data["prompt_id"] == "split"]
    assert len(split_rows) == 4 and (split_rows["label"] == 0).all() and (split_rows["rate"] == 0).all()
    assert pairs_of(pen) == {"clear"}  # a penalised prompt gives no preference pair
    with pytest.raises(ValueError, match="low_consensus"):
        JudgeConfig(method="self_certainty", low_consensus="penalise")


def test_a_category_where_few_prompts_have_a_majority_gives_no_labels():
    def of(cat, pid, preds):
        return _samples(preds, prompt_id=pid).assign(category=cat)

    s = pd.concat([
        of("add", "a1", ["12", "12", "12", "9"]), of("add", "a2", ["12", "12", "9", "9", "12"]),
        of("sub", "s1", ["12", "12", "12", "9"]),  # a majority, but its category's other two have none
        of("sub", "s2", ["1", "2", "3", "4"]), of("sub", "s3", ["5", "6", "7", "12"]),
    ], ignore_index=True)
    open_ = judge_samples(s, JudgeConfig(method="vote_share", min_share=0.5))
    assert set(open_.dropna(subset=["label"])["prompt_id"]) == {"a1", "a2", "s1"}
    gated = judge_samples(s, JudgeConfig(method="vote_share", min_share=0.5, category_gate=0.5))
    assert set(gated.dropna(subset=["label"])["prompt_id"]) == {"a1", "a2"}  # sub: 1 of 3 labelled < 0.5
    assert gated.loc[gated["category"] == "sub", "reward"].isna().all()
    assert list(gated["reward"][:4]) == list(open_["reward"][:4])  # a certain category is as it was
    assert pairs_of(gated) == {"a1", "a2"}
    low = judge_samples(s, JudgeConfig(method="vote_share", min_share=0.5, category_gate=0.3))
    assert set(low.dropna(subset=["label"])["prompt_id"]) == {"a1", "a2", "s1"}  # 1/3 >= 0.3
    # RESTRAIN's penalty stays with the prompts that had no majority; a masked category is skipped
    pen = judge_samples(s, JudgeConfig(method="majority_vote", min_share=0.5, category_gate=0.5,
                                       low_consensus="penalise"))
    assert pen.loc[pen["prompt_id"] == "s1", "reward"].isna().all()
    assert pen.loc[pen["prompt_id"].isin(["s2", "s3"]), "penalised"].all()
    with pytest.raises(ValueError, match="category_gate"):
        JudgeConfig(method="random", category_gate=0.5)
    from self_improve.evaluation import label_coverage_by_category

    assert label_coverage_by_category(gated) == {"label_coverage/add": 1.0, "label_coverage/sub": 0.0}
    assert label_coverage_by_category(open_)["label_coverage/sub"] == pytest.approx(1 / 3)
    assert label_coverage_by_category(gated.assign(category="add")) == {}  # one category: the overall figure


def pairs_of(judged):
    out, _ = build(judged, PairsConfig(), seed=0)
    return set(out["prompt_id"])


def test_the_gate_rises_every_iteration_by_its_step():
    from self_improve.config import parse_params
    from tests.conftest import TINY

    params = parse_params({**TINY, "judge": {**TINY.get("judge", {}), "min_share": 0.5, "min_share_step": 0.2}})
    assert [params.min_share(it) for it in ("it1", "it2", "it3")] == pytest.approx([0.5, 0.7, 0.9])
    steep = parse_params({**TINY, "judge": {**TINY.get("judge", {}), "min_share": 0.5, "min_share_step": 0.4}})
    assert steep.min_share("it3") == 1.0


def test_a_slowly_moving_judge_is_part_of_the_way_from_it0_to_the_policy(bpe_model_dir):
    from self_improve.models.loading import interpolate_weights, load_model

    base, _ = load_model(bpe_model_dir, device="cpu")
    policy, _ = load_model(bpe_model_dir, device="cpu")
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(1.0)  # every weight one more than the base's (tied weights once)
    before = {k: v.clone() for k, v in base.state_dict().items()}
    judge, _ = load_model(bpe_model_dir, device="cpu")
    interpolate_weights(judge, policy, 0.25)
    for k, v in judge.state_dict().items():
        if v.is_floating_point():
            assert torch.allclose(v, before[k] + 0.25), k
    same, _ = load_model(bpe_model_dir, device="cpu")
    interpolate_weights(same, policy, 0.0)
    assert all(torch.equal(v, before[k]) for k, v in same.state_dict().items())
    with pytest.raises(ValueError, match="mix"):
        interpolate_weights(same, policy, 1.5)
    with pytest.raises(ValueError, match="frozen_mix"):
        JudgeConfig(method="vote_share", frozen_mix=0.5)


def test_restates_any_catches_a_restated_operand_the_first_rule_lets_through():
    q = "There are 25 pencils in Omar's bag. Omar loses 18 of the pencils. How many pencils does Omar have at the end?"
    assert invalid_reason(q, "Omar loses 18 pencils.", "18") is None  # not the first quantity
    assert invalid_reason(q, "Omar loses 18 pencils.", "18", "any") == "restates"
    assert invalid_reason(q, "25 - 18 = 7. The answer is 7.", "7", "any") is None
    assert invalid_reason(q, "43 - 25 = 18. So 18.", "18", "any") is None  # a calculation arriving at it
    s = _samples(["18", "18", "18", "7"], responses=["Omar loses 18 pencils."] * 3 + ["25 - 18 = 7"], prompt=q)
    out = judge_samples(s, JudgeConfig(method="majority_vote", validity=True, restates="any"))
    assert list(out["valid"]) == [False, False, False, True] and set(out["label"].dropna()) == {"7"}


def test_the_shortcut_check_rules_out_the_sum_where_a_step_is_not_an_addition():
    """judge.shortcut: on word_math the sum of the question's numbers is invalid where a step subtracts,
    multiplies or divides (no vote, lowest reward), never where every step adds; a right answer is ruled
    out in none of the one-step subtractions drawn and at most 1% of the multiplications (2 x 2)."""
    from self_improve.judges.registry import context
    from self_improve.tasks.word_math import WordProblem

    task = task_for(TaskConfig(name="word_math", levels=["add", "sub", "mul"], max_number=30, max_factor=12,
                               heldout_size=300, ttt_size=10, instruction="Answer with the final number only."))
    sub = task.show(WordProblem(25, (("sub", 18),), "Omar", "pencils").prompt)
    add = task.show(WordProblem(25, (("add", 18),), "Omar", "pencils").prompt)
    assert task.ruled_out(sub) == {"43"} and task.ruled_out(add) == frozenset()
    assert task.ruled_out("not a word problem") == frozenset()
    q = task.question(sub)
    assert invalid_reason(q, "25 + 18 = 43. The answer is 43.", "43", "any", task.ruled_out(sub)) == "shortcut"
    assert invalid_reason(q, "25 - 18 = 7. The answer is 7.", "7", "any", task.ruled_out(sub)) is None
    sets = task.sets(0, 0)
    by: dict[str, list[bool]] = {}  # is the right answer ruled out, per operation
    for p, a, c in zip(sets.heldout["prompt"], sets.heldout["answer"], sets.heldout["category"]):
        by.setdefault(c, []).append(a in task.ruled_out(p))
    assert sum(by["add"]) == 0 and sum(by["sub"]) == 0 and sum(by["mul"]) / len(by["mul"]) <= 0.01
    # in the judge: the sum does not vote, the right answer takes the label
    raw = deep_merge(TINY, {"task": {"name": "word_math", "instruction": "Answer with the final number only."},
                            "judge": {"method": "majority_vote", "validity": True, "restates": "any", "shortcut": True}})
    params = parse_params(raw)
    ctx = context(params, {}, task=task, cfg=params.judge)
    s = _samples(["43", "43", "43", "7"], responses=["25 + 18 = 43."] * 3 + ["25 - 18 = 7"], prompt=sub)
    judged = judge_samples(s, params.judge, ctx)
    assert list(judged["valid"]) == [False, False, False, True] and set(judged["label"].dropna()) == {"7"}
    off = judge_samples(s, params.judge.model_copy(update={"shortcut": False}), ctx)
    assert set(off["label"].dropna()) == {"43"}  # without it, the sum wins the vote
    with pytest.raises(ValueError, match="shortcut"):
        JudgeConfig(method="majority_vote", shortcut=True)


# self-verification by inverse problems


def test_inverse_problems_hide_a_number_of_the_question_and_give_the_answer():
    from self_improve.tasks.inverse import expression_inverse

    q = "State the final answer to the following arithmetic problem: 34 - 21 ="
    assert expression_inverse(q, "13") == [("Find the number x such that x - 21 = 13.", "34")]
    assert expression_inverse(q, "55") == [("Find the number x such that x - 21 = 55.", "34")]  # 76 comes back, not 34
    assert expression_inverse("Calculate 4 * 7 + 2.", "30") == []  # not one two-number expression
    assert expression_inverse(q, None) == [] and expression_inverse(q, "many") == []
    from self_improve.tasks.word_math import WordProblem

    task = task_for(TaskConfig(name="word_math", heldout_size=4, ttt_size=4, instruction="Answer with the final number only."))
    asked = task.show(WordProblem(9, (("add", 3),), "Tom", "marbles").prompt)  # Tom has 9 marbles. Tom buys 3 more ...
    (prompt, hidden), = task.inverse(asked, "12")
    assert hidden == "9" and "Now Tom has 12 marbles." in prompt and "9" not in prompt.split("\n")[0]
    assert prompt.endswith("\nAnswer with the final number only.")
    assert task.inverse(asked, "1.5") == [] and task.inverse("not a word problem", "3") == []


def test_an_answer_whose_inverse_fails_loses_its_votes():
    s = _samples(["55"] * 5 + ["13"] * 3, prompt="Calculate 34 - 21.")
    ctx = JudgeContext(progress=False)
    ctx._scores["inverse"] = {"prompt_id": {("p", "55"): 0.0, ("p", "13"): 1.0}}  # as the policy solved them
    plain = judge_samples(s, JudgeConfig(method="vote_share", min_share=0.5))
    assert set(plain["label"]) == {"55"}
    checked = judge_samples(s, JudgeConfig(method="vote_share", min_share=0.3, inverse=True, inverse_weight=0.25), ctx)
    assert set(checked["label"]) == {"13"}  # 5/8 x 0.25 < 3/8
    assert list(checked["reward"]) == pytest.approx([5 / 8 * 0.25] * 5 + [3 / 8] * 3)
    # the gate reads the vote share, not the weighed score: 13, on top, has 3/8 of the votes, under 0.5
    assert judge_samples(s, JudgeConfig(method="vote_share", min_share=0.5, inverse=True), ctx)["label"].isna().all()
    with pytest.raises(ValueError, match="inverse: weighs the votes of a vote judge"):
        JudgeConfig(method="verifier", inverse=True)
    with pytest.raises(ValueError, match="needs the task's inverse problems"):
        judge_samples(s, JudgeConfig(method="vote_share", inverse=True), JudgeContext())


def test_the_policy_solves_the_inverse_problems_with_a_real_model(bpe_model_dir):
    from self_improve.judges.inverse import inverse_checks
    from self_improve.models.loading import load_model

    from self_improve.tasks.word_math import WordProblem

    task = task_for(TaskConfig(name="word_math", heldout_size=4, ttt_size=4))
    s = _samples(["12", "12", "9", None], prompt=WordProblem(9, (("add", 3),), "Tom", "marbles").prompt)
    ctx = JudgeContext(policy=ModelHandle(*load_model(bpe_model_dir)), progress=False, inverse=task.inverse,
                       extract=lambda r: task.extract(r).answer)
    got = inverse_checks(s, "prompt_id", ctx, max_new_tokens=8)
    assert set(got) == {("p", "12"), ("p", "9")} and all(v in (0.0, 1.0) for v in got.values())
    assert inverse_checks(s, "prompt_id", ctx, max_new_tokens=8) is got  # computed once per context
