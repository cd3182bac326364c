"""Every judge method and training algorithm through the whole loop in-process (tiny config)."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from self_improve import artifacts as art

from .conftest import deep_merge, run_all

VARIANTS = {
    "llm_judge": {"judge": {"method": "llm_judge", "max_prompts": 3, "judgments": 2, "max_new_tokens": 12}},
    "self_certainty": {"judge": {"method": "self_certainty"}},
    "implicit_reward": {"judge": {"method": "implicit_reward"}},
    "ipo": {"train": {"algorithm": "ipo"}},
    "spin": {"train": {"algorithm": "spin"}, "evolve": {"seed_prompts": 8}},
    "cream": {"train": {"algorithm": "cream"}},
    "grpo": {"train": {"algorithm": "grpo", "grpo": {"beta": 0.05}}},
    "bstar": {"sample": {"bstar": {"enabled": True, "temperatures": [0.5, 1.0], "thresholds": [0.0, 1.0],
                                   "dev_size": 4}}},
    "nft": {"train": {"algorithm": "nft"}},
    "dpo_full": {"train": {"algorithm": "dpo", "lora": {"enabled": False}}},
}


@pytest.fixture(params=sorted(VARIANTS))
def variant_run(request, tmp_path, tiny_raw, monkeypatch):
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(deep_merge(tiny_raw, VARIANTS[request.param])))
    run_all(tmp_path, params, monkeypatch)
    return request.param, tmp_path


def _read(root, it, name, schema):
    return art.read_table(root / "data" / it / f"{name}.parquet", schema)


def test_every_method_runs_the_loop(variant_run):
    name, root = variant_run
    metrics = {it: art.read_json(root / "reports" / "iterations" / it / "metrics.json") for it in ("it1", "it2", "it3")}
    assert all("accuracy" in m and "judged_share" in m for m in metrics.values())
    j1 = _read(root, "it1", "judgments", art.JUDGMENTS)
    j2 = _read(root, "it2", "judgments", art.JUDGMENTS)
    if name == "llm_judge":
        judged = j1[j1["parse_rate"].notna()]
        assert 0 < judged["prompt_id"].nunique() <= 3  # max_prompts
        assert j1.loc[j1["parse_rate"].isna(), "reward"].isna().all()  # not judged: no verdict
        rewards = j1["reward"].dropna()
        assert ((rewards >= 0) & (rewards <= 1)).all()
        assert "parse_failure_rate" in metrics["it1"]
        # a sample whose judgments all failed to parse is dropped, never scored 0
        failed = j1[(j1["parse_rate"] == 0)]
        assert failed["reward"].isna().all()
    elif name == "self_certainty":
        assert j1["reward"].notna().all() and j1["reward"].nunique() > 1
    elif name == "implicit_reward":
        # it1: the base against itself before its warm-up; later: against the previous model
        assert j1["reward"].notna().all() and j1["reward"].nunique() > 1 and metrics["it1"]["num_pairs"] > 0
        assert j2["reward"].nunique() > 1
    elif name == "cream":
        cons = _read(root, "it2", "pairs", art.PAIRS)["consistency"]
        assert len(cons) and cons.notna().all() and ((cons >= 0) & (cons <= 1)).all()
        assert j2["consistency"].notna().any()
    elif name == "spin":
        pairs = _read(root, "it1", "pairs", art.PAIRS)
        prompts = _read(root, "it1", "prompts", art.PROMPTS)
        seed = prompts[prompts["source"] == "seed"].set_index("prompt")["answer"]
        assert len(seed) == 8 and len(pairs) > 0
        assert set(pairs["prompt"]) <= set(seed.index)
        assert (pairs["chosen"] == pairs["prompt"].map(seed)).all()
        assert (pairs["chosen"] != pairs["rejected"]).all()
    elif name == "grpo":
        groups = _read(root, "it1", "groups", art.GROUPS)
        assert len(groups) > 0
        per = groups.groupby("prompt_id")["advantage"]
        assert (per.mean().abs() < 1e-9).all() and (per.std() > 0).all()
        tm = art.read_json(root / "data/it1/train_metrics.json")
        assert {"clip_fraction", "kl"} <= set(tm)
        assert "train_tokens_per_s" not in tm  # a timing: in SELF_IMPROVE_TIMINGS' record, never in an output
    elif name == "nft":
        from self_improve.training.iteration import nft_data

        data = nft_data(_read(root, "it1", "groups", art.GROUPS), 0.5)
        assert len(data) > 0 and ((data["rate"] > 0) & (data["rate"] < 1)).all()
        tm = art.read_json(root / "data/it1/train_metrics.json")
        assert tm["train_examples"] == len(data) and {"ratio_mean", "negative_clipped"} <= set(tm)
    elif name == "bstar":
        from self_improve.bstar import choose

        for it in ("it1", "it2", "it3"):
            choice = art.read_json(root / "data" / it / "bstar.json")
            assert choice["enabled"] and len(choice["grid"]) == 4 and choice["dev_prompts"] > 0
            assert {(g["temperature"], g["threshold"]) for g in choice["grid"]} == {(0.5, 0.0), (0.5, 1.0),
                                                                                  (1.0, 0.0), (1.0, 1.0)}
            best = choose(choice["grid"])
            assert (choice["temperature"], choice["threshold"]) == (best["temperature"], best["threshold"])
            # the choice is what the stages used: the samples' temperature, RAFT's threshold, the metrics
            assert art.read_provenance(root / "data" / it / "samples.parquet")["temperature"] == choice["temperature"]
            assert art.read_provenance(root / "data" / it / "sft.parquet")["sft_min_reward"] == choice["threshold"]
            assert (_read(root, it, "sft", art.SFT)["reward"] >= choice["threshold"]).all()
            assert metrics[it]["sample_temperature"] == choice["temperature"]
            assert metrics[it]["bstar_balance"] == pytest.approx(choice["balance"])
    elif name == "dpo_full":
        from safetensors.torch import load_file

        before = load_file(root / "data/it1/model/model.safetensors")
        after = load_file(root / "data/it2/model/model.safetensors")
        changed = [k for k in before if not (before[k] == after[k]).all()]
        assert "lm_head.weight" in changed and any("embed" in k for k in changed)  # not an adapter


@pytest.mark.loop
def test_instruction_prompt_file_loop_with_llm_judge(tmp_path, tiny_raw, monkeypatch):
    """The shipped instruction file, no answers: llm_judge on the tiny model, eva rewrites, win rate."""
    from .conftest import ROOT

    raw = deep_merge(tiny_raw, {
        "task": {"name": "prompts", "prompt_file": str(ROOT / "data/inputs/instructions.jsonl")},
        "judge": {"method": "llm_judge", "max_prompts": 4, "judgments": 2, "max_new_tokens": 12},
        "sample": {"max_new_tokens": 12},
        "evolve": {"strategy": "eva", "keep_top": 3},
    })
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(raw))
    run_all(tmp_path, params, monkeypatch)
    heldout = art.read_table(tmp_path / "data/task/heldout.parquet", art.PROMPTS)
    ttt = art.read_table(tmp_path / "data/task/ttt.parquet", art.PROMPTS)
    assert len(heldout) + len(ttt) == 41 and heldout["answer"].isna().all()
    prompts = art.read_table(tmp_path / "data/it1/prompts.parquet", art.PROMPTS)
    assert set(prompts["prompt"]) == set(ttt["prompt"])  # it1: nothing judged yet to evolve from
    for it in ("it1", "it2", "it3"):
        m = art.read_json(tmp_path / "reports" / "iterations" / it / "metrics.json")
        assert "accuracy" not in m  # no answers, no accuracy
        j = art.read_table(tmp_path / "data" / it / "judgments.parquet", art.JUDGMENTS)
        assert j["correct"].isna().all()
        # the metric is what the judgments hold: the share of judge outputs that did not parse
        asked = j["parse_rate"].dropna()
        assert len(asked) and m["parse_failure_rate"] == pytest.approx(1 - asked.mean())
        assert j.loc[j["parse_rate"] == 0, "reward"].isna().all()  # unparsed: dropped, not scored
    summary = (tmp_path / "reports/summary.md").read_text()
    assert "win rate" in summary and "Reward-hacking alarm" in summary


def _user_prompts() -> pd.DataFrame:
    rows = [("Explain rain in one sentence.", "explain"), ("List three fruits.", "list"),
            ("Give a synonym for quick.", "synonym"), ("Explain why the sky is blue.", "explain")]
    return pd.DataFrame({"iteration": "it0", "prompt_id": [f"ttt-{i:05d}/v0" for i in range(4)],
                         "group_id": [f"ttt-{i:05d}" for i in range(4)], "variant": 0, "source": "ttt",
                         "category": [c for _, c in rows], "prompt": [p for p, _ in rows], "answer": None})


def test_eva_on_a_prompt_file_adds_filtered_model_rewrites_of_the_informative_prompts():
    from self_improve.config import EvolveConfig, TaskConfig
    from self_improve.curriculum import initial_state
    from self_improve.tasks import ProposeInput, task_for

    ttt = _user_prompts()
    judged = ttt.loc[ttt.index.repeat(2)].reset_index(drop=True)
    judged["reward"] = [0.0, 1.0, 0.2, 0.8, 0.5, 0.5, 0.4, 0.4]  # spread: prompts 0 and 1 only
    asked: list[tuple[str, list[str]]] = []

    def write(template, prompts, n):
        asked.append((template, prompts))
        return [[t] for t in ["Describe how snow forms, briefly.\nand more text", "List three fruits."][: len(prompts)]]

    inp = ProposeInput(EvolveConfig(strategy="eva", keep_top=2), "it2", 0, ttt, ttt.iloc[:0], judged,
                       initial_state(["explain", "list", "synonym"]), rewrites=False, writer=write)
    out = task_for(TaskConfig(name="instructions")).propose(inp)
    assert asked == [("rewrite_prompt.txt", ["Explain rain in one sentence.", "List three fruits."])]
    evolved = out[out["source"] == "evolved"]
    assert list(evolved["prompt"]) == ["Describe how snow forms, briefly."]  # first line only
    assert list(evolved["category"]) == ["explain"]
    assert inp.stats["rewrites_dropped"] == {"near_duplicate": 1}  # "List three fruits." is already a prompt
    assert set(out["prompt"]) >= set(ttt["prompt"])


def test_sec_on_a_prompt_file_draws_prompts_by_category():
    from self_improve.config import EvolveConfig, TaskConfig
    from self_improve.curriculum import BanditState
    from self_improve.tasks import ProposeInput, task_for

    ttt = _user_prompts()
    state = BanditState(q={"explain": 5.0, "list": 0.0, "synonym": 0.0}, temperature=0.1)
    inp = ProposeInput(EvolveConfig(strategy="sec", fresh=2), "it2", 0, ttt, ttt.iloc[:0],
                       ttt.iloc[:0].assign(reward=None), state)
    out = task_for(TaskConfig(name="instructions")).propose(inp)
    assert list(out["category"]) == ["explain", "explain"]


def test_a_malformed_prompt_file_stops_prepare_naming_the_row(tmp_path, tiny_raw, monkeypatch, capsys):
    from stages import prepare

    bad = tmp_path / "mine.jsonl"
    bad.write_text('{"prompt": "fine"}\n{"prompt": ""}\n')
    raw = deep_merge(tiny_raw, {"task": {"name": "prompts", "prompt_file": str(bad)},
                                "judge": {"method": "llm_judge"}})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.chdir(tmp_path)
    argv = ["--heldout", "h.parquet", "--ttt", "t.parquet", "--seed-data", "s.parquet", "--model", "m",
            "--init-model", "i", "--judgments", "j.parquet", "--metrics", "x.json", "--curriculum", "c.json"]
    with pytest.raises(SystemExit) as exit_:
        prepare.main(argv + ["--params", "params.yaml"])
    assert exit_.value.code == 2
    assert f"{bad}: row 2, column 'prompt': empty prompt" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.jsonl", "params.yaml"]


@pytest.mark.loop
def test_fixed_poses_the_same_prompt_set_every_iteration(tmp_path, tiny_raw, monkeypatch):
    """`evolve.strategy: fixed` (with co_reward's rewrites and SPIN-style seed prompts): every
    iteration's prompts.parquet holds the same rows, ids and rewrites included; only `iteration`
    differs. `eva` on the same run draws new problems each iteration."""
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(deep_merge(tiny_raw, {"evolve": {"strategy": "fixed", "seed_prompts": 4}})))
    run_all(tmp_path, params, monkeypatch)
    sets = [_read(tmp_path, it, "prompts", art.PROMPTS) for it in ("it1", "it2", "it3")]
    assert set(sets[0]["source"]) == {"ttt", "fresh", "seed"} and (sets[0]["variant"] > 0).any()
    for it, df in zip(("it2", "it3"), sets[1:]):
        assert set(df["iteration"]) == {it}
        pd.testing.assert_frame_equal(df.drop(columns="iteration"), sets[0].drop(columns="iteration"))

    from self_improve.config import EvolveConfig, TaskConfig
    from self_improve.tasks import ProposeInput, task_for

    task = task_for(TaskConfig(**tiny_raw["task"]))
    heldout = art.read_table(tmp_path / "data/task/heldout.parquet", art.PROMPTS)
    ttt = art.read_table(tmp_path / "data/task/ttt.parquet", art.PROMPTS)
    eva = [task.propose(ProposeInput(EvolveConfig(strategy="eva", fresh=6), it, seed, ttt, heldout,
                                     _read(tmp_path, "it0", "judgments", art.JUDGMENTS)))
           for it, seed in (("it1", 1), ("it2", 2))]
    fresh = [set(df.loc[df["source"] == "fresh", "prompt"]) for df in eva]
    assert fresh[0] and fresh[0] != fresh[1]


def test_nft_labels_samples_and_drops_prompts_that_all_agree():
    from self_improve.training.iteration import nft_data

    groups = pd.DataFrame({
        "prompt_id": ["a", "a", "a", "a", "b", "b"], "reward": [1.0, 0.8, 0.2, 1.0, 1.0, 0.9],
        "truncated": [False, False, False, True, False, False], "valid": [True, None, True, True, True, True],
    })
    out = nft_data(groups, 0.5)
    # a: right, right, wrong (reward), wrong (truncated); b: all right, dropped
    assert out["label"].tolist() == [1.0, 1.0, 0.0, 0.0] and out["rate"].tolist() == [0.5] * 4
    assert set(out["prompt_id"]) == {"a"}
    invalid = nft_data(groups.assign(valid=[False, True, True, True, True, True]), 0.5)
    assert invalid["label"].tolist() == [0.0, 1.0, 0.0, 0.0]
