"""CTranslate2 (ct2): conversion once per iteration, greedy outputs equal to hf's, seeded sampling,
the engine stage, and the fallback to hf that only `auto` takes."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from self_improve import artifacts as art
from self_improve.config import Ct2Config, SampleConfig
from self_improve.engines.ct2 import CT2Sampler, common_prefix, convert, ct2_unavailable
from self_improve.engines.engine import read_engine
from self_improve.engines.hf import SamplingSpec, generate
from self_improve.engines.sampler import open_sampler
from self_improve.errors import ConfigError
from self_improve.models.loading import save_model
from stages import engine as engine_stage
from stages import sample as sample_stage

pytestmark = pytest.mark.skipif(bool(ct2_unavailable()), reason=f"{ct2_unavailable()}")

PROMPTS = [f"{a}+{b}=" for a in range(10, 30) for b in (11, 57)]


@pytest.fixture(scope="module")
def model_dir(tok, trained, tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "model"
    save_model(trained, tok, path, {"test": True})
    return path


@pytest.fixture(scope="module")
def engine_dir(model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("e") / "engine"
    record = convert(model_dir, None, out)
    assert record["engine"] == "ct2" and record["architecture"] == "LlamaForCausalLM"
    return out


def test_common_prefix_leaves_every_row_a_token_of_its_own():
    assert common_prefix([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 9]]) == 2
    assert common_prefix([[1, 2], [1, 2]]) == 1
    assert common_prefix([[7]]) == 0 and common_prefix([]) == 0


@pytest.mark.parametrize("inter_threads", [1, 2])
def test_greedy_equals_hf_token_for_token(engine_dir, trained, tok, inter_threads):
    spec = SamplingSpec(n=1, greedy=True, max_new_tokens=2, batch_size=8)
    hf = generate(trained, tok, PROMPTS, spec, 0, progress=False)
    ct2 = CT2Sampler(engine_dir, Ct2Config(inter_threads=inter_threads, batch_size=8)).generate(PROMPTS, spec, 0, progress=False)
    assert list(ct2) == list(hf)
    assert ct2.truncated == hf.truncated and ct2.new_tokens == hf.new_tokens
    assert any(not t[0] for t in hf.truncated) and any(t[0] for t in hf.truncated)  # both kinds of ending


def test_sampling_is_seeded_per_call(engine_dir):
    spec = SamplingSpec(n=4, temperature=1.0, max_new_tokens=4, batch_size=8)
    one = CT2Sampler(engine_dir, Ct2Config(inter_threads=2, batch_size=16))
    first = one.generate(PROMPTS, spec, 1, progress=False)
    one.generate(PROMPTS, spec, 2, progress=False)
    assert one.generate(PROMPTS, spec, 1, progress=False) == first  # whatever ran before
    again = CT2Sampler(engine_dir, Ct2Config(inter_threads=1, batch_size=16))  # as another process would
    assert again.generate(PROMPTS, spec, 1, progress=False) == first
    other = one.generate(PROMPTS, spec, 2, progress=False)
    assert other != first
    assert [len(r) for r in first] == [4] * len(PROMPTS)
    assert len({r for rs in first for r in rs}) > len(PROMPTS)  # temperature 1 draws distinct samples


def test_sampling_lanes_are_seeded_apart_and_reproducible(engine_dir):
    """Two lanes (two generators, every other batch each, at once): the same samples on every call
    and in another sampler, each prompt its n samples; the lanes have seeds of their own (one prompt
    repeated: lane 0's batch and lane 1's draw differently), and greedy ignores lanes."""
    spec = SamplingSpec(n=4, temperature=1.0, max_new_tokens=4, batch_size=8)
    cfg = Ct2Config(inter_threads=2, batch_size=16, lanes=2)  # 4 prompts a batch
    two = CT2Sampler(engine_dir, cfg)
    first = two.generate(PROMPTS, spec, 1, progress=False)
    assert CT2Sampler(engine_dir, cfg).generate(PROMPTS, spec, 1, progress=False) == first
    two.generate(PROMPTS, spec, 2, progress=False)
    assert two.generate(PROMPTS, spec, 1, progress=False) == first
    assert [len(r) for r in first] == [4] * len(PROMPTS) and first.new_tokens > 0
    same = two.generate([PROMPTS[0]] * 8, spec, 1, progress=False)
    assert same[:4] != same[4:]
    greedy = SamplingSpec(n=1, greedy=True, max_new_tokens=2, batch_size=8)
    assert list(two.generate(PROMPTS, greedy, 0, progress=False)) == list(
        CT2Sampler(engine_dir, Ct2Config(batch_size=8)).generate(PROMPTS, greedy, 0, progress=False))


def test_int8_loads_the_same_conversion(engine_dir):
    spec = SamplingSpec(n=1, greedy=True, max_new_tokens=4, batch_size=8)
    out = CT2Sampler(engine_dir, Ct2Config(compute_type="int8")).generate(PROMPTS, spec, 0, progress=False)
    assert len(out) == len(PROMPTS) and all(len(r) == 1 for r in out)


def test_without_an_engine_dir_it_converts_for_the_sampler(model_dir, engine_dir):
    spec = SamplingSpec(n=1, greedy=True, max_new_tokens=4, batch_size=8)
    sampler = open_sampler(model_dir, SampleConfig(backend="ct2"))
    assert sampler.backend == "ct2"
    assert sampler.generate(PROMPTS, spec, 0, progress=False) == CT2Sampler(engine_dir).generate(
        PROMPTS, spec, 0, progress=False)


def _params(tmp_path, tiny_raw, backend: str):
    tiny_raw["sample"]["backend"] = backend
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(tiny_raw))
    return str(path)


def test_engine_stage_converts_once_and_sample_reads_it(model_dir, tmp_path, tiny_raw, monkeypatch):
    params = _params(tmp_path, tiny_raw, "ct2")
    monkeypatch.chdir(tmp_path)
    engine_stage.main(["--iteration", "it0", "--model", str(model_dir), "--out", "engine", "--params", params])
    assert read_engine("engine")["engine"] == "ct2"
    assert (tmp_path / "engine" / "ct2" / "model.bin").is_file()
    prompts = pd.DataFrame([{"iteration": "it1", "prompt_id": f"p{i}/v0", "group_id": f"p{i}", "variant": 0,
                             "source": "ttt", "category": "c", "prompt": p, "answer": str(eval(p[:-1]))}
                            for i, p in enumerate(PROMPTS[:6])])
    art.write_table(prompts, "prompts.parquet", art.PROMPTS)
    args = ["--iteration", "it1", "--prompts", "prompts.parquet", "--model", str(model_dir), "--params", params]
    sample_stage.main(args + ["--engine", "engine", "--out", "ct2.parquet"])
    prov = art.read_provenance("ct2.parquet")
    assert prov["backend"] == "ct2" and prov["compute_type"] == "float32"
    out = art.read_table("ct2.parquet", art.SAMPLES)
    assert len(out) == 6 * tiny_raw["sample"]["k"] and out["response"].notna().all()
    sample_stage.main(args + ["--engine", "engine", "--out", "again.parquet"])
    pd.testing.assert_frame_equal(out, art.read_table("again.parquet", art.SAMPLES))  # seeded: same bytes' content
    hf = _params(tmp_path, tiny_raw, "hf")
    sample_stage.main(["--iteration", "it1", "--prompts", "prompts.parquet", "--model", str(model_dir),
                       "--params", hf, "--engine", "engine", "--out", "hf.parquet"])
    assert list(art.read_table("hf.parquet", art.SAMPLES).columns) == list(out.columns)  # one schema


def test_engine_stage_with_hf_writes_only_the_record(model_dir, tmp_path, tiny_raw, monkeypatch):
    params = _params(tmp_path, tiny_raw, "hf")
    monkeypatch.chdir(tmp_path)
    engine_stage.main(["--iteration", "it0", "--model", str(model_dir), "--out", "engine", "--params", params])
    assert sorted(p.name for p in (tmp_path / "engine").iterdir()) == ["engine.json", "provenance.json"]
    assert json.loads((tmp_path / "engine" / "engine.json").read_text()) == {"engine": "hf"}


@pytest.fixture(scope="module")
def unconvertible(tmp_path_factory, tok):
    """A causal LM CTranslate2's converter does not know (GPT-Neo)."""
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    cfg = GPTNeoConfig(vocab_size=len(tok), hidden_size=16, num_layers=1, num_heads=2, attention_types=[[["global"], 1]],
                       max_position_embeddings=64, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    path = tmp_path_factory.mktemp("neo") / "model"
    save_model(GPTNeoForCausalLM(cfg), tok, path, {"test": True})
    return path


def test_an_unknown_architecture_is_named_and_only_auto_falls_back(unconvertible, tmp_path, tiny_raw, monkeypatch,
                                                                    capsys):
    with pytest.raises(ConfigError, match=r"CTranslate2 cannot convert GPTNeoForCausalLM .*knows no such"):
        convert(unconvertible, None, tmp_path / "x")
    monkeypatch.chdir(tmp_path)
    args = ["--iteration", "it0", "--model", str(unconvertible)]
    with pytest.raises(SystemExit) as exit_:
        engine_stage.main(args + ["--out", "strict", "--params", _params(tmp_path, tiny_raw, "ct2")])
    assert exit_.value.code == 2
    assert "engine: error: sample.backend ct2: CTranslate2 cannot convert GPTNeoForCausalLM" in capsys.readouterr().err
    assert not (tmp_path / "strict").exists()  # nothing half-written
    auto = _params(tmp_path, tiny_raw, "auto")
    engine_stage.main(args + ["--out", "auto", "--params", auto])
    record = read_engine("auto")
    assert record["engine"] == "hf" and "GPTNeoForCausalLM" in record["fallback"]
    sampler = open_sampler(unconvertible, SampleConfig(backend="auto"), engine="auto")
    assert sampler.backend == "hf"


def test_scores_equal_torch(engine_dir, trained, tok):
    from self_improve.engines.hf import score

    responses = [f"{a}" for a in range(len(PROMPTS))]
    responses[3] = ""  # only the end-of-turn token
    hf = score(trained, tok, PROMPTS, responses, batch_size=8, progress=False)
    ct2 = CT2Sampler(engine_dir).score(PROMPTS, responses, batch_size=8, max_tokens=64, progress=False)
    assert ct2.tokens == hf.tokens and ct2.processed_tokens == hf.processed_tokens > 0
    assert ct2.logp == pytest.approx(hf.logp, abs=1e-3)
    assert ct2.self_certainty == pytest.approx(hf.self_certainty, abs=1e-3)
    assert len({round(x, 3) for x in hf.logp}) > 1  # the rows differ
    assert CT2Sampler(engine_dir).score([], []).logp == []


def _first_char(text: str):
    """A stop rule for the tiny model's digit answers: the answer ends after its first character, once a
    second one shows it is not the last (as tasks/answers.py's answer_end waits for what follows)."""
    return 1 if len(text) >= 2 else None


@pytest.mark.parametrize("engine", ["hf", "ct2"])
def test_the_answer_stop_gives_the_unstopped_response_cut_where_its_answer_ends(engine, engine_dir, trained, tok):
    """Greedy decoding stopped at the answer equals greedy decoding run on and cut there afterwards, on each
    engine, with fewer tokens generated: the stop never cuts inside what the rule calls the answer."""
    from self_improve.engines.hf import finish

    run = (lambda spec: generate(trained, tok, PROMPTS, spec, 0, progress=False)) if engine == "hf" else \
        (lambda spec: CT2Sampler(engine_dir, Ct2Config(batch_size=8)).generate(PROMPTS, spec, 0, progress=False))
    full = run(SamplingSpec(n=1, greedy=True, max_new_tokens=4, batch_size=8))
    stopped = run(SamplingSpec(n=1, greedy=True, max_new_tokens=4, batch_size=8, stop_at=_first_char))
    assert [r[0] for r in stopped] == [finish(r[0], _first_char)[0] for r in full]
    assert any(len(r[0]) >= 2 for r in full)  # the rule fired somewhere
    assert stopped.new_tokens < full.new_tokens
    cut_short = [t[0] for r, f, t in zip(stopped, full, stopped.truncated) if len(f[0]) >= 2]
    assert cut_short and not any(cut_short)  # a response stopped at its answer is not truncated
