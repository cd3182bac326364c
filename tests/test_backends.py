"""Sampling backends (hf, ct2, vllm) and batched log-prob scoring on a real tiny model."""

import math

import pytest
import torch
import torch.nn.functional as F
import yaml

from self_improve.config import SampleConfig
from self_improve.engines.ct2 import ct2_unavailable
from self_improve.engines.hf import SamplingSpec, encode_for_training, generate, memory_cap, score
from self_improve.engines.sampler import HFSampler, open_sampler, resolve_backend, vllm_unavailable
from self_improve.errors import ConfigError, PipelineError
from self_improve.models.loading import save_model
from stages import sample as sample_stage

NO_VLLM = vllm_unavailable()


@pytest.fixture(scope="module")
def model_dir(tok, trained, tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "model"
    save_model(trained, tok, path, {"test": True})
    return path


def test_auto_takes_vllm_then_ct2_then_hf(model_dir, monkeypatch):
    if NO_VLLM:
        want = "hf" if ct2_unavailable() else "ct2"
        assert resolve_backend("auto") == want
        assert open_sampler(model_dir, SampleConfig()).backend == want
        monkeypatch.setattr("self_improve.engines.ct2.ct2_unavailable", lambda: "not installed")  # what auto reads
        assert resolve_backend("auto") == "hf"
        assert open_sampler(model_dir, SampleConfig()).backend == "hf"
    else:
        assert resolve_backend("auto") == "vllm"
    assert resolve_backend("hf") == "hf"


@pytest.mark.skipif(not NO_VLLM, reason="vllm and a GPU are present: the refusal cannot be shown")
def test_vllm_refused_with_the_reason_and_nothing_written(model_dir, tmp_path, tiny_raw, monkeypatch, capsys):
    with pytest.raises(PipelineError, match=r"sample.backend: vllm cannot run here: "):
        open_sampler(model_dir, SampleConfig(backend="vllm"))
    tiny_raw["sample"]["backend"] = "vllm"
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(tiny_raw))
    import pandas as pd

    from self_improve import artifacts as art

    prompts = pd.DataFrame([{"iteration": "it1", "prompt_id": "p/v0", "group_id": "p", "variant": 0,
                             "source": "ttt", "category": "c", "prompt": "12+34=", "answer": "46"}])
    art.write_table(prompts, tmp_path / "prompts.parquet", art.PROMPTS)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        sample_stage.main(["--iteration", "it1", "--prompts", "prompts.parquet", "--model", str(model_dir),
                           "--out", "samples.parquet", "--params", str(params)])
    assert exit_.value.code == 2
    assert "sample: error: sample.backend: vllm cannot run here:" in capsys.readouterr().err
    assert not (tmp_path / "samples.parquet").exists()


@pytest.mark.skipif(bool(NO_VLLM), reason=f"vllm backend not testable here: {NO_VLLM}")
def test_vllm_greedy_matches_hf(model_dir, tok, trained):
    prompts = ["12+34=", "23+45=", "31+17=", "10+10="]
    spec = SamplingSpec(n=1, greedy=True, max_new_tokens=4)
    vllm_out = open_sampler(model_dir, SampleConfig(backend="vllm")).generate(prompts, spec, 0, progress=False)
    hf_out = HFSampler(trained, tok).generate(prompts, spec, 0, progress=False)
    assert vllm_out == hf_out
    sampled = open_sampler(model_dir, SampleConfig(backend="vllm")).generate(
        prompts, SamplingSpec(n=3, temperature=1.0, max_new_tokens=4), 1, progress=False)
    assert [len(s) for s in sampled] == [3] * 4


