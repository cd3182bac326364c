"""Training loops: SFT (base warm-up, RAFT), the DPO family (DPO, IPO, SPIN, CREAM), GRPO and NFT.

One loop (`fit`) serves them all: seeded data order, warmup + cosine schedule, gradient
clipping, a guard that stops on a non-finite loss before any model is written, resumable
checkpoints, and `accelerate` for scale-out: under `accelerate launch` each process trains on its
shard of every batch and DDP averages the gradients; alone it is a plain single-device loop.

Reference log-probs (the DPO family's pi_ref, GRPO's pi_old and KL reference) are computed once
before training from the iteration's starting model, in micro-batches, so LoRA and full
fine-tuning work alike and no second copy of the model is kept. Memory is bounded by the
micro-batch: gradients accumulate over micro-batches up to the batch, each padded to its own
longest row, and log-probs are gathered for the response tokens only (self_improve/engines/hf.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from self_improve.chat import ChatFormat
from self_improve.config import Algorithm
from self_improve.distributed import is_fsdp
from self_improve.engines.hf import Row, collate, encode_rows, pad_id, token_batches, token_logprobs
from self_improve.errors import TrainingError
from self_improve.training.losses import (
    cream_loss,
    dpo_loss,
    grpo_loss,
    ipo_loss,
    nft_loss,
    sft_loss,
    spin_loss,
    with_nll,
)

log = logging.getLogger(__name__)


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
    resumed_from: int = 0

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


class Checkpoints:
    """Resumable training state in one directory (a DVC `persist` output of the train stage).

    `state.pt` holds the trainable weights, optimiser, schedule, step, log and RNG state, written
    atomically every `every` steps; it is used only when its fingerprint (inputs and params)
    matches. A finished run leaves `done.json` instead, so the directory stays small.
    """

    def __init__(self, directory: str | Path, fingerprint: str, every: int, is_main: bool = True):
        self.dir, self.fingerprint, self.every, self.is_main = Path(directory), fingerprint, every, is_main

    @property
    def state_path(self) -> Path:
        return self.dir / "state.pt"

    def load(self) -> dict | None:
        if not self.state_path.is_file():
            return None
        try:
            state = torch.load(self.state_path, map_location="cpu", weights_only=True)
        except Exception as err:  # a torn or foreign file: start over, never crash on it
            log.warning("%s: unreadable checkpoint (%s); training from the start", self.state_path, err)
            return None
        if state.get("fingerprint") != self.fingerprint:
            log.info("%s: checkpoint of other inputs or params; training from the start", self.state_path)
            return None
        return state

    def due(self, step: int, total: int) -> bool:
        return self.every > 0 and step % self.every == 0 and step < total

    def save(self, state: dict) -> None:
        if not self.is_main:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / ".state.pt.tmp"
        torch.save({**state, "fingerprint": self.fingerprint}, tmp)
        os.replace(tmp, self.state_path)

    def finish(self, steps: int) -> None:
        if not self.is_main:
            return
        if self.dir.exists():
            shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True)
        (self.dir / "done.json").write_text(
            json.dumps({"fingerprint": self.fingerprint, "steps": steps}, indent=2) + "\n", encoding="utf-8"
        )


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


def steps_for(n: int, batch_size: int, epochs: int) -> int:
    return max(1, math.ceil(n / batch_size)) * epochs if n else 0


StepFn = Callable[[torch.nn.Module, list[int], torch.device], tuple[torch.Tensor, dict[str, float]]]
WeightFn = Callable[[list[int]], float]


def _micro(idx: list[int], size: int) -> list[list[int]]:
    return [idx[i : i + size] for i in range(0, len(idx), size)] or [[]]


def fit(
    model: torch.nn.Module,
    n: int,
    step_fn: StepFn,
    schedule: Schedule,
    batch_size: int,
    seed: int,
    max_grad_norm: float = 1.0,
    desc: str = "train",
    stop_loss: float | None = None,
    accelerator=None,
    checkpoints: Checkpoints | None = None,
    micro_batch_size: int | None = None,
    weight_fn: WeightFn | None = None,
) -> TrainLog:
    """Optimise `model` for `schedule.steps` batches of item indices; step_fn gives the loss.

    Each batch is cut into micro-batches of `micro_batch_size` items: step_fn returns a micro-batch's
    mean loss, which is scaled by its share of the batch's weight (`weight_fn`: its number of
    response tokens for token-mean losses, else of items) before backward, so the accumulated
    gradient is the whole batch's while memory holds one micro-batch. With an
    `accelerate.Accelerator`, the model and optimiser are prepared by it and each process takes its
    shard of every batch. With `checkpoints`, training resumes from a matching state.
    """
    train_log = TrainLog()
    if n == 0 or schedule.steps == 0:
        if checkpoints:
            checkpoints.finish(0)
        return train_log
    weight_fn = weight_fn or (lambda idx: float(len(idx)))
    micro = micro_batch_size or batch_size
    params, opt, sched = _optimizer(model, schedule)
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    rank, world = 0, 1
    runner = model
    sharded = is_fsdp(accelerator)
    if accelerator is not None:
        runner, opt = accelerator.prepare(model, opt)
        rank, world = accelerator.process_index, accelerator.num_processes
        device = accelerator.device
        if sharded:  # FSDP2 replaced the parameters by sharded ones (the optimiser follows them)
            params = [p for p in runner.parameters() if p.requires_grad]
    else:
        device = next(model.parameters()).device
    if batch_size < world:
        raise TrainingError(f"batch_size {batch_size} is smaller than the {world} training processes")
    start = 0
    state = checkpoints.load() if checkpoints else None
    if state is not None and state.get("sharded", False) != sharded:
        log.info("%s: checkpoint written %s FSDP; training from the start", desc, "with" if not sharded else "without")
        state = None
    if state is not None:
        if sharded:  # every process loads the whole state and keeps its shard
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

            set_state_dict(runner, opt.optimizer, model_state_dict=state["trainable"],
                           optim_state_dict=state["optimizer"],
                           options=StateDictOptions(full_state_dict=True, strict=False))
        else:
            current = dict(model.named_parameters())
            with torch.no_grad():
                for name, value in state["trainable"].items():
                    current[name].copy_(value.to(current[name].device))
            opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        train_log = TrainLog(state["log"]["losses"], state["log"]["extra"], resumed_from=state["step"])
        torch.set_rng_state(state["rng"])
        start = state["step"]
        log.info("%s: resuming from the checkpoint at step %d of %d", desc, start, schedule.steps)
    ema: float | None = None
    for loss in train_log.losses:
        ema = loss if ema is None else 0.9 * ema + 0.1 * loss
    runner.train()
    bar = tqdm(total=schedule.steps, initial=start, desc=desc, mininterval=1.0, disable=rank != 0)
    for step, idx in enumerate(_batches(n, batch_size, schedule.steps, seed)):
        if step < start:
            continue  # the data order of a resumed run is the uninterrupted one's
        shard = idx[rank::world]
        total = max(weight_fn(shard), 1e-12)
        parts = _micro(shard, micro)
        opt.zero_grad(set_to_none=True)
        value = torch.zeros((), device=device)
        stats: dict[str, float] = {}
        for k, part in enumerate(parts):
            share = weight_fn(part) / total if len(parts) > 1 else 1.0
            sync = accelerator is None or world == 1 or k == len(parts) - 1
            ctx = contextlib.nullcontext() if sync else accelerator.no_sync(runner)
            with ctx:
                loss, part_stats = step_fn(runner, part, device)
                scaled = loss * share if len(parts) > 1 else loss
                if accelerator is not None:
                    accelerator.backward(scaled)
                else:
                    scaled.backward()
            value = value + scaled.detach()
            for key, v in part_stats.items():
                stats[key] = stats.get(key, 0.0) + v * (len(part) / len(shard))
        if accelerator is not None and world > 1:
            value = accelerator.reduce(value, "mean")
        if not torch.isfinite(value):
            raise TrainingError(f"{desc}: loss is {value.item()} at step {step}; stopping without writing a model")
        if accelerator is not None:
            accelerator.clip_grad_norm_(params, max_grad_norm)
        else:
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        opt.step()
        sched.step()
        train_log.add(value.item(), **stats)
        bar.update(1)
        ema = value.item() if ema is None else 0.9 * ema + 0.1 * value.item()
        if checkpoints and checkpoints.due(step + 1, schedule.steps):
            if sharded:  # a collective: every process sends its shards, the main one writes the whole
                trainable, optimizer = _gather_sharded(runner, opt.optimizer)
            else:
                trainable = {k: v.detach().cpu() for k, v in zip(names, params)}
                optimizer = opt.state_dict()
            checkpoints.save({
                "step": step + 1,
                "sharded": sharded,
                "trainable": trainable,
                "optimizer": optimizer,
                "scheduler": sched.state_dict(),
                "log": {"losses": train_log.losses, "extra": train_log.extra},
                "rng": torch.get_rng_state(),
            })
        if stop_loss is not None and ema < stop_loss:
            break
    bar.close()
    runner.eval()
    if accelerator is not None:
        accelerator.wait_for_everyone()
    if checkpoints:
        checkpoints.finish(len(train_log.losses))
    return train_log


def _gather_sharded(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """An FSDP model's trainable weights and optimiser state, whole, on the CPU of the main process
    (keyed by parameter name, so any number of processes can resume from them)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
    return get_state_dict(model, optimizer, options=options)


