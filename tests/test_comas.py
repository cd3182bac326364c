"""CoMAS (self_improve/agents/, comas/dvc.yaml): known-input tests of its scores, rewards, roles
and discussions, and its stages run in-process on a pretrained chat model."""

from __future__ import annotations

import random
import re

import pandas as pd
import pytest
import yaml

from self_improve.agents.discussion import (
    Problem,
    advantages,
    agent_metrics,
    buffer,
    discuss,
    parse_score,
    reviewers,
    rewards,
)
from self_improve.config import AgentsConfig, ConfigError, parse_params
from self_improve.engines.hf import Generations

from .conftest import ROOT, deep_merge, stage_modules, tiny_full


@pytest.mark.parametrize("text, score", [
    ("The evaluation is right.\n<score>1</score>", 1),
    ("<score> 2 </score>", 2),
    ("<SCORE>3</SCORE>", 3),
    ("first <score>1</score>, on reflection <score>3</score>", 3),  # the last tag is the verdict
    ("<score>4</score>", None),  # outside the rubric
    ("<score>0</score>", None),
    ("Score: 3", None),  # no tag
    ("<score>3", None),
    ("", None),
    (None, None),
])
def test_the_score_is_read_from_the_tag_only(text, score):
    assert parse_score(text) == score


@pytest.mark.parametrize("score, expected", [(3, (1.0, 0.0, 0.0)), (2, (0.5, 0.5, 0.0)), (1, (0.0, 1.0, 0.0)),
                                             (None, (0.0, 0.0, -1.0))])
def test_rewards_are_the_papers(score, expected):
    """Solution (s - 1) / 2, evaluation 1 - that (zero-sum), scorer 0 or -1 when its score does not parse."""
    assert rewards(score) == expected


@pytest.mark.parametrize("n", [2, 3, 4])
def test_no_agent_reviews_its_own_solution(n):
    rng = random.Random(0)
    seen_evaluators = set()
    for _ in range(200):
        for solver in range(n):
            evaluator, scorer = reviewers(solver, n, rng)
            assert solver not in (evaluator, scorer)
            if n >= 3:
                assert evaluator != scorer
            else:
                assert evaluator == scorer == 1 - solver
            seen_evaluators.add(evaluator)
    assert seen_evaluators == set(range(n))  # every agent gets to evaluate


def test_advantages_are_normalised_over_the_buffer():
    assert advantages([0.0, 1.0]) == pytest.approx([-1.0, 1.0])
    assert advantages([0.0, 0.5, 1.0]) == pytest.approx([-1.224745, 0.0, 1.224745], abs=1e-6)
    assert advantages([0.5, 0.5]) == [0.0, 0.0]
    assert advantages([]) == []


class Scripted:
    """Agents whose replies are a fixed function of (agent, role): agent 0 answers 5, agent 1 answers
    7; every evaluation says "no error"; agent 0 scores 3 and agent 1 writes no tag. A solution that
    carries a score tag of its own tests that only the scorer's output is read."""

    def __init__(self):
        self.calls = []

    def __call__(self, agent: int, prompts: list[str], seed: int) -> Generations:
        self.calls.append((agent, prompts))
        out = []
        for p in prompts:
            if p.startswith("Problem:\n") and "Earlier discussion" in p:
                out.append(f"It is \\boxed{{{5 if agent == 0 else 7}}}. <score>3</score>")
            elif "Evaluate this solution" in p:
                out.append("No error.")
            else:
                out.append("<score>3</score>" if agent == 0 else "I think it is fine.")
        return Generations([[t] for t in out], [[False] for _ in out])


def _discussion(n=2, rounds=2, refs=2):
    cfg = AgentsConfig(n=n, rounds=rounds, references=refs, problems=3)
    problems = [Problem(f"q{i}", f"What is {i} + 5?", str(i + 5)) for i in range(3)]
    gen = Scripted()
    df = discuss(problems, cfg, gen, 0, "it1", lambda t: (re.findall(r"boxed\{(\d+)\}", t) or [None])[-1],
                 lambda pred, p: float(pred == p.answer))
    return df, gen, cfg


