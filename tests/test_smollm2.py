"""A real pretrained model through one iteration: SmolLM2-135M-Instruct (`make smollm2`) on CPU.

Slow (a minute or two on 2 cores), so not in the default run: `make test-slow` (CI runs it).
"""

from __future__ import annotations

import importlib
import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from self_improve import artifacts as art
from self_improve.engines.hf import chat_format
from self_improve.models.loading import load_model
from stages import evaluate, evolve, judge, pairs, prepare, sample, train

from .conftest import ROOT, TINY, deep_merge

SMOL = ROOT / "models" / "smollm2-135m-instruct"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (SMOL / "model.safetensors").is_file(), reason="run `make smollm2` first"),
]


def _prepare(p: list[str]) -> None:
    prepare.main(["--heldout", "task/heldout.parquet", "--ttt", "task/ttt.parquet", "--seed-data", "task/seed.parquet",
                  "--model", "it0/model", "--init-model", "init/model", "--judgments", "it0/judgments.parquet",
                  "--metrics", "it0/train.json", "--curriculum", "it0/curriculum.json", *p])


def _evolve(it: list[str], p: list[str]) -> None:
    evolve.main([*it, "--ttt", "task/ttt.parquet", "--heldout", "task/heldout.parquet",
                 "--prev-judgments", "it0/judgments.parquet", "--seed-data", "task/seed.parquet",
                 "--prev-curriculum", "it0/curriculum.json", "--model", "it0/model", "--base", "it0/model",
                 "--out", "it1/prompts.parquet", "--curriculum", "it1/curriculum.json", *p])


