"""Load and save Hugging Face models and tokenizers; the tiny default; LoRA adapters per iteration.

A model directory of the pipeline holds one of three things: full safetensors weights (the tiny
default, full fine-tuning, an export), a base record (a pretrained it0, see self_improve/models/base.py), or
an adapter chain: with LoRA, iteration N writes its own adapter beside copies of it1..it(N-1)'s
and `chain.json`, and loading it applies them to the base in order, merging each. A merged,
standalone copy is written only on export (self_improve/models/export.py).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import string
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerBase,
)

from self_improve.artifacts import ArtifactError, atomic_path
from self_improve.cpu import usable_cpus
from self_improve.config import DType, LoraConfig, ModelConfig, ModelShape, SecurityConfig
from self_improve.errors import ConfigError
from self_improve.models.base import (
    BASE_FILE,
    base_location,
    check_model_dir,
    check_unchanged,
    content_hash,
    read_record,
)

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


def resolve_dtype(dtype: DType, device: str | torch.device) -> torch.dtype:
    """`auto`: bfloat16 on a GPU that supports it, float32 elsewhere (CPU)."""
    if dtype == DType.auto:
        on_gpu = torch.device(device).type == "cuda"
        return torch.bfloat16 if on_gpu and torch.cuda.is_bf16_supported() else torch.float32
    return getattr(torch, dtype.value)


def _load_hf(path: Path, gguf_file: str | None, security: SecurityConfig, dtype: torch.dtype, label: str):
    safetensors_only = not security.allow_pickle_weights and not gguf_file
    extra = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            path, local_files_only=True, trust_remote_code=security.trust_remote_code, **extra
        )
        model = AutoModelForCausalLM.from_pretrained(
            path, local_files_only=True, trust_remote_code=security.trust_remote_code,
            use_safetensors=True if safetensors_only else None, dtype=dtype, **extra,
        )
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, SafetensorError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ArtifactError(f"{label}: cannot load as a causal language model ({first})") from None
    if gguf_file and getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config  # dequantised on load; a later save must not claim GGUF
    return model, tokenizer


def check_tokenizer(tokenizer: PreTrainedTokenizerBase, label: str) -> None:
    """A usable tokenizer has an eos token (generation must stop); pad falls back to eos."""
    if tokenizer.eos_token_id is None:
        raise ConfigError(f"{label}: its tokenizer has no eos token, so generation could not stop; "
                          "set eos_token in its tokenizer_config.json")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token


def load_model(
    path: str | Path, device: str | None = None, security: SecurityConfig = SecurityConfig(),
    base: str | Path | None = None, model_cfg: ModelConfig = ModelConfig(),
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """A causal LM and its tokenizer from a model directory written by this pipeline (or any HF dir).

    A directory holds full weights (the tiny model, full fine-tuning, an export), a base record
    (`base.json`: a pretrained it0, loaded from where it lives), or an adapter chain (`chain.json`:
    the base `base` plus the LoRA adapters of it1..itN, merged in order at load time).
    """
    path = Path(path)
    device = device or default_device()
    dtype = resolve_dtype(model_cfg.dtype, device)
    if (path / CHAIN_FILE).is_file():
        if base is None:
            raise ArtifactError(f"{path}: an adapter chain needs its base model directory (--base)")
        model, tokenizer = load_model(base, device, security, model_cfg=model_cfg)
        chain = read_chain(path)
        if chain["base"] != model_identity(base):
            raise ArtifactError(f"{path}: its adapters were trained on another base than {base}")
        model = apply_adapters(model, [path / ADAPTERS / name for name in chain["adapters"]])
    elif (path / BASE_FILE).is_file():
        record = read_record(path)
        where = base_location(record)
        check_unchanged(record, where)
        label = f"model.base {record['base']}"
        model, tokenizer = _load_hf(where, record.get("gguf_file"), security, dtype, label)
        check_tokenizer(tokenizer, label)
    else:
        path = check_model_dir(path, security)
        model, tokenizer = _load_hf(path, None, security, dtype, str(path))
        check_tokenizer(tokenizer, str(path))
    model.to(device)
    model.eval()
    return model, tokenizer


def save_model(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, path: str | Path, prov: dict,
               state_dict: dict | None = None) -> None:
    """Save weights (safetensors), tokenizer and provenance atomically into `path`; `state_dict`:
    the weights to write instead of the model's own (gathered from FSDP shards)."""
    with atomic_path(path, is_dir=True) as tmp:
        model.save_pretrained(tmp, safe_serialization=True, state_dict=state_dict)
        tokenizer.save_pretrained(tmp)
        (tmp / "provenance.json").write_text(json.dumps(prov, indent=2, sort_keys=True) + "\n")


