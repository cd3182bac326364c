"""Load and save Hugging Face models and tokenizers; the tiny default; LoRA attach and merge.

Models live on disk in standard HF format with safetensors weights, so the same code (and vLLM)
loads the tiny default and a real local model directory alike. Nothing is fetched from a hub.
"""

from __future__ import annotations

import json
import os
import string
from pathlib import Path

import torch
from safetensors import SafetensorError
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from .artifacts import ArtifactError, atomic_path
from .config import LoraConfig, ModelShape, SecurityConfig

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
# Printable ASCII plus newline and tab: enough for arithmetic and for plain-text prompts.
CHARS = [c for c in string.printable if c not in "\r\x0b\x0c"]


def build_char_tokenizer() -> PreTrainedTokenizerBase:
    """A character-level tokenizer: one token per character, <bos> prepended."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for c in CHARS:
        vocab[c] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )


def build_tiny_model(shape: ModelShape, tokenizer: PreTrainedTokenizerBase, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_heads,
        max_position_embeddings=2048,  # RoPE: no weights; room for judge prompts
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def check_model_dir(path: str | Path, security: SecurityConfig = SecurityConfig()) -> Path:
    """Refuse a directory that is not a loadable HF model under `security`, naming what is wrong."""
    path = Path(path)
    if not path.is_dir():
        raise ArtifactError(f"{path}: model directory not found")
    if not (path / "config.json").is_file():
        raise ArtifactError(f"{path}: no config.json, not a Hugging Face model directory")
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ArtifactError(f"{path}/config.json: not valid JSON ({err})") from None
    if not isinstance(config, dict):
        raise ArtifactError(f"{path}/config.json: expected a JSON object")
    if "auto_map" in config and not security.trust_remote_code:
        raise ArtifactError(f"{path}: the model ships its own code (auto_map in config.json); "
                            "set security.trust_remote_code: true only if you trust it")
    if not any(path.glob("*.safetensors")):
        pickles = any(path.glob("*.bin")) or any(path.glob("*.pt"))
        if not pickles:
            raise ArtifactError(f"{path}: no *.safetensors weights")
        if not security.allow_pickle_weights:
            raise ArtifactError(f"{path}: only pickle weights found (*.bin); convert them to safetensors, "
                                "or set security.allow_pickle_weights: true if you trust them")
    return path


def load_model(
    path: str | Path, device: str | None = None, security: SecurityConfig = SecurityConfig()
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """A causal LM and its tokenizer from a local directory; never from a hub."""
    path = check_model_dir(path, security)
    safetensors_only = not security.allow_pickle_weights
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            path, local_files_only=True, trust_remote_code=security.trust_remote_code
        )
        model = AutoModelForCausalLM.from_pretrained(
            path, local_files_only=True, trust_remote_code=security.trust_remote_code,
            use_safetensors=True if safetensors_only else None, dtype=torch.float32,
        )
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, SafetensorError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ArtifactError(f"{path}: cannot load as a causal language model ({first})") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.to(device or default_device())
    model.eval()
    return model, tokenizer


def save_model(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, path: str | Path, prov: dict) -> None:
    """Save weights (safetensors), tokenizer and provenance atomically into `path`."""
    with atomic_path(path, is_dir=True) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "provenance.json").write_text(json.dumps(prov, indent=2, sort_keys=True) + "\n")


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def attach_lora(model: torch.nn.Module, cfg: LoraConfig) -> torch.nn.Module:
    """Wrap `model` with a fresh LoRA adapter on every linear projection of the blocks."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    targets = sorted(
        {name.rsplit(".", 1)[-1] for name, mod in model.named_modules() if isinstance(mod, torch.nn.Linear)}
        - {"lm_head"}
    )
    peft_cfg = PeftLoraConfig(
        r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=targets, task_type="CAUSAL_LM"
    )
    return get_peft_model(model, peft_cfg)


def merge_lora(model: torch.nn.Module) -> torch.nn.Module:
    """Fold the adapter into the base weights so the next iteration starts from a plain model."""
    return model.merge_and_unload() if hasattr(model, "merge_and_unload") else model


def set_threads() -> None:
    """Use every core for intra-op parallelism unless the user said otherwise."""
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, os.cpu_count() or 1))