def test_a_discussion_has_every_role_of_every_solution_with_its_reward():
    df, gen, cfg = _discussion()
    assert len(df) == 2 * 3 * 2 * 3  # rounds x problems x agents x roles
    sol = df[df["role"] == "solution"]
    assert (sol["agent"] == sol["solver"]).all()
    for role in ("evaluation", "score"):
        assert (df[df["role"] == role]["agent"] != df[df["role"] == role]["solver"]).all()
    # agent 0 solves "5": right only for q0; agent 1 "7": right only for q2 (the verifier, measured)
    right = {(r.prompt_id, r.agent): r.correct for r in sol.itertuples()}
    assert right[("q0", 0)] == 1.0 and right[("q1", 0)] == 0.0 and right[("q2", 1)] == 1.0
    # with 2 agents the other one scores: agent 1 scores agent 0's solutions without a tag
    scores = df[df["role"] == "score"].set_index(["prompt_id", "round", "solver"])
    assert scores.xs(0, level="solver")["score"].isna().all()  # the solution's own tag is not read
    assert (scores.xs(1, level="solver")["score"] == 3).all()
    by_key = df.set_index(["prompt_id", "round", "solver", "role"])["reward"]
    for (pid, rnd, solver), row in scores.iterrows():
        s = None if pd.isna(row["score"]) else int(row["score"])
        assert (by_key[pid, rnd, solver, "solution"], by_key[pid, rnd, solver, "evaluation"],
                by_key[pid, rnd, solver, "score"]) == rewards(s)


def test_the_second_round_sees_kappa_pairs_of_the_first():
    df, gen, _ = _discussion(refs=1)
    first = df[(df["role"] == "solution") & (df["round"] == 0)]["prompt"]
    second = df[(df["role"] == "solution") & (df["round"] == 1)]["prompt"]
    assert first.str.contains("(no discussion yet)", regex=False).all()
    assert (second.str.count("=== Discussion") == 1).all()
    assert second.str.contains("Evaluation: No error.", regex=False).all()
    df2, _, _ = _discussion(refs=2)
    assert (df2[(df2["role"] == "solution") & (df2["round"] == 1)]["prompt"].str.count("=== Discussion") == 2).all()


def test_each_agent_trains_on_every_role_it_played():
    df, _, _ = _discussion()
    for k in (0, 1):
        mine = buffer(df, k)
        assert set(mine["role"]) == {"solution", "evaluation", "score"}
        assert (mine["agent"] == k).all()
        assert mine["advantage"].mean() == pytest.approx(0.0, abs=1e-9)
    # agent 1 never writes a tag: every score it gives is -1, below every solution it writes
    b1 = buffer(df, 1)
    assert (b1[b1["role"] == "score"]["reward"] == -1.0).all()


def test_agent_metrics_recompute_from_the_transcripts():
    df, _, _ = _discussion()
    m = agent_metrics(df, 2)
    assert m["agent0"]["solution_accuracy"] == pytest.approx(1 / 3)  # right on q0 only
    assert m["agent1"]["solution_accuracy"] == pytest.approx(1 / 3)
    assert m["agent0"]["score_parse_rate"] == 1.0 and m["agent1"]["score_parse_rate"] == 0.0
    # agent 0 scores agent 1's solutions 3 (stands): right on q2 only, so it agrees on 1 of 3
    assert m["agent0"]["score_agreement"] == pytest.approx(1 / 3)
    assert m["agent1"]["score_agreement"] is None
    assert m["agent0"]["reward_score"] == 0.0 and m["agent1"]["reward_score"] == -1.0
    assert m["agent1"]["reward_solution"] == 1.0  # always scored 3


@pytest.mark.parametrize("over, key", [
    ({"n": 1}, "agents.n"),
    ({"rounds": 0}, "agents.rounds"),
    ({"references": -1}, "agents.references"),
    ({"loop": {"it3": {"prev": "it1"}}}, "loop.it3.prev: expected it2"),
    ({"colour": "red"}, "agents.colour"),
])
def test_a_bad_agents_section_is_refused_naming_its_key(over, key):
    raw = deep_merge(tiny_full(), {"agents": over})
    with pytest.raises(ConfigError, match=re.escape(key)):
        parse_params(raw)