@dataclass
class Encoded:
    """Training rows of one algorithm, padded per micro-batch (never to the longest row overall)."""

    rows: list[Row]
    pad: int

    def batch(self, idx: list[int], device: torch.device) -> dict[str, torch.Tensor]:
        return {k: v.to(device) for k, v in collate([self.rows[i] for i in idx], self.pad).items()}

    def tokens(self, idx: list[int]) -> float:
        return float(sum(self.rows[i].response_len for i in idx))


def encode(tokenizer: PreTrainedTokenizerBase, prompts: list[str], responses: list[str],
           chat: ChatFormat | None = None, max_length: int | None = None) -> Encoded:
    chat = chat or ChatFormat.of(tokenizer)
    rows = encode_rows(chat, prompts, responses, max_length)
    return Encoded(rows, pad_id(tokenizer))


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
    accelerator=None,
    checkpoints: Checkpoints | None = None,
    micro_batch_size: int | None = None,
    chat: ChatFormat | None = None,
    max_length: int | None = None,
) -> TrainLog:
    """Fine-tune on (prompt, response) pairs with the token-mean NLL of the response.

    With `stop_loss`, training ends early once a moving average of the loss falls below it.
    """
    if not prompts:
        return fit(model, 0, None, schedule, batch_size, seed, checkpoints=checkpoints)
    data = encode(tokenizer, prompts, responses, chat, max_length)

    def step(runner, idx, device):
        logps, mask = token_logprobs(runner, data.batch(idx, device))
        return sft_loss(logps, mask), {}

    return fit(model, len(prompts), step, schedule, batch_size, seed, max_grad_norm, desc, stop_loss,
               accelerator, checkpoints, micro_batch_size, data.tokens)


