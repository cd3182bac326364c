"""The tiny model, batched generation and LoRA on real weights."""

import pytest
import torch

from self_improve.artifacts import ArtifactError
from self_improve.config import LoraConfig
from self_improve.engines.hf import SamplingSpec, encode_for_training, generate, token_logprobs
from self_improve.models.loading import attach_lora, check_model_dir, load_model, save_model
from self_improve.training.loop import Schedule
from self_improve.training.trainers import RunContext, SFTTrainer


def test_char_tokenizer_roundtrip(tok):
    text = "12+34=\nHello, world! {x}"
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id and len(ids) == len(text) + 1
    assert tok.decode(ids, skip_special_tokens=True) == text


def test_batched_greedy_equals_one_at_a_time(tok, trained):
    prompts = ["1+2=", "23+45=", "99+9=", "10+10=", "7+88=", "31+17="]
    spec = SamplingSpec(n=1, greedy=True, max_new_tokens=5, batch_size=64)
    batched = generate(trained, tok, prompts, spec, seed=0, progress=False)
    single = [generate(trained, tok, [p], spec, seed=0, progress=False)[0] for p in prompts]
    assert batched == single
    assert len({b[0] for b in batched}) > 1


def test_sampling_is_seeded(tok, trained):
    spec = SamplingSpec(n=4, temperature=1.0, max_new_tokens=4)
    a = generate(trained, tok, ["12+34=", "56+7="], spec, seed=1, progress=False)
    assert a == generate(trained, tok, ["12+34=", "56+7="], spec, seed=1, progress=False)
    assert a != generate(trained, tok, ["12+34=", "56+7="], spec, seed=2, progress=False)


def test_loss_mask_covers_response_and_eos_only(tok):
    enc = encode_for_training(tok, ["1+2=", "10+20="], ["3", "30"])
    assert enc["loss_mask"][0].tolist()[:7] == [0, 0, 0, 0, 0, 1, 1]
    assert enc["input_ids"][0, 6].item() == tok.eos_token_id
    assert enc["attention_mask"][0].tolist() == [1] * 7 + [0] * 3


def test_lora_trains_adapter_only_and_merge_is_exact(tok, trained, tmp_path):
    save_model(trained, tok, tmp_path / "base", {"test": True})
    base, _ = load_model(tmp_path / "base", device="cpu")
    before = {k: v.clone() for k, v in base.state_dict().items()}
    model = attach_lora(base, LoraConfig(r=4, alpha=8))
    lora_before = {k: v.clone() for k, v in model.named_parameters() if "lora_" in k}
    prompts = ["12+34=", "40+41="] * 8
    SFTTrainer(RunContext(tok, Schedule(1e-2, 5), 8)).train(model, prompts, ["99", "11"] * 8)
    for name, p in model.named_parameters():
        if "lora_" in name:
            assert not torch.equal(p, lora_before[name]), name
    for k, v in model.get_base_model().state_dict().items():
        if "lora_" not in k and "base_layer" not in k:
            assert torch.equal(v, before[k]), k
    batch = encode_for_training(tok, prompts[:2], ["99", "11"])
    with torch.no_grad():
        adapted = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        merged = model.merge_and_unload()  # the adapter folded into the base weights
        plain = merged(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert torch.allclose(adapted, plain, atol=1e-5)
    assert not any("lora_" in k for k in merged.state_dict())
    assert token_logprobs(merged, batch)[0].shape == (2, 3)  # response-aligned: the longest response + <eos>


def test_model_dir_checks(tmp_path):
    with pytest.raises(ArtifactError, match="not found"):
        check_model_dir(tmp_path / "missing")
    (tmp_path / "m").mkdir()
    with pytest.raises(ArtifactError, match="config.json"):
        check_model_dir(tmp_path / "m")
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "m" / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(ArtifactError, match="pickle"):
        check_model_dir(tmp_path / "m")