def test_vllm_engines_split_the_gpus_and_the_prompts_in_order():
    from self_improve.engines.sampler import engine_plan, split_evenly

    gpus = ["0", "1", "2", "3"]
    assert engine_plan(gpus, 1, 0) == [["0"], ["1"], ["2"], ["3"]]  # data parallel: one engine per GPU
    assert engine_plan(gpus, 2, 0) == [["0", "1"], ["2", "3"]]
    assert engine_plan(gpus, 2, 1) == [["0", "1"]]
    assert engine_plan(["6", "7"], 1, 2) == [["6"], ["7"]]  # names as CUDA_VISIBLE_DEVICES gave them
    with pytest.raises(ConfigError, match=r"sample.vllm: 2 engine\(s\) x tensor_parallel_size 2 need 4 GPUs; 2 visible"):
        engine_plan(["0", "1"], 2, 2)
    with pytest.raises(ConfigError, match=r"0 visible \(none\)"):
        engine_plan([], 1, 0)
    assert split_evenly(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert split_evenly([1], 3) == [[1], [], []]
    assert [x for part in split_evenly(list(range(10)), 4) for x in part] == list(range(10))


@pytest.mark.skipif(bool(NO_VLLM) or torch.cuda.device_count() < 2,
                    reason=f"vllm data parallel needs vllm and 2 GPUs: {NO_VLLM or 'fewer than 2 GPUs'}")
def test_vllm_data_parallel_samples_what_one_engine_samples(model_dir):
    from self_improve.config import VllmConfig

    prompts = [f"{10 + i}+{20 + i}=" for i in range(9)]
    spec = SamplingSpec(n=2, temperature=1.0, max_new_tokens=4)
    one = open_sampler(model_dir, SampleConfig(backend="vllm", vllm=VllmConfig(data_parallel_size=1)))
    two = open_sampler(model_dir, SampleConfig(backend="vllm", vllm=VllmConfig(data_parallel_size=2)))
    assert len(two.engines) == 2
    assert two.generate(prompts, spec, 3, progress=False) == one.generate(prompts, spec, 3, progress=False)


def test_sample_stage_records_the_backend(model_dir, tmp_path, tiny_raw, monkeypatch):
    import pandas as pd

    from self_improve import artifacts as art

    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(tiny_raw))
    prompts = pd.DataFrame([{"iteration": "it1", "prompt_id": f"p{i}/v0", "group_id": f"p{i}", "variant": 0,
                             "source": "ttt", "category": "c", "prompt": f"{10 + i}+34=", "answer": str(44 + i)}
                            for i in range(5)])
    art.write_table(prompts, tmp_path / "prompts.parquet", art.PROMPTS)
    monkeypatch.chdir(tmp_path)
    sample_stage.main(["--iteration", "it1", "--prompts", "prompts.parquet", "--model", str(model_dir),
                       "--out", "samples.parquet", "--params", str(params)])
    out = art.read_table("samples.parquet", art.SAMPLES)
    assert len(out) == 5 * tiny_raw["sample"]["k"]
    assert art.read_provenance("samples.parquet")["backend"] == tiny_raw["sample"]["backend"] == "hf"


def test_memory_cap_shrinks_with_length_and_bounds_the_batch(trained, tok, monkeypatch):
    assert memory_cap(trained, 10) >= memory_cap(trained, 1000) >= 1
    prompts = ["1+2=", "23+45=", "99+9=", "10+10=", "7+88="]
    spec = SamplingSpec(n=1, greedy=True, max_new_tokens=4, batch_size=64)
    free = generate(trained, tok, prompts, spec, seed=0, progress=False)
    # with almost no free memory each call holds one prompt: same greedy answers
    monkeypatch.setattr("self_improve.engines.hf._free_bytes", lambda device: 1)
    assert generate(trained, tok, prompts, spec, seed=0, progress=False) == free