def test_one_iteration_on_smollm2(tmp_path, monkeypatch):
    raw = deep_merge(TINY, {
        "model": {"base": str(SMOL), "max_length": 256},
        "task": {"name": "word_math", "heldout_size": 8, "ttt_size": 8,
                 "instruction": "Answer with the final number only."},
        "evolve": {"fresh": 0, "keep_top": 0, "rewrites": 1},
        "sample": {"k": 2, "max_new_tokens": 24, "temperature": 0.7},
        "judge": {"method": "self_certainty"},
        "train": {"algorithm": "dpo", "epochs": 1, "batch_size": 8, "micro_batch_size": 4,
                  "lora": {"r": 4, "alpha": 8}},
        "evaluate": {"k": 2, "support_k": 2, "max_new_tokens": 24},
        "loop": {"it1": {"prev": "it0", "ref": "init"}},
    })
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(raw))
    monkeypatch.chdir(tmp_path)
    p = ["--params", str(params)]
    _prepare(p)
    record = json.loads((tmp_path / "it0/model/base.json").read_text())
    assert record["kind"] == "local" and len(record["sha256"]) == 64
    it = ["--iteration", "it1"]
    _evolve(it, p)
    sample.main([*it, "--prompts", "it1/prompts.parquet", "--model", "it0/model", "--base", "it0/model",
                 "--out", "it1/samples.parquet", *p])
    judge.main([*it, "--samples", "it1/samples.parquet", "--model", "it0/model", "--ref-model", "init/model",
                "--base", "it0/model", "--out", "it1/judgments.parquet", *p])
    pairs.main([*it, "--judgments", "it1/judgments.parquet", "--pairs", "it1/pairs.parquet",
                "--sft", "it1/sft.parquet", "--groups", "it1/groups.parquet", *p])
    train.main([*it, "--model", "it0/model", "--base", "it0/model", "--pairs", "it1/pairs.parquet",
                "--sft", "it1/sft.parquet", "--groups", "it1/groups.parquet", "--out", "it1/model",
                "--metrics", "it1/train.json", "--checkpoints", "it1/checkpoints", *p])
    art.write_json({}, tmp_path / "it0/train.json")
    evaluate.main(["--iteration", "it0", "--model", "it0/model", "--heldout", "task/heldout.parquet",
                   "--ttt", "task/ttt.parquet", "--train-metrics", "it0/train.json", "--eval-out", "it0/eval.parquet",
                   "--out", "it0/metrics.json", *p])
    evaluate.main([*it, "--model", "it1/model", "--base", "it0/model", "--heldout", "task/heldout.parquet",
                   "--ttt", "task/ttt.parquet", "--train-metrics", "it1/train.json",
                   "--judgments", "it1/judgments.parquet", "--pairs", "it1/pairs.parquet", "--sft", "it1/sft.parquet",
                   "--base-eval", "it0/eval.parquet", "--eval-out", "it1/eval.parquet", "--out", "it1/metrics.json", *p])
    # the label-free choice's base support: it0 samples each test-time problem in both wordings, itN does not
    ev0 = art.read_table(tmp_path / "it0/eval.parquet", art.EVAL)
    drawn = ev0[ev0["set"] == "ttt_sample"]
    assert len(drawn) == 2 * (8 + (ev0["set"] == "ttt_view").sum()) and drawn["response"].str.len().mean() > 10
    assert not (art.read_table(tmp_path / "it1/eval.parquet", art.EVAL)["set"] == "ttt_sample").any()
    m0 = art.read_json(tmp_path / "it0/metrics.json")
    assert 0 <= m0["lf_supported_agreement"] <= m0["lf_agreement"] and 0 <= m0["lf_base_support"] <= 1
    samples = art.read_table(tmp_path / "it1/samples.parquet", art.SAMPLES)
    assert samples["response"].str.len().mean() > 10  # a real model answers in words
    assert samples["pred"].notna().mean() > 0.5  # and its answers are read (GSM8K, "the answer is", last number)
    m = art.read_json(tmp_path / "it1/metrics.json")
    assert {"accuracy", "ttt_accuracy", "eval_extract_failure_rate"} <= set(m)
    assert m["lf_base_support_gain_lo"] <= m["lf_base_support_gain"] <= m["lf_base_support_gain_hi"]
    assert m["lf_supported_agreement"] <= m["lf_agreement"]
    # word problems rule the sum out where a step is not an addition: the clean agreement leaves it out
    assert m["lf_clean_agreement"] <= m["lf_supported_agreement"] and 0 <= m["lf_shortcut_share"] <= 1
    assert "lf_clean_agreement_gain_lo" in m
    assert m["num_pairs"] > 0 and m["train_steps"] >= 1
    judged = art.read_table(tmp_path / "it1/judgments.parquet", art.JUDGMENTS)
    assert m["truncated_share"] == pytest.approx(judged["truncated"].mean())
    chain = json.loads((tmp_path / "it1/model/chain.json").read_text())
    assert chain["adapters"] == ["it1"]
    adapter = sum(f.stat().st_size for f in (tmp_path / "it1/model").rglob("*") if f.is_file())
    assert adapter < 0.05 * (SMOL / "model.safetensors").stat().st_size
    base, tok = load_model(tmp_path / "it0/model", device="cpu")
    new, _ = load_model(tmp_path / "it1/model", device="cpu", base=tmp_path / "it0/model")
    ids = torch.tensor([chat_format(base, tok).prompt_ids("Sam has 5 apples and buys 14 more.")])
    with torch.no_grad():
        assert not torch.allclose(base(input_ids=ids).logits, new(input_ids=ids).logits)


VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"  # make vllm-env


