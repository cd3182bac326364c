"""Pretrained models through every stage, on a small chat model built in the test (no download):
one formatting path, stop ids and truncation, memory-bounded training, adapter chains, export,
and bad `model.base` values refused before any work."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from self_improve import artifacts as art
from self_improve.chat import ChatFormat
from self_improve.config import DpoConfig, LoraConfig
from self_improve.engines.hf import (
    SamplingSpec,
    chat_format,
    collate,
    encode_rows,
    generate,
    selective_log_softmax,
    token_logprobs,
)
from self_improve.models import export
from self_improve.models.loading import attach_lora, load_model
from self_improve.training import loop
from self_improve.training.loop import Schedule, _micro
from self_improve.training.trainers import PreferenceTrainer, RunContext, SFTTrainer
from stages import prepare

from .conftest import ROOT, deep_merge, run_all, stage_argv


@pytest.fixture(scope="module")
def bpe(bpe_model_dir):
    return load_model(bpe_model_dir, device="cpu")


def test_training_rows_start_with_exactly_the_inference_prompt(bpe, monkeypatch):
    model, tok = bpe
    chat = chat_format(model, tok)
    prompts = ["12+34=", "7+8=", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1="}]]
    seen: list[list[int]] = []
    real = model.generate

    def spy(input_ids, attention_mask, **kw):
        for ids, mask in zip(input_ids.tolist(), attention_mask.tolist()):
            seen.append([i for i, m in zip(ids, mask) if m])
        assert kw["eos_token_id"] == chat.stop_ids
        return real(input_ids=input_ids, attention_mask=attention_mask, **kw)

    monkeypatch.setattr(model, "generate", spy)
    generate(model, tok, prompts, SamplingSpec(n=1, greedy=True, max_new_tokens=2), 0, progress=False)
    rows = encode_rows(chat, prompts, ["The answer is 46.", "15", "2"])
    assert sorted(seen) == sorted(r.ids[: r.prompt_len] for r in rows)
    text = tok.decode(rows[0].ids[: rows[0].prompt_len])
    assert text == "<|im_start|>user\n12+34=<|im_end|>\n<|im_start|>assistant\n"
    # the training target: the response, then the template's end of turn, and the loss only there
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert rows[0].ids[-1] == im_end and chat.end_of_turn == [im_end]
    batch = collate(rows, tok.pad_token_id)
    assert batch["loss_mask"][0].sum().item() == rows[0].response_len
    assert tok.decode([i for i, m in zip(batch["input_ids"][0].tolist(), batch["loss_mask"][0].tolist()) if m]) \
        == "The answer is 46.<|im_end|>"


def test_generation_stops_on_every_eos_id_and_counts_truncation(bpe):
    model, tok = bpe
    chat = chat_format(model, tok)
    end_of_text, im_end = tok.convert_tokens_to_ids("<|endoftext|>"), tok.convert_tokens_to_ids("<|im_end|>")
    assert set(chat.stop_ids) == {end_of_text, im_end}  # the generation config lists both
    spec = SamplingSpec(n=2, temperature=1.0, max_new_tokens=4)
    free = generate(model, tok, ["1+2="], spec, 0, progress=False)
    assert free.truncated == [[True, True]] and free.truncated_share() == 1.0
    # make the second eos id (not the tokenizer's eos) the only likely token: generation stops there
    hook = model.lm_head.register_forward_hook(lambda m, i, out: out.index_fill(-1, torch.tensor([end_of_text]), 1e4))
    try:
        stopped = generate(model, tok, ["1+2="], spec, 0, progress=False)
        only_im_end = ChatFormat(tok, True, [im_end], [im_end])
        runs_on = generate(model, tok, ["1+2="], spec, 0, progress=False, chat=only_im_end)
    finally:
        hook.remove()
    assert stopped == [["", ""]] and stopped.truncated == [[False, False]]
    assert runs_on.truncated == [[True, True]]
    assert chat.cut_at_stop([5, 6, end_of_text, 7]) == ([5, 6], True)
    assert chat.cut_at_stop([5, 6]) == ([5, 6], False)


def test_response_logprobs_do_not_depend_on_the_batch(bpe):
    model, tok = bpe
    chat = chat_format(model, tok)
    rows = encode_rows(chat, ["1+2=", "a much longer prompt: 12+34+56=", "9+9="], ["3", "The answer is 102.", "18"])
    with torch.no_grad():
        together, mask = token_logprobs(model, collate(rows, tok.pad_token_id))
        for i, r in enumerate(rows):
            alone, m1 = token_logprobs(model, collate([r], tok.pad_token_id))
            n = r.response_len
            assert mask[i].sum().item() == m1.sum().item() == n
            assert torch.allclose(together[i, :n], alone[0, :n], atol=1e-5)
            # the direct computation: full log-softmax over the row
            logits = model(input_ids=torch.tensor([r.ids])).logits[0, :-1]
            direct = F.log_softmax(logits.double(), -1).gather(1, torch.tensor(r.ids[1:])[:, None])[:, 0]
            assert torch.allclose(alone[0, :n].double(), direct[r.prompt_len - 1 :], atol=1e-5)


def test_selective_log_softmax_matches_log_softmax():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 50) * 4
    index = torch.randint(0, 50, (3, 5))
    want = F.log_softmax(logits.double(), -1).gather(-1, index[..., None])[..., 0]
    assert torch.allclose(selective_log_softmax(logits, index).double(), want, atol=1e-5)
    assert torch.allclose(selective_log_softmax(logits.bfloat16(), index).double(), want, atol=0.1)


def _trained(model_dir: Path, micro: int | None, train, checkpointing: bool = False) -> dict[str, torch.Tensor]:
    """The weights after `train(ctx, model)`: two steps at lr 1e-2 on a batch of 8 in micro-batches of `micro`."""
    model, tok = load_model(model_dir, device="cpu")
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ctx = RunContext(tok, Schedule(1e-2, 2), batch_size=8, seed=0, micro_batch_size=micro, chat=chat_format(model, tok))
    train(ctx, model)
    return {k: v.clone() for k, v in model.state_dict().items()}


def _moved(model_dir: Path, weights: dict[str, torch.Tensor]) -> bool:
    start = load_model(model_dir, device="cpu")[0].state_dict()
    return any(not torch.equal(weights[k], start[k]) for k in weights)


def test_micro_batches_accumulate_to_the_whole_batch_gradient(bpe_model_dir):
    prompts = [f"{a}+{b}=" for a, b in zip(range(10, 18), range(30, 38))]
    responses = [f"The answer is {a + b}." if a % 2 else str(a + b) for a, b in zip(range(10, 18), range(30, 38))]

    def sft(ctx, model):
        SFTTrainer(ctx).train(model, prompts, responses)

    # with checkpointing (recomputed activations): the same gradients
    weights = [_trained(bpe_model_dir, micro, sft, ckpt) for micro, ckpt in ((None, False), (3, False), (3, True))]
    for k in weights[0]:
        assert torch.allclose(weights[0][k], weights[1][k], atol=1e-5), k
        assert torch.allclose(weights[1][k], weights[2][k], atol=1e-5), k
    assert _moved(bpe_model_dir, weights[0])


def test_length_grouped_micro_batches_keep_the_dpo_gradient(bpe_model_dir, monkeypatch):
    """DPO pairs of unlike lengths, micro-batches of 3: filled by length (shortest first) they train
    the weights that micro-batches in the drawn order train, and both those of the whole batch at
    once (to float rounding, which Adam's two steps at lr 1e-2 raise to ~1e-5)."""
    prompts = [f"{a}+{b}=" for a, b in zip(range(10, 18), range(30, 38))]
    chosen = [str(a + b) if a % 3 else f"Adding {a} and {b} gives {a + b}, so the answer is {a + b}."
              for a, b in zip(range(10, 18), range(30, 38))]
    rejected = [f"The answer is {a + b + 1}." if a % 2 else str(a - b) for a, b in zip(range(10, 18), range(30, 38))]

    def dpo(ctx, model):
        PreferenceTrainer(ctx, "dpo", DpoConfig()).train(model, prompts, chosen, rejected)

    by_length = loop._micro
    whole, grouped = _trained(bpe_model_dir, None, dpo), _trained(bpe_model_dir, 3, dpo)
    monkeypatch.setattr(loop, "_micro", lambda idx, size, length_fn=None: by_length(idx, size))
    drawn = _trained(bpe_model_dir, 3, dpo)
    for k in whole:
        assert torch.allclose(grouped[k], drawn[k], atol=1e-5), k
        assert torch.allclose(whole[k], grouped[k], atol=5e-5), k
    assert _moved(bpe_model_dir, whole)


def test_micro_batches_by_length():
    lengths = {0: 50, 1: 10, 2: 40, 3: 10, 4: 30}
    assert _micro([0, 1, 2, 3, 4], 2, lengths.__getitem__) == [[1, 3], [4, 2], [0]]
    assert _micro([0, 1, 2, 3, 4], 2) == [[0, 1], [2, 3], [4]]  # no lengths: the batch's order
    assert _micro([4, 0], 2, lengths.__getitem__) == [[4, 0]]  # one micro-batch: left as drawn


def _digest(directory: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(directory.rglob("*")):
        if f.is_file():
            h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def pretrained_loop(bpe_model_dir, tmp_path_factory):
    """The whole loop in-process with the BPE chat model as model.base (LoRA, DPO on self-certainty)."""
    from .conftest import TINY

    work = tmp_path_factory.mktemp("pretrained-loop")
    raw = deep_merge(TINY, {"model": {"base": str(bpe_model_dir), "max_length": 64},
                            "judge": {"method": "self_certainty"},
                            "sample": {"max_new_tokens": 6, "k": 2},
                            "evaluate": {"max_new_tokens": 6},
                            "train": {"algorithm": "dpo", "batch_size": 8, "micro_batch_size": 3,
                                      "lora": {"r": 4, "alpha": 8}}})
    params = work / "params.yaml"
    params.write_text(yaml.safe_dump(raw))
    before = _digest(bpe_model_dir)
    mp = pytest.MonkeyPatch()
    try:
        run_all(work, params, mp)
    finally:
        mp.undo()
    return work, params, before


def test_pretrained_base_runs_every_stage_with_adapters_not_copies(pretrained_loop, bpe_model_dir):
    work, _, before = pretrained_loop
    assert _digest(bpe_model_dir) == before  # LoRA never writes the base
    it0 = work / "data/it0/model"
    record = json.loads((it0 / "base.json").read_text())
    assert record["kind"] == "local" and record["path"] == str(bpe_model_dir)
    assert not list(it0.glob("*.safetensors"))  # a record, not a copy of the weights
    chain = json.loads((work / "data/it3/model/chain.json").read_text())
    assert chain["adapters"] == ["it1", "it2", "it3"] and chain["base"] == "base:" + record["sha256"]
    adapter = json.loads((work / "data/it3/model/adapters/it3/adapter_config.json").read_text())
    # no machine path, and no order that changes with Python's hash seed (peft keeps a set)
    assert adapter["base_model_name_or_path"] is None
    assert adapter["target_modules"] == sorted(adapter["target_modules"])
    for it in ("it1", "it2", "it3"):
        m = art.read_json(work / "reports" / "iterations" / it / "metrics.json")
        assert m["num_pairs"] > 0 and m["train_steps"] > 0
        judged = art.read_table(work / "data" / it / "judgments.parquet", art.JUDGMENTS)
        assert m["truncated_share"] == pytest.approx(judged["truncated"].mean())
        assert "eval_truncated_share" in m
        assert not list((work / "data" / it / "model").glob("*.safetensors"))
    samples = art.read_table(work / "data/it1/samples.parquet", art.SAMPLES)
    assert samples["truncated"].dtype == bool and samples["truncated"].any()
    # each iteration's adapter changed the model
    m2, tok = load_model(work / "data/it2/model", device="cpu", base=it0)
    m3, _ = load_model(work / "data/it3/model", device="cpu", base=it0)
    ids = torch.tensor([chat_format(m2, tok).prompt_ids("12+34=")])
    with torch.no_grad():
        assert not torch.allclose(m2(input_ids=ids).logits, m3(input_ids=ids).logits)


def test_adapter_chain_equals_the_merged_export(pretrained_loop, tmp_path, monkeypatch):
    work, params, _ = pretrained_loop
    shutil.copy(ROOT / "dvc.yaml", work / "dvc.yaml")  # --iteration reads the paths from it
    monkeypatch.chdir(work)
    export.main(["--iteration", "it2", "--out", str(tmp_path / "it2"), "--params", str(params)])
    from transformers import AutoModelForCausalLM, AutoTokenizer

    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "it2")  # no pipeline code involved
    plain_tok = AutoTokenizer.from_pretrained(tmp_path / "it2")
    chained, tok = load_model(work / "data/it2/model", device="cpu", base=work / "data/it0/model")
    assert plain_tok.chat_template == tok.chat_template
    assert plain.generation_config.eos_token_id == chained.generation_config.eos_token_id
    ids = torch.tensor([chat_format(chained, tok).prompt_ids("12+34=") + [5, 6, 7]])
    with torch.no_grad():
        assert torch.allclose(plain(input_ids=ids).logits, chained(input_ids=ids).logits, atol=1e-5)
    size = sum(f.stat().st_size for f in (work / "data/it2/model").rglob("*") if f.is_file())
    assert size < sum(f.stat().st_size for f in (tmp_path / "it2").glob("*.safetensors"))


def test_export_recommended_takes_the_iteration_the_report_recommends(pretrained_loop, tmp_path, monkeypatch, capsys):
    from self_improve.choice import recommend
    from self_improve.iterations import history, load_iterations

    work, params, _ = pretrained_loop
    shutil.copy(ROOT / "dvc.yaml", work / "dvc.yaml")
    monkeypatch.chdir(work)
    from self_improve.config import load_params

    rec = recommend(history(load_iterations(work / "reports/iterations", load_params(params))[0]))
    assert f"**Recommended: {rec['iteration']}**" in (work / "reports/summary.md").read_text()
    export.main(["--iteration", "recommended", "--out", str(tmp_path / "rec"), "--params", str(params)])
    assert f"recommended without labels: {rec['iteration']}" in capsys.readouterr().out
    prov = json.loads((tmp_path / "rec" / "provenance.json").read_text())
    assert prov["iteration"] == rec["iteration"]


def test_lora_leaves_base_weights_and_trains_the_adapter(bpe_model_dir):
    model, tok = load_model(bpe_model_dir, device="cpu")
    base = {k: v.clone() for k, v in model.state_dict().items()}
    peft = attach_lora(model, LoraConfig(r=4, alpha=8))
    lora = {k: v.clone() for k, v in peft.named_parameters() if "lora_" in k}
    SFTTrainer(RunContext(tok, Schedule(1e-2, 3), 4, chat=chat_format(model, tok))).train(peft, ["1+2="] * 4, ["3"] * 4)
    assert all(not torch.equal(v, lora[k]) for k, v in peft.named_parameters() if "lora_B" in k)
    for k, v in peft.get_base_model().state_dict().items():
        if "lora_" not in k:
            assert torch.equal(v, base[k.replace("base_layer.", "")]), k


# --- bad model.base values: one line, exit 2, nothing written ----------------------------------------

def _refused(tmp_path, raw, capsys) -> str:
    tmp_path.mkdir(parents=True)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    out.mkdir()
    argv = stage_argv("prepare")
    argv = [a if not a.startswith("data/") else str(out / a) for a in argv]
    with pytest.raises(SystemExit) as exit_:
        prepare.main(argv + ["--params", str(params)])
    assert exit_.value.code == 2
    assert list(out.rglob("*")) == []
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    return err


def test_bad_model_base_is_refused_before_any_work(tmp_path, tiny_raw, bpe_model_dir, capsys, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    missing = tmp_path / "no-such-model"
    err = _refused(tmp_path / "a", {**tiny_raw, "model": {"base": str(missing)}}, capsys)
    assert err == f"prepare: error: model.base: {missing}: no such directory or file (and not a hub id of the form org/name)"
    empty = tmp_path / "no-weights"
    shutil.copytree(bpe_model_dir, empty)
    (empty / "model.safetensors").unlink()
    err = _refused(tmp_path / "b", {**tiny_raw, "model": {"base": str(empty)}}, capsys)
    assert err == f"prepare: error: model.base: {empty}: no weights (*.safetensors) in the directory"
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"PK\x03\x04 not a gguf")
    err = _refused(tmp_path / "c", {**tiny_raw, "model": {"base": str(fake)}}, capsys)
    assert err == f"prepare: error: model.base: {fake}: not a GGUF file (it does not start with 'GGUF')"
    err = _refused(tmp_path / "d", {**tiny_raw, "model": {"base": "no-such-org/no-such-model"}}, capsys)
    assert err.startswith("prepare: error: model.base: no-such-org/no-such-model: not a local directory, "
                          "and fetching it from the Hugging Face hub failed (")
    no_eos = tmp_path / "no-eos"
    shutil.copytree(bpe_model_dir, no_eos)
    cfg = json.loads((no_eos / "tokenizer_config.json").read_text())
    cfg.pop("eos_token", None)
    cfg.pop("pad_token", None)
    (no_eos / "tokenizer_config.json").write_text(json.dumps(cfg))
    err = _refused(tmp_path / "e", {**tiny_raw, "model": {"base": str(no_eos)}}, capsys)
    assert err.startswith(f"prepare: error: model.base: {no_eos}: its tokenizer has no eos token")
    err = _refused(tmp_path / "f", {**tiny_raw, "model": {"base": "builtin", "gguf_file": "x.gguf"}}, capsys)
    assert "model.gguf_file and model.revision need a pretrained model.base" in err


def test_adapters_merge_as_peft_merges_them(bpe_model_dir, tmp_path):
    """self_improve/models/loading.py merges plain LoRA adapters itself (peft's import costs seconds per
    stage): the result equals peft's own adapted model, for two adapters applied in turn."""
    from peft import PeftModel

    from self_improve.models.loading import apply_adapters

    model, tok = load_model(bpe_model_dir, device="cpu")
    ids = torch.tensor([chat_format(model, tok).prompt_ids("12+34=") + [5, 6, 7]])
    dirs = []
    for i in range(2):
        peft = attach_lora(load_model(bpe_model_dir, device="cpu")[0], LoraConfig(r=4, alpha=8 + 4 * i))
        with torch.no_grad():
            for name, p in peft.named_parameters():
                if "lora_" in name:
                    p.copy_(torch.randn_like(p) * 0.05)  # B is zero at init: give it a delta
        peft.save_pretrained(tmp_path / f"a{i}")
        dirs.append(tmp_path / f"a{i}")
    ours = apply_adapters(load_model(bpe_model_dir, device="cpu")[0], dirs)
    theirs = load_model(bpe_model_dir, device="cpu")[0]
    for d in dirs:
        theirs = PeftModel.from_pretrained(theirs, d)  # adapted, not merged
        with torch.no_grad():
            stepwise = theirs(input_ids=ids).logits
        theirs = theirs.merge_and_unload()
    with torch.no_grad():
        assert torch.allclose(ours(input_ids=ids).logits, stepwise, atol=1e-5)
        assert not torch.allclose(ours(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-3)