def test_score_matches_a_direct_computation(trained, tok):
    prompts = ["12+34=", "5+5=", "99+99="]
    responses = ["46", "10", "x"]
    got = score(trained, tok, prompts, responses, batch_size=2, progress=False)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        enc = encode_for_training(tok, [p], [r])
        with torch.no_grad():
            logits = trained(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits[0, :-1]
        logps = F.log_softmax(logits.double(), -1)
        mask = enc["loss_mask"][0, 1:].bool()
        target = logps.gather(1, enc["input_ids"][0, 1:, None])[:, 0]
        assert got.logp[i] == pytest.approx(target[mask].sum().item(), rel=1e-5)
        assert got.tokens[i] == len(r) + 1  # the response's characters and <eos>
        v = logps.shape[-1]
        kl = (-(math.log(v)) - logps.mean(-1))[mask].mean().item()  # KL(U || p), mean over tokens
        assert got.self_certainty[i] == pytest.approx(kl, rel=1e-5)
        assert got.self_certainty[i] > 0
    assert score(trained, tok, prompts, responses, batch_size=64, progress=False).logp == pytest.approx(got.logp)


def test_adaptive_sampling_draws_windows_until_each_vote_group_settles(model_dir, tmp_path, tiny_raw, monkeypatch):
    """The sample stage with sample.adaptive and a vote judge: each prompt gets whole windows, never more
    than k; a vote group's prompts get the same number; the provenance says what was drawn and why
    groups stopped; a judge that is not a vote keeps k."""
    import pandas as pd

    from self_improve import artifacts as art

    prompts = pd.DataFrame([{"iteration": "it1", "prompt_id": f"p{i}/v{v}", "group_id": f"p{i}", "variant": v,
                             "source": "ttt", "category": "c", "prompt": f"{10 + i}+{34 + v}=", "answer": None}
                            for i in range(12) for v in range(2)])
    art.write_table(prompts, tmp_path / "prompts.parquet", art.PROMPTS)
    monkeypatch.chdir(tmp_path)

    def run(method: str) -> tuple[pd.DataFrame, dict]:
        raw = {**tiny_raw, "judge": {"method": method},
               "sample": {**tiny_raw["sample"], "k": 6, "temperature": 1.0, "adaptive": {"enabled": True, "window": 2}}}
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
        sample_stage.main(["--iteration", "it1", "--prompts", "prompts.parquet", "--model", str(model_dir),
                           "--out", "samples.parquet", "--params", "params.yaml"])
        return art.read_table("samples.parquet", art.SAMPLES), art.read_provenance("samples.parquet")["drawn"]

    out, drawn = run("co_reward")
    per_prompt = out.groupby("prompt_id").size()
    assert set(per_prompt) <= {2, 4, 6} and drawn["samples"] == len(out) == per_prompt.sum()
    assert drawn["samples_at_k"] == 24 * 6 and drawn["groups"] == 12
    assert sum(drawn[f"stopped_{r}"] for r in ("no_label", "below_gate", "settled", "unanimous", "full")) == 12
    assert (out.groupby("group_id")["prompt_id"].value_counts().unstack().nunique(axis=1) == 1).all()
    assert list(out[out["prompt_id"] == "p0/v0"]["sample_id"]) == [f"p0/v0/s{j}" for j in range(per_prompt["p0/v0"])]
    out, drawn = run("verifier")
    assert len(out) == 24 * 6 and drawn["saved_share"] == 0.0


def test_each_prompt_of_a_vllm_call_gets_its_own_seed():
    """vLLM seeds a request's j-th sample with its seed + j: the seeds of one call's prompts are drawn
    from the call's seed (the same again for the same seed), differ, and leave room for the n samples."""
    from self_improve.engines.vllm_server import prompt_seeds

    seeds = prompt_seeds(7, 300, 8)
    assert seeds == prompt_seeds(7, 300, 8) and seeds != prompt_seeds(8, 300, 8)
    assert len(set(seeds)) == 300 and all(0 <= s < 2**31 - 8 for s in seeds)
    spans = sorted(seeds)
    assert all(b - a >= 8 for a, b in zip(spans, spans[1:]))  # no two prompts share a sample's seed


def test_a_vllm_server_command_takes_the_dtype_the_flags_and_the_cpus_own_kernels_for_bfloat16(monkeypatch):
    """server_python's `vllm serve`: `server_dtype: auto` is bfloat16 on a CPU with bfloat16 instructions
    (the server then runs without the AVX2 pins, under which oneDNN emulates bfloat16) and float32
    elsewhere (the pins stay); `server_args` reach the command."""
    from self_improve.config import SecurityConfig, VllmConfig
    from self_improve.engines import vllm_server

    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setenv("SELF_IMPROVE_PINNED", "1")
    cfg = VllmConfig(server_python="py", server_dtype="auto", server_args=["--enforce-eager"], cpu_kv_cache_gb=1)
    for flags, dtype in (({"avx2", "avx512_bf16"}, "bfloat16"), ({"avx2", "amx_bf16"}, "bfloat16"), ({"avx2"}, "float32")):
        monkeypatch.setattr(vllm_server, "cpu_flags", lambda: flags)
        cmd, env = vllm_server.server_command("py", "m", cfg, 1024, SecurityConfig(), 8123)
        assert cmd[cmd.index("--dtype") + 1] == dtype and cmd[-1] == "--enforce-eager"
        assert cmd[cmd.index("--max-num-batched-tokens") + 1] == "2048"
        assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["VLLM_USE_AOT_COMPILE"] == "0"
        pinned = env.get("ONEDNN_MAX_CPU_ISA") == "AVX2"
        assert pinned == (dtype == "float32"), env.get("ONEDNN_MAX_CPU_ISA")
    fixed = VllmConfig(server_python="py", server_dtype="float32")
    cmd, _ = vllm_server.server_command("py", "m", fixed, 4096, SecurityConfig(), 8123)
    assert cmd[cmd.index("--dtype") + 1] == "float32" and cmd[cmd.index("--max-num-batched-tokens") + 1] == "4096"
    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "1")  # the user's choice wins
    assert vllm_server.server_command("py", "m", fixed, 1024, SecurityConfig(), 1)[1]["VLLM_USE_AOT_COMPILE"] == "1"