def vllm_processes() -> list[int]:
    """Live processes vLLM named (its engine core is `VLLM::EngineCore`); an exited one not yet reaped
    (a zombie, which holds no memory) is not counted."""
    out = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "comm").read_text().startswith("VLLM") \
                    and (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                out.append(int(entry.name))
        except OSError:
            continue
    return out


@pytest.mark.skipif(not VLLM_PYTHON.is_file(), reason="run `make vllm-env` first (vLLM's CPU build)")
@pytest.mark.parametrize("offline", [True, False], ids=["worker", "serve"])
def test_a_loop_iteration_samples_through_a_vllm_server(tmp_path, monkeypatch, offline):
    """sample.backend vllm with sample.vllm.server_python, as recipe vllm-cpu sets it (bfloat16 where the
    CPU has it, no graph compilation): vLLM's offline engine in a worker process (the recipe's), or `vllm
    serve` spoken to over the OpenAI API. The engine stage merges it0 once, each sample stage starts the
    engine on that copy, samples and stops it, leaving no vLLM process behind; the same seed gives the
    same samples, in the schema every engine writes."""
    from self_improve import recipes
    from stages import engine

    overlay = recipes.load("vllm-cpu", ROOT)
    assert overlay["sample.backend"] == "vllm" and overlay["sample.vllm.server_python"] == ".venv-vllm/bin/python"
    assert overlay["sample.vllm.offline"]

    raw = deep_merge(TINY, {
        "model": {"base": str(SMOL), "max_length": 512},
        "task": {"name": "word_math", "heldout_size": 8, "ttt_size": 8,
                 "instruction": "Answer with the final number only."},
        "evolve": {"fresh": 0, "keep_top": 0, "rewrites": 1},
        "sample": {"backend": "vllm", "k": 4, "max_new_tokens": 32, "temperature": 0.7,
                   "vllm": {"server_python": str(VLLM_PYTHON), "server_dtype": overlay["sample.vllm.server_dtype"],
                            "server_args": overlay["sample.vllm.server_args"], "offline": offline,
                            "cpu_kv_cache_gb": overlay["sample.vllm.cpu_kv_cache_gb"]}},
        "loop": {"it1": {"prev": "it0", "ref": "init"}},
    })
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(raw))
    monkeypatch.chdir(tmp_path)
    p = ["--params", str(params)]
    _prepare(p)
    engine.main(["--iteration", "it0", "--model", "it0/model", "--base", "it0/model", "--out", "it0/engine", *p])
    assert json.loads((tmp_path / "it0/engine/engine.json").read_text()) == {"engine": "vllm", "model": "hf"}
    it = ["--iteration", "it1"]
    _evolve(it, p)
    before = set(vllm_processes())
    runs = []
    for out in ("a.parquet", "b.parquet"):
        sample.main([*it, "--prompts", "it1/prompts.parquet", "--model", "it0/model", "--base", "it0/model",
                     "--engine", "it0/engine", "--out", out, *p])
        runs.append(art.read_table(out, art.SAMPLES))
        assert art.read_provenance(out)["backend"] == "vllm"
    prompts = art.read_table("it1/prompts.parquet", art.PROMPTS)
    assert not [pid for pid in vllm_processes() if pid not in before]  # each stage stopped its server, engine and all
    assert len(runs[0]) == 4 * len(prompts) and runs[0]["response"].str.len().mean() > 5
    assert runs[0]["pred"].notna().mean() > 0.5
    assert runs[0]["response"].tolist() == runs[1]["response"].tolist()  # seeded: the same samples again
    assert runs[0].groupby("prompt_id")["response"].nunique().max() > 1  # temperature 0.7: not all alike


@pytest.mark.skipif(not VLLM_PYTHON.is_file(), reason="run `make vllm-env` first (vLLM's CPU build)")
def test_vllm_draws_the_prompts_of_one_call_independently():
    """The same prompt twice in one call draws different samples (each prompt has its own seed; with one
    seed for all, sample j of every prompt drew the same random numbers), and the call repeats."""
    from self_improve import recipes
    from self_improve.config import VllmConfig
    from self_improve.engines.hf import SamplingSpec
    from self_improve.engines.vllm_server import VLLMWorkerSampler

    overlay = recipes.load("vllm-cpu", ROOT)
    cfg = VllmConfig(server_python=str(VLLM_PYTHON), offline=True, server_dtype=overlay["sample.vllm.server_dtype"],
                     server_args=overlay["sample.vllm.server_args"], cpu_kv_cache_gb=1)
    sampler = VLLMWorkerSampler(cfg.server_python, SMOL, cfg, 512)
    try:
        spec = SamplingSpec(n=4, temperature=0.7, max_new_tokens=24)
        prompt = "Sam has 5 apples and buys 14 more. How many apples does he have?"
        first = sampler.generate([prompt, prompt], spec, 3, progress=False)
        assert first[0] != first[1]
        assert list(sampler.generate([prompt, prompt], spec, 3, progress=False)) == list(first)
    finally:
        sampler.close()


