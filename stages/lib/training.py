"""Training loops for the base warm-up (SFT), RAFT (SFT on best samples) and DPO.

Seeded data order, warmup + cosine schedule, gradient clipping, and a guard that stops on a
non-finite loss before any model is written.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from .errors import TrainingError
from .generation import encode_for_training, token_logprobs
from .losses import dpo_loss, sft_loss


@dataclass(frozen=True)
class Schedule:
    lr: float
    steps: int
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0

    def factor(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        progress = (step - self.warmup_steps) / max(1, self.steps - self.warmup_steps)
        cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * cosine


@dataclass
class TrainLog:
    losses: list[float] = field(default_factory=list)
    extra: dict[str, list[float]] = field(default_factory=dict)

    def add(self, loss: float, **kw: float) -> None:
        self.losses.append(loss)
        for k, v in kw.items():
            self.extra.setdefault(k, []).append(v)

    def summary(self) -> dict[str, float]:
        if not self.losses:
            return {"train_steps": 0}
        tail = max(1, len(self.losses) // 10)
        out = {
            "train_steps": len(self.losses),
            "train_loss_first": self.losses[0],
            "train_loss": sum(self.losses[-tail:]) / tail,
        }
        for k, v in self.extra.items():
            out[k] = sum(v[-tail:]) / tail
        return out


def _batches(n: int, batch_size: int, steps: int, seed: int):
    """`steps` index batches over `n` items, reshuffled (seeded) each pass."""
    gen = torch.Generator().manual_seed(seed)
    perm: list[int] = []
    for _ in range(steps):
        if len(perm) < batch_size:
            perm += torch.randperm(n, generator=gen).tolist()
        yield perm[:batch_size]
        perm = perm[batch_size:]


def _optimizer(model: torch.nn.Module, schedule: Schedule):
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=schedule.lr, weight_decay=0.0, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule.factor)
    return params, opt, sched


def _update(loss: torch.Tensor, step: int, params, opt, sched, max_grad_norm: float) -> None:
    """One optimiser step; a non-finite loss stops training before anything is written."""
    if not torch.isfinite(loss):
        raise TrainingError(f"loss is {loss.item()} at step {step}; stopping without writing a model")
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    opt.step()
    sched.step()


def steps_for(n: int, batch_size: int, epochs: int) -> int:
    return max(1, math.ceil(n / batch_size)) * epochs if n else 0


def train_sft(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    responses: list[str],
    schedule: Schedule,
    batch_size: int,
    seed: int,
    max_grad_norm: float = 1.0,
    desc: str = "sft",
    stop_loss: float | None = None,
) -> TrainLog:
    """Fine-tune on (prompt, response) pairs with the token-mean NLL of the response.

    With `stop_loss`, training ends early once a moving average of the loss falls below it.
    """
    log = TrainLog()
    if not prompts or schedule.steps == 0:
        return log
    device = next(model.parameters()).device
    data = encode_for_training(tokenizer, prompts, responses)
    params, opt, sched = _optimizer(model, schedule)
    ema: float | None = None
    model.train()
    for step, idx in enumerate(tqdm(_batches(len(prompts), batch_size, schedule.steps, seed),
                                    total=schedule.steps, desc=desc, mininterval=1.0)):
        batch = {k: v[idx].to(device) for k, v in data.items()}
        logps, mask = token_logprobs(model, batch)
        loss = sft_loss(logps, mask)
        _update(loss, step, params, opt, sched, max_grad_norm)
        log.add(loss.item())
        ema = loss.item() if ema is None else 0.9 * ema + 0.1 * loss.item()
        if stop_loss is not None and ema < stop_loss:
            break
    model.eval()
    return log


def train_dpo(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    chosen: list[str],
    rejected: list[str],
    schedule: Schedule,
    batch_size: int,
    seed: int,
    beta: float,
    nll_weight: float,
    max_grad_norm: float = 1.0,
) -> TrainLog:
    """DPO on a LoRA-wrapped model; the reference is the same model with its adapter disabled."""
    log = TrainLog()
    if not prompts or schedule.steps == 0:
        return log
    if not hasattr(model, "disable_adapter"):
        raise TrainingError("DPO needs a LoRA adapter: its reference is the model with the adapter off")
    device = next(model.parameters()).device
    enc_c = encode_for_training(tokenizer, prompts, chosen)
    enc_r = encode_for_training(tokenizer, prompts, rejected)
    params, opt, sched = _optimizer(model, schedule)
    model.train()
    for step, idx in enumerate(tqdm(_batches(len(prompts), batch_size, schedule.steps, seed),
                                    total=schedule.steps, desc="dpo", mininterval=1.0)):
        bc = {k: v[idx].to(device) for k, v in enc_c.items()}
        br = {k: v[idx].to(device) for k, v in enc_r.items()}
        with torch.no_grad(), model.disable_adapter():
            ref_c = token_logprobs(model, bc)[0].sum(-1)
            ref_r = token_logprobs(model, br)[0].sum(-1)
        lc, mc = token_logprobs(model, bc)
        lr_, _ = token_logprobs(model, br)
        nll = -lc.sum(-1) / mc.sum(-1).clamp(min=1)
        loss, stats = dpo_loss(lc.sum(-1), lr_.sum(-1), ref_c, ref_r, beta, nll, nll_weight)
        _update(loss, step, params, opt, sched, max_grad_norm)
        log.add(
            loss.item(),
            reward_margin=stats["reward_margin"].mean().item(),
            reward_accuracy=stats["reward_accuracy"].mean().item(),
        )
    model.eval()
    return log
