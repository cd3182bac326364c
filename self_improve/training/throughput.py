"""How near the machine's limit training runs: training tokens/s against the machine's own matmul rate.

A transformer's forward pass costs about 2 N FLOPs per token (N: the weights a token passes through);
its backward pass about 4 N when every weight is trained and about 2 N with LoRA, where the frozen
weights need no gradient of their own, only the activations' (the adapters' share is negligible). So a
training token costs 6 N (full) or 4 N (LoRA) FLOPs. The rate a step could reach is the GEMM rate of
the machine in the training dtype, measured here on square matrices; the share is achieved over that.
Tokens are the training rows' tokens times epochs; the reference model's forward passes (DPO's log-probs,
once per iteration) are left out, so the share is a lower bound.
"""

from __future__ import annotations

import time

import torch


def gemm_rate(dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", size: int = 1024,
              reps: int = 8) -> float:
    """FLOP/s of a `size`-square matmul in `dtype` on `device` (one warm-up, then `reps` timed)."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=gen).to(device=device, dtype=dtype)
    b = torch.randn(size, size, generator=gen).to(device=device, dtype=dtype)
    a @ b
    _sync(device)
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    _sync(device)
    return 2 * size**3 * reps / (time.perf_counter() - start)


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def flops_per_token(model: torch.nn.Module, lora: bool) -> float:
    """Training FLOPs per token: 4 N with LoRA, 6 N otherwise (N: the weights outside the embedding)."""
    n = sum(p.numel() for name, p in model.named_parameters() if "embed" not in name and "lora_" not in name)
    return (4 if lora else 6) * n


def row_tokens(chat, prompts: list, responses: list[str]) -> int:
    """Tokens of the training rows prompt + response + end of turn."""
    from self_improve.engines.hf import encode_rows

    return sum(len(r.ids) for r in encode_rows(chat, prompts, responses))


def throughput(tokens: int, seconds: float, flops_token: float, rate: float) -> dict[str, float]:
    """train_tokens_per_s, the FLOP/s they stand for and their share of the GEMM rate."""
    per_s = tokens / seconds if seconds > 0 else 0.0
    return {"train_tokens_per_s": per_s, "train_flops_per_s": per_s * flops_token,
            "train_gemm_flops_per_s": rate, "train_matmul_share": per_s * flops_token / rate if rate else 0.0}