# --- the stages, in-process on the BPE chat model ------------------------------------------------

def _comas_run(work, params, monkeypatch):
    from runners.dag import comas_commands

    modules = stage_modules()
    from stages import comas_discuss, comas_evaluate, comas_init, comas_report, comas_train

    modules.update({m.__name__.split(".")[-1]: m for m in (comas_init, comas_discuss, comas_train, comas_evaluate,
                                                            comas_report)})
    monkeypatch.chdir(work)
    for _, cmd in comas_commands(ROOT):
        modules[cmd[2].split(".")[1]].main(cmd[3:] + ["--params", str(params)])


@pytest.fixture(scope="module")
def comas_run(bpe_model_dir, tmp_path_factory):
    from .conftest import TINY

    work = tmp_path_factory.mktemp("comas")
    raw = deep_merge(tiny_full(), deep_merge(TINY, {
        "model": {"base": str(bpe_model_dir), "max_length": 160},
        "evaluate": {"max_new_tokens": 4},
        "train": {"batch_size": 8, "epochs": 1, "lora": {"r": 4, "alpha": 8}},
        "agents": {"n": 2, "rounds": 2, "references": 1, "problems": 2, "max_new_tokens": 6,
                   "loop": {"it1": {"prev": "it0"}, "it2": {"prev": "it1"}}},
    }))
    params = work / "params.yaml"
    params.write_text(yaml.safe_dump(raw))
    mp = pytest.MonkeyPatch()
    try:
        _comas_run(work, params, mp)
    finally:
        mp.undo()
    return work


@pytest.mark.loop
def test_comas_runs_base_and_two_iterations_with_an_adapter_chain_per_agent(comas_run):
    from self_improve import artifacts as art
    from self_improve.agents.discussion import TRANSCRIPTS
    from self_improve.models.loading import read_chain

    work = comas_run
    for it in ("it1", "it2"):
        t = art.read_table(work / f"data/comas/{it}/transcripts.parquet", TRANSCRIPTS)
        assert len(t) == 2 * 2 * 2 * 3  # rounds x problems x agents x roles
        for k in (0, 1):
            assert read_chain(work / f"data/comas/{it}/agents/agent{k}")["adapters"] == \
                (["it1"] if it == "it1" else ["it1", "it2"])
        m = art.read_json(work / f"reports/comas/iterations/{it}/metrics.json")
        assert set(m["agents"]) == {"agent0", "agent1"}
        assert m["agents"] and all(m["agents"][a]["score_parse_rate"] == pytest.approx(
            t[(t["agent"] == int(a[-1])) & (t["role"] == "score")]["score"].notna().mean()) for a in m["agents"])
        ev = pd.read_parquet(work / f"data/comas/{it}/eval.parquet")
        for k in (0, 1):
            held = ev[(ev["agent"] == k) & (ev["set"] == "heldout")]
            assert m["agents"][f"agent{k}"]["accuracy"] == pytest.approx(held["correct"].mean())
            assert "accuracy_gain_lo" in m["agents"][f"agent{k}"]
    # the two agents were trained apart: their adapters differ
    a0 = (work / "data/comas/it1/agents/agent0/adapters/it1/adapter_model.safetensors").read_bytes()
    a1 = (work / "data/comas/it1/agents/agent1/adapters/it1/adapter_model.safetensors").read_bytes()
    assert a0 != a1
    table = pd.read_csv(work / "reports/comas/agents.csv")
    assert sorted(zip(table["agent"], table["iteration"])) == [
        (f"agent{k}", it) for k in (0, 1) for it in ("it0", "it1", "it2")]
    assert "| agent1 | it2 |" in (work / "reports/comas/summary.md").read_text()


def test_a_model_without_a_chat_template_is_refused_naming_model_base(tmp_path, capsys, monkeypatch):
    from stages import comas_init

    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(tiny_full()))  # the builtin tiny model
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        comas_init.main(["--base", "data/it0/model", "--out", "data/comas/it0/agents", "--params", str(params)])
    assert exit_.value.code == 2
    assert "model.base: CoMAS needs a chat model" in capsys.readouterr().err
    assert not (tmp_path / "data/comas").exists()