def write_base_record(record: dict, path: str | Path, prov: dict) -> None:
    """it0 of a pretrained base: what it is and where it lives, a few hundred bytes."""
    with atomic_path(path, is_dir=True) as tmp:
        (tmp / BASE_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        (tmp / "provenance.json").write_text(json.dumps(prov, indent=2, sort_keys=True) + "\n")


# --- adapter chains -----------------------------------------------------------------------------

CHAIN_FILE = "chain.json"
ADAPTERS = "adapters"


def read_chain(path: Path) -> dict:
    try:
        chain = json.loads((path / CHAIN_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ArtifactError(f"{path / CHAIN_FILE}: unreadable adapter chain ({err})") from None
    if not isinstance(chain, dict) or not isinstance(chain.get("adapters"), list) or "base" not in chain:
        raise ArtifactError(f"{path / CHAIN_FILE}: not an adapter chain (needs base and adapters)")
    return chain


def model_identity(path: str | Path) -> str:
    """What identifies a model directory's weights without re-reading a pretrained base:
    a base record's content hash (taken once by prepare), else a hash of the directory's files
    (a chain's adapters and chain.json, or the full weights of a tiny or fully fine-tuned model)."""
    path = Path(path)
    if (path / BASE_FILE).is_file():
        return "base:" + read_record(path)["sha256"]
    files = [f for f in sorted(path.rglob("*")) if f.is_file() and f.name != "provenance.json"]
    return "files:" + content_hash(path, files)


def _merge_lora(model: torch.nn.Module, adapter_dir: Path) -> None:
    """W += (B @ A) * alpha / r for every LoRA pair of the adapter, in place (peft's merge, without
    importing peft: that import costs seconds in every stage process)."""
    from safetensors.torch import load_file

    cfg = json.loads((adapter_dir / "adapter_config.json").read_text(encoding="utf-8"))
    weights = load_file(adapter_dir / "adapter_model.safetensors")
    scaling = cfg["lora_alpha"] / (math.sqrt(cfg["r"]) if cfg.get("use_rslora") else cfg["r"])
    modules = dict(model.named_modules())
    with torch.no_grad():
        for key, a in weights.items():
            if not key.endswith(".lora_A.weight"):
                continue
            prefix = key[: -len(".lora_A.weight")]
            name = prefix.removeprefix("base_model.model.")
            module, b = modules.get(name), weights.get(prefix + ".lora_B.weight")
            if not isinstance(module, torch.nn.Linear) or b is None:
                raise ArtifactError(f"{adapter_dir}: adapter weight {key} matches no linear layer of the model")
            delta = (b.to(module.weight.device, torch.float32) @ a.to(module.weight.device, torch.float32)) * scaling
            module.weight += delta.to(module.weight.dtype)


def _plain_lora(cfg: dict) -> bool:
    """An adapter this module merges itself: LoRA on linear layers, nothing else trained."""
    return (cfg.get("peft_type") == "LORA" and not cfg.get("use_dora") and not cfg.get("modules_to_save")
            and not cfg.get("fan_in_fan_out") and not cfg.get("rank_pattern") and not cfg.get("alpha_pattern"))


def apply_adapters(model: torch.nn.Module, adapter_dirs: list[Path]) -> torch.nn.Module:
    """The model with each LoRA adapter loaded and merged in order (itN = base + it1 + ... + itN)."""
    for d in adapter_dirs:
        if not (d / "adapter_config.json").is_file():
            raise ArtifactError(f"{d}: no adapter_config.json, not a LoRA adapter")
        try:
            cfg = json.loads((d / "adapter_config.json").read_text(encoding="utf-8"))
            if _plain_lora(cfg):
                _merge_lora(model, d)
                continue
            from peft import PeftModel  # anything else: peft itself

            model = PeftModel.from_pretrained(model, d, is_trainable=False).merge_and_unload()
        except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as err:
            raise ArtifactError(f"{d}: cannot apply the adapter ({str(err).strip().splitlines()[0]})") from None
    return model


def save_adapter_chain(peft_model, start: str | Path, base: str | Path, name: str, path: str | Path,
                       prov: dict, state_dict: dict | None = None) -> None:
    """itN with LoRA: the adapters of the starting model (if it is a chain), this one's, chain.json.
    `state_dict`: the whole model's weights to take the adapter from (gathered from FSDP shards).

    The directory is self-contained apart from the base (--base): a few MB, not a copy of the model.
    """
    start, path = Path(start), Path(path)
    previous = read_chain(start)["adapters"] if (start / CHAIN_FILE).is_file() else []
    if not previous and Path(start).resolve() != Path(base).resolve():
        raise ArtifactError(f"{start}: LoRA training on a full model that is not the base {base}; "
                            "train every iteration with the same train.lora.enabled")
    with atomic_path(path, is_dir=True) as tmp:
        for old in previous:
            shutil.copytree(start / ADAPTERS / old, tmp / ADAPTERS / old)
        peft_model.save_pretrained(tmp / ADAPTERS / name, safe_serialization=True, state_dict=state_dict)
        config = tmp / ADAPTERS / name / "adapter_config.json"
        fields = json.loads(config.read_text(encoding="utf-8"))
        fields["base_model_name_or_path"] = None  # a machine's path; chain.json identifies the base
        if isinstance(fields.get("target_modules"), list):  # peft stores a set: hash-seed order
            fields["target_modules"] = sorted(fields["target_modules"])
        config.write_text(json.dumps(fields, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        (tmp / ADAPTERS / name / "README.md").unlink(missing_ok=True)  # peft's empty model card
        chain = {"base": model_identity(base), "adapters": [*previous, name]}
        (tmp / CHAIN_FILE).write_text(json.dumps(chain, indent=2) + "\n", encoding="utf-8")
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


def set_threads() -> None:
    """Use every CPU this process may run on for intra-op parallelism unless the user said otherwise."""
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(usable_cpus())


def export_merged(model_dir: str | Path, base: str | Path | None, out: str | Path,
                  security: SecurityConfig = SecurityConfig(), model_cfg: ModelConfig = ModelConfig(),
                  prov: dict | None = None) -> None:
    """A standalone HF directory (safetensors, tokenizer, generation config) of any pipeline model."""
    model, tokenizer = load_model(model_dir, device="cpu", security=security, base=base, model_cfg=model_cfg)
    save_model(model, tokenizer, out, prov or {"exported_from": str(model_dir), "base": str(base)})


def merged_copy(model_dir: str | Path, base: str | Path | None, security: SecurityConfig = SecurityConfig(),
                model_cfg: ModelConfig = ModelConfig(), always: bool = False
                ) -> tuple[Path, tempfile.TemporaryDirectory | None]:
    """A plain HF directory of a pipeline model, for an engine that loads one (vLLM, `vllm serve`):
    `model_dir` itself when it is one (unless `always`), else its adapters merged onto `base` in a
    temporary directory, returned with it (the copy lives as long as the caller keeps it)."""
    model_dir = Path(model_dir)
    if not always and not (model_dir / CHAIN_FILE).is_file() and not (model_dir / BASE_FILE).is_file():
        return model_dir, None
    tmp = tempfile.TemporaryDirectory(prefix="self-improve-merged-")
    merged = Path(tmp.name) / "model"
    export_merged(model_dir, base, merged, security, model_cfg)
    return merged, tmp


@torch.no_grad()
def interpolate_weights(anchor: torch.nn.Module, other: torch.nn.Module, mix: float) -> torch.nn.Module:
    """`anchor` with every floating-point weight set to (1 - mix) x its own + mix x `other`'s (the same
    architecture): a judge between a frozen model and the policy (WiSE-FT's weight interpolation)."""
    if not 0 <= mix <= 1:
        raise ValueError(f"interpolate_weights: mix must lie in [0, 1], not {mix}")
    theirs = other.state_dict()
    done: set[int] = set()  # tied weights (embeddings and lm_head) appear under two names: mix once
    for name, w in anchor.state_dict().items():
        if name not in theirs or theirs[name].shape != w.shape:
            raise ArtifactError(f"interpolate_weights: {name} differs between the two models")
        if w.is_floating_point() and mix > 0 and w.data_ptr() not in done:
            done.add(w.data_ptr())
            w.mul_(1 - mix).add_(theirs[name].to(w.dtype), alpha=mix)
    return anchor