@pytest.mark.heavy  # `make test-slow`, not CI: CoMAS's stages run in make test and make test-e2e on tiny models
def test_comas_iteration_on_smollm2(tmp_path, monkeypatch):
    """CoMAS on the real chat model: two agents discuss (solve, evaluate, score), each is trained on its
    own rewards as its own adapter, and each is evaluated against it0; every stage CoMAS's DAG runs."""
    from runners.dag import COMAS_TEMPLATE, comas_commands
    from self_improve.agents.discussion import TRANSCRIPTS
    from self_improve.models.loading import read_chain

    raw = deep_merge(yaml.safe_load((ROOT / "params.yaml").read_text()), deep_merge(TINY, {
        "model": {"base": str(SMOL), "max_length": 768},
        "task": {"name": "word_math", "heldout_size": 8, "ttt_size": 8,
                 "instruction": "Answer with the final number only."},
        "sample": {"backend": "hf"},
        "train": {"epochs": 1, "batch_size": 8, "micro_batch_size": 4, "lora": {"r": 4, "alpha": 8}},
        "evaluate": {"k": 0, "max_new_tokens": 24},
        "agents": {"n": 2, "rounds": 1, "references": 1, "problems": 2, "max_new_tokens": 32, "temperature": 0.7,
                   "loop": {"it1": {"prev": "it0"}}},
    }))
    raw["loop"] = {"it1": {"prev": "it0", "ref": "init"}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    shutil.copy2(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    (tmp_path / COMAS_TEMPLATE).parent.mkdir(parents=True)
    shutil.copy2(ROOT / COMAS_TEMPLATE, tmp_path / COMAS_TEMPLATE)
    monkeypatch.chdir(tmp_path)
    for _, cmd in comas_commands(tmp_path):
        importlib.import_module(cmd[2]).main(cmd[3:])
    t = art.read_table(tmp_path / "data/comas/it1/transcripts.parquet", TRANSCRIPTS)
    assert len(t) == 1 * 2 * 2 * 3  # rounds x problems x agents x roles
    assert (t["agent"] != t["solver"])[t["role"] != "solution"].all()  # nobody reviews their own solution
    assert t["response"].str.len().mean() > 10  # a real model answers in words
    solutions = t[t["role"] == "solution"]
    assert solutions["pred"].notna().mean() > 0.5 and solutions["correct"].notna().all()
    scores = t[t["role"] == "score"]
    # rewards as allocated: a parsed score s gives the solution (s - 1) / 2; an unparsed one the scorer -1
    assert (scores["reward"] == scores["score"].isna().map({True: -1.0, False: 0.0})).all()
    m = art.read_json(tmp_path / "reports/comas/iterations/it1/metrics.json")
    for k in (0, 1):
        agent = m["agents"][f"agent{k}"]
        assert agent["score_parse_rate"] == pytest.approx(scores[scores["agent"] == k]["score"].notna().mean())
        assert {"accuracy", "accuracy_gain", "accuracy_gain_lo", "accuracy_gain_hi"} <= set(agent)
        assert read_chain(tmp_path / f"data/comas/it1/agents/agent{k}")["adapters"] == ["it1"]
    assert (tmp_path / "reports/comas/summary.md").is_file()