@torch.no_grad()
def reference_logprobs(model: torch.nn.Module, data: Encoded, batch_size: int = 64) -> list[torch.Tensor]:
    """Per-token log-probs of each row's response tokens under `model` as it is now (fp32, CPU)."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out: list[torch.Tensor] = [torch.empty(0)] * len(data.rows)
    for idx in token_batches([len(r.ids) for r in data.rows], batch_size, 1 << 62):
        logps, _ = token_logprobs(model, data.batch(idx, device))
        logps = logps.float().cpu()
        for j, i in enumerate(idx):
            out[i] = logps[j, : data.rows[i].response_len].clone()
    model.train(was_training)
    return out


def _stack(per_row: list[torch.Tensor], idx: list[int], width: int, device: torch.device) -> torch.Tensor:
    """Response-aligned per-token values of rows `idx`, zero-padded to `width` columns."""
    out = torch.zeros((len(idx), width))
    for j, i in enumerate(idx):
        t = per_row[i][:width]
        out[j, : len(t)] = t
    return out.to(device)


def train_preference(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    algorithm: Algorithm,
    prompts: list[str],
    chosen: list[str],
    rejected: list[str],
    schedule: Schedule,
    batch_size: int,
    seed: int,
    beta: float,
    nll_weight: float = 0.0,
    consistency: list[float] | None = None,
    max_grad_norm: float = 1.0,
    weights: list[float] | None = None,
    accelerator=None,
    checkpoints: Checkpoints | None = None,
    micro_batch_size: int | None = None,
    chat: ChatFormat | None = None,
    max_length: int | None = None,
) -> TrainLog:
    """DPO, IPO, SPIN or CREAM on (prompt, chosen, rejected); the reference is the starting model.

    IPO uses length-normalised (token-mean) log-probs as TRL does; the others summed log-probs.
    The NLL term on the chosen answer (iterative RPO) applies to dpo, cream and spin (where the
    chosen answer is the seed data's reference; `nll_weight: 0` gives SPIN's original loss).
    `weights`: one per pair (pairs.weight), multiplying its preference and NLL terms; None: all 1.
    """
    if not prompts:
        return fit(model, 0, None, schedule, batch_size, seed, checkpoints=checkpoints)
    micro = micro_batch_size or batch_size
    enc_c = encode(tokenizer, prompts, chosen, chat, max_length)
    enc_r = encode(tokenizer, prompts, rejected, chat, max_length)
    mean = algorithm == Algorithm.ipo

    def seq(per_row: list[torch.Tensor]) -> torch.Tensor:
        sums = torch.tensor([float(t.sum()) for t in per_row])
        if mean:
            return sums / torch.tensor([max(1, len(t)) for t in per_row], dtype=torch.float)
        return sums

    ref_c_seq = seq(reference_logprobs(model, enc_c, micro))
    ref_r_seq = seq(reference_logprobs(model, enc_r, micro))
    cons = torch.tensor(consistency if consistency is not None else [0.5] * len(prompts), dtype=torch.float)
    pair_w = torch.tensor(weights, dtype=torch.float) if weights is not None else None

    def step(runner, idx, device):
        lc, mc = token_logprobs(runner, enc_c.batch(idx, device))
        lr_, mr = token_logprobs(runner, enc_r.batch(idx, device))
        pc, pr = lc.sum(-1), lr_.sum(-1)
        if mean:
            pc, pr = pc / mc.sum(-1).clamp(min=1), pr / mr.sum(-1).clamp(min=1)
        rc, rr = ref_c_seq[idx].to(device), ref_r_seq[idx].to(device)
        w = pair_w[idx].to(device) if pair_w is not None else None
        if algorithm == Algorithm.dpo:
            loss, stats = dpo_loss(pc, pr, rc, rr, beta, w)
        elif algorithm == Algorithm.ipo:
            loss, stats = ipo_loss(pc, pr, rc, rr, beta, w)
        elif algorithm == Algorithm.spin:
            loss, stats = spin_loss(pc, pr, rc, rr, beta, w)
        elif algorithm == Algorithm.cream:
            loss, stats = cream_loss(pc, pr, rc, rr, cons[idx].to(device), beta, w)
        else:
            raise ValueError(f"not a preference algorithm: {algorithm}")
        if algorithm != Algorithm.ipo:  # IPO's squared loss has its own target margin; no NLL term
            loss = with_nll(loss, -lc.sum(-1) / mc.sum(-1).clamp(min=1), nll_weight, w)
        return loss, {
            "reward_margin": stats["reward_margin"].mean().item(),
            "reward_accuracy": stats["reward_accuracy"].mean().item(),
        }

    return fit(model, len(prompts), step, schedule, batch_size, seed, max_grad_norm, algorithm.value,
               accelerator=accelerator, checkpoints=checkpoints, micro_batch_size=micro_batch_size)


def _train_on_samples(model, tokenizer, prompts: list[str], responses: list[str], per_sample: dict[str, list[float]],
                      loss_fn, name: str, schedule: Schedule, batch_size: int, seed: int, max_grad_norm: float,
                      accelerator, checkpoints, micro_batch_size, chat, max_length) -> TrainLog:
    """The on-policy trainers' loop (GRPO, NFT): the stored samples were drawn by the starting
    model, so it is pi_old, its token log-probs taken once before the first step; each step calls
    `loss_fn(logps, old, mask, **per_sample values of the batch)`, token-weighted across micro-batches."""
    if not prompts:
        return fit(model, 0, None, schedule, batch_size, seed, checkpoints=checkpoints)
    data = encode(tokenizer, prompts, responses, chat, max_length)
    old = reference_logprobs(model, data, micro_batch_size or batch_size)
    values = {k: torch.tensor(v, dtype=torch.float) for k, v in per_sample.items()}

    def step(runner, idx, device):
        logps, mask = token_logprobs(runner, data.batch(idx, device))
        o = _stack(old, idx, logps.shape[1], device)
        loss, stats = loss_fn(logps, o, mask, **{k: v[idx].to(device) for k, v in values.items()})
        return loss, {k: float(v) for k, v in stats.items()}

    return fit(model, len(prompts), step, schedule, batch_size, seed, max_grad_norm, name,
               accelerator=accelerator, checkpoints=checkpoints, micro_batch_size=micro_batch_size,
               weight_fn=data.tokens)


def train_grpo(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    responses: list[str],
    advantages: list[float],
    schedule: Schedule,
    batch_size: int,
    seed: int,
    clip_eps: float = 0.2,
    kl_beta: float = 0.0,
    max_grad_norm: float = 1.0,
    accelerator=None,
    checkpoints: Checkpoints | None = None,
    micro_batch_size: int | None = None,
    chat: ChatFormat | None = None,
    max_length: int | None = None,
) -> TrainLog:
    """GRPO on stored groups: the samples were drawn by the starting model, which is both pi_old
    (the clipped ratio) and the KL reference; several epochs over them move the ratio off 1."""
    def loss(logps, old, mask, adv):
        return grpo_loss(logps, old, adv, mask, clip_eps, ref_logps=old if kl_beta > 0 else None, kl_beta=kl_beta)

    return _train_on_samples(model, tokenizer, prompts, responses, {"adv": advantages}, loss, "grpo", schedule,
                             batch_size, seed, max_grad_norm, accelerator, checkpoints, micro_batch_size, chat,
                             max_length)


def train_nft(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    responses: list[str],
    labels: list[float],
    rates: list[float],
    schedule: Schedule,
    batch_size: int,
    seed: int,
    eps: float = 1.0,
    neg_weight: float = 1.0,
    omega: str = "one_minus_r",
    max_grad_norm: float = 1.0,
    accelerator=None,
    checkpoints: Checkpoints | None = None,
    micro_batch_size: int | None = None,
    chat: ChatFormat | None = None,
    max_length: int | None = None,
) -> TrainLog:
    """NFT on stored samples with 1/0 labels and their prompt's rate of right samples (pi_old: the
    starting model, which drew them)."""
    def loss(logps, old, mask, labels, rates):
        return nft_loss(logps, old, labels, rates, mask, eps, neg_weight, omega)

    return _train_on_samples(model, tokenizer, prompts, responses, {"labels": labels, "rates": rates}, loss, "nft",
                             schedule, batch_size, seed, max_grad_norm, accelerator, checkpoints, micro_batch_size,
                             chat, max_length)
