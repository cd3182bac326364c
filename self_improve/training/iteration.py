"""One iteration's training: the data and trainer its algorithm takes, and the fingerprint a resumed run must match.

`train.algorithm`: `raft` fine-tunes on the best-judged samples (RAFT / ReST / STaR); `dpo`,
`ipo`, `spin` and `cream` train on the pairs (the reference being the iteration's starting
model); `grpo` on the stored groups of samples with their advantages; `nft` on the same samples
with 1/0 labels (negative-aware fine-tuning: wrong samples trained through the implicit negative
policy, not dropped). With LoRA the iteration's
output is its adapter (beside the earlier iterations' adapters and `chain.json`): the next
iteration loads the base with every adapter merged in order and trains a fresh one on top. Full
fine-tuning writes full safetensors weights. Memory is bounded by `train.micro_batch_size`
(gradient accumulation up to `train.batch_size`), optionally with gradient checkpointing.

Resumable: every `train.checkpoint_every` steps the state goes to `--checkpoints` (a DVC
`persist` output), and a run killed part way continues from there when restarted on the same
inputs and params. Scale-out: `accelerate launch -m stages.train ...` runs it unchanged on
several processes (DDP, or FSDP2 with configs/accelerate/fsdp.yaml); only the main process writes.
`SELF_IMPROVE_ACCELERATE_CONFIG=configs/accelerate/fsdp.yaml` picks that launcher for dvc.yaml's
command as it is (self_improve/distributed.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path

import pandas as pd
import torch

from self_improve.config import Params, TrainConfig
from self_improve.cpu import PINS, allow_bf16_kernels, cpu_flags
from self_improve.distributed import is_fsdp
from self_improve.engines.hf import chat_format
from self_improve.models.loading import (
    attach_lora,
    model_identity,
)
from self_improve.training.loop import Checkpoints, Schedule, frozen_in, steps_for
from self_improve.training.throughput import flops_per_token, gemm_rate, row_tokens, throughput
from self_improve.training.trainers import GRPOTrainer, NFTTrainer, PreferenceTrainer, RunContext, SFTTrainer

log = logging.getLogger(__name__)


def nft_data(groups: pd.DataFrame, threshold: float) -> pd.DataFrame:
    """NFT's samples: each scored sample's label (1: reward >= threshold and neither truncated nor
    invalid; else 0) and `rate`, the mean label of its prompt's samples; prompts whose samples all
    share one label are dropped (they carry no signal, as in the official code's filter), except
    prompts judge.low_consensus penalise marked: all wrong, trained down (RESTRAIN)."""
    if groups.empty:
        return groups.assign(label=pd.Series(dtype=float), rate=pd.Series(dtype=float))
    right = (groups["reward"].astype(float) >= threshold) & ~groups["truncated"].fillna(False).astype(bool)
    right &= groups["valid"].fillna(True).astype(bool)
    penalised = (groups["penalised"].fillna(False).astype(bool) if "penalised" in groups
                 else pd.Series(False, index=groups.index))
    out = groups.assign(label=(right & ~penalised).astype(float))
    out["rate"] = out.groupby("prompt_id")["label"].transform("mean")
    return out[((out["rate"] > 0) & (out["rate"] < 1)) | penalised].reset_index(drop=True)


def training_size(cfg: TrainConfig, pairs: pd.DataFrame, sft: pd.DataFrame, groups: pd.DataFrame) -> int:
    family = cfg.entry.family
    if family == "sft":
        return len(sft)
    if family == "grpo":
        return len(groups)
    if family == "nft":
        return len(nft_data(groups, cfg.nft.threshold))
    return len(pairs)


def training_tokens(cfg: TrainConfig, chat, pairs: pd.DataFrame, sft: pd.DataFrame, groups: pd.DataFrame) -> int:
    """Tokens of one epoch's training rows (prompt + response + end of turn), as the trainer sees them."""
    family = cfg.entry.family
    if family == "sft":
        return row_tokens(chat, list(sft["prompt"]), list(sft["response"]))
    if family in ("grpo", "nft"):
        data = groups if family == "grpo" else nft_data(groups, cfg.nft.threshold)
        return row_tokens(chat, list(data["prompt"]), list(data["response"]))
    return sum(row_tokens(chat, list(pairs["prompt"]), list(pairs[side])) for side in ("chosen", "rejected"))


def bf16_on(setting: bool | str, device: torch.device) -> bool:
    """train.bf16 resolved: auto is on for a GPU that supports bfloat16 and a CPU with bfloat16
    instructions (AMX or avx512_bf16) whose oneDNN kernels this process can reach; float32 elsewhere."""
    if setting != "auto":
        return bool(setting)
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and bool({"amx_bf16", "avx512_bf16"} & cpu_flags()) and bf16_kernels_ready()


def bf16_kernels_ready() -> bool:
    """Whether torch's bfloat16 matmuls reach oneDNN's kernels in this process. oneDNN fixes its
    instruction set at the process's first matmul: if that ran under the AVX2 pin (a LoRA chain merged
    while loading, say), every later bfloat16 matmul falls to torch's reference GEMM, 8x slower here,
    and a whole loop's train stage once sat in it for over ten minutes (docs/speed.md)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def prepare_precision(setting: bool | str, device: torch.device) -> None:
    """Before the stage's first matmul: where train.bf16 may be on for a CPU, lift the AVX2 pin of oneDNN
    that this project set (self_improve/cpu.py), so bfloat16 runs on the CPU's own kernels."""
    if device.type == "cpu" and setting is not False and {"amx_bf16", "avx512_bf16"} & cpu_flags():
        if allow_bf16_kernels():
            log.info("train.bf16: oneDNN may use the CPU's bfloat16 kernels in this stage (the AVX2 pin lifted)")
            if torch.backends.cpu.get_cpu_capability() != "AVX512":
                # ATen's kernels stay at the pin's AVX2: its flash attention then sees oneDNN's AMX and
                # packs bfloat16 blocks with an AVX-512 routine that ATen's AVX2 build lacks ("pack_vnni2 is
                # only supported when avx512 is supported", from 128 tokens on). The math backend holds the
                # same attention for the stage's every pass, the recomputed ones of checkpointing included.
                torch.backends.cuda.enable_flash_sdp(False)  # the flag is torch's one for CPU and CUDA
                log.info("train.bf16: attention takes torch's math backend (flash attention needs ATen's "
                         "AVX-512 kernels under a lifted oneDNN pin)")


def _check_bf16(device: torch.device) -> None:
    """Warn where a bfloat16 run on the CPU will not reach the CPU's bfloat16 kernels."""
    if device.type != "cpu" or bf16_kernels_ready():
        return
    if not {"amx_bf16", "avx512_bf16"} & cpu_flags():
        log.warning("train.bf16 on a CPU without bfloat16 instructions (amx_bf16, avx512_bf16): emulated, "
                    "slower than float32")
    elif os.environ.get("ONEDNN_MAX_CPU_ISA") == PINS["ONEDNN_MAX_CPU_ISA"]:
        log.warning("train.bf16 under an AVX2 pin set outside: oneDNN emulates bfloat16, slower than float32")
    else:
        log.warning("train.bf16: oneDNN's bfloat16 kernels are out of reach in this process (a matmul ran "
                    "before prepare_precision): torch's reference GEMM, several times slower than float32")


def _raft(ctx: RunContext, cfg: TrainConfig, model, pairs, sft, groups):
    return SFTTrainer(ctx, desc="raft").train(model, list(sft["prompt"]), list(sft["response"]))


def _preference(ctx: RunContext, cfg: TrainConfig, model, pairs, sft, groups):
    cons = [0.5 if pd.isna(c) else float(c) for c in pairs["consistency"]]
    weights = None
    if pairs["weight"].notna().any():
        weights = [1.0 if pd.isna(w) else float(w) for w in pairs["weight"]]
    return PreferenceTrainer(ctx, cfg.algorithm, cfg.dpo).train(
        model, list(pairs["prompt"]), list(pairs["chosen"]), list(pairs["rejected"]), cons, weights)


def _grpo(ctx: RunContext, cfg: TrainConfig, model, pairs, sft, groups):
    return GRPOTrainer(ctx, cfg.grpo).train(model, list(groups["prompt"]), list(groups["response"]),
                                            [float(a) for a in groups["advantage"]])


def _nft(ctx: RunContext, cfg: TrainConfig, model, pairs, sft, groups):
    data = nft_data(groups, cfg.nft.threshold)
    return NFTTrainer(ctx, cfg.nft).train(model, list(data["prompt"]), list(data["response"]),
                                          list(data["label"]), list(data["rate"]))


# the trainer of each family of the algorithm table and the table it trains on (sft, pairs or groups)
TRAINERS = {"sft": _raft, "preference": _preference, "grpo": _grpo, "nft": _nft}


def train(model, tokenizer, pairs: pd.DataFrame, sft: pd.DataFrame, groups: pd.DataFrame, cfg: TrainConfig,
          seed: int, accelerator=None, checkpoints: Checkpoints | None = None, max_length: int | None = None):
    """Train `model`; returns the trained model (a peft model with LoRA), the log, the number of examples
    and, under FSDP, the gathered full state dict (None otherwise: the model's own weights are whole)."""
    chat = chat_format(model, tokenizer)  # before LoRA wraps it: the base's generation config
    device = next(model.parameters()).device
    prepare_precision(cfg.bf16, device)  # the stage calls it before loading; here for callers that did not
    bf16 = bf16_on(cfg.bf16, device)
    if bf16:
        _check_bf16(device)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if cfg.lora.enabled:
        torch.manual_seed(seed)  # the adapter's initial weights
        model = attach_lora(model, cfg.lora)
    n = training_size(cfg, pairs, sft, groups)
    steps = steps_for(n, cfg.batch_size, cfg.epochs)
    # the warm-up starts at lr 0 (transformers' schedule): it ends before the last step, so even a
    # one-step run trains
    sched = Schedule(cfg.lr, steps, warmup_steps=max(0, min(10, n, steps - 1)))
    ctx = RunContext(tokenizer, sched, cfg.batch_size, seed, cfg.micro, cfg.max_grad_norm, accelerator,
                     checkpoints, chat, max_length, torch.bfloat16 if bf16 else None)
    start = time.perf_counter()
    # the frozen base weights held in bfloat16 while training: FSDP shards one flat tensor per dtype, so not there
    with frozen_in(model, torch.bfloat16 if bf16 and cfg.lora.enabled and not is_fsdp(accelerator) else None):
        out = TRAINERS[cfg.entry.family](ctx, cfg, model, pairs, sft, groups)
    seconds = time.perf_counter() - start
    if n and not out.resumed_from:  # the share of the machine's matmul rate (training/throughput.py)
        tokens = training_tokens(cfg, chat, pairs, sft, groups) * cfg.epochs
        rate = gemm_rate(torch.bfloat16 if bf16 else next(model.parameters()).dtype, device)
        out.speed = throughput(tokens, seconds, flops_per_token(model, cfg.lora.enabled), rate)
        out.speed.update(train_seconds=seconds, train_bf16=float(bf16))
        log.info("train: %.0f tokens/s, %.1f%% of the machine's %s matmul rate (%.1f GFLOP/s)",
                 out.speed["train_tokens_per_s"], 100 * out.speed["train_matmul_share"],
                 "bfloat16" if bf16 else "float32", rate / 1e9)
    if n == 0:
        log.warning("no training data this iteration: the model is passed on unchanged")
    full_state = None
    if is_fsdp(accelerator):  # every process takes part in gathering the shards; the main one gets them
        full_state = accelerator.get_state_dict(model)
    if accelerator is not None:
        model = accelerator.unwrap_model(model)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_disable()
        model.config.use_cache = True
    return model, out, n, full_state


def fingerprint(params: Params, iteration: str, model_dir: str | Path, base: str | Path | None,
                *tables: pd.DataFrame) -> str:
    """What a checkpoint belongs to: the train and model params, the data and the starting model.

    The starting model is identified without re-reading a pretrained base's weights: by the base
    record's content hash (taken once by prepare) and the adapters' bytes (self_improve/models/loading.py).
    """
    h = hashlib.sha256()
    head = [params.seed, iteration, params.train.model_dump(mode="json"), params.model.model_dump(mode="json")]
    h.update(json.dumps(head, sort_keys=True).encode())
    for t in tables:
        h.update(pd.util.hash_pandas_object(t, index=False).to_numpy().tobytes())
    h.update(model_identity(model_dir).encode())
    if base is not None and Path(base).resolve() != Path(model_dir).resolve():
        h.update(model_identity(base).encode())
    return h.hexdigest()
