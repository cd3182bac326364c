"""The training loop every trainer shares (`fit`): seeded data order, warm-up + cosine schedule
(transformers'), gradient clipping and accumulation over micro-batches, a guard that stops on a
non-finite loss before any model is written, resumable checkpoints with every RNG state, and
`accelerate` for scale-out: under `accelerate launch` each process trains on its shard of every
batch and DDP averages the gradients; alone it is a plain single-device loop.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import get_cosine_with_min_lr_schedule_with_warmup

from self_improve.distributed import is_fsdp
from self_improve.errors import TrainingError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Schedule:
    """Linear warm-up to `lr` over `warmup_steps`, then a cosine decay to `min_lr_ratio * lr` at
    `steps`: transformers' `get_cosine_with_min_lr_schedule_with_warmup` (warm-up from 0, as in
    TRL and the HF Trainer)."""

    lr: float
    steps: int
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0

    def scheduler(self, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
        return get_cosine_with_min_lr_schedule_with_warmup(
            optimizer, self.warmup_steps, self.steps, min_lr_rate=self.min_lr_ratio)


@dataclass
class TrainLog:
    losses: list[float] = field(default_factory=list)
    extra: dict[str, list[float]] = field(default_factory=dict)
    resumed_from: int = 0
    # tokens/s and the matmul share (training/throughput.py): timings, so not in summary() (an output of the
    # stage must not change when it is run again); the train stage adds them to its timing record
    speed: dict[str, float] = field(default_factory=dict)

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

    `state.pt` holds the trainable weights, optimiser, schedule, step, log and every RNG state
    (torch, CUDA, Python, NumPy: as the HF Trainer keeps them), written
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


def rng_state() -> dict:
    """Every random generator a resumed run continues from, in a form `torch.load(weights_only=True)` reads."""
    kind, key, pos, has_gauss, gauss = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": (kind, torch.from_numpy(key.astype(np.int64)), pos, has_gauss, gauss)}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict | torch.Tensor) -> None:
    """Restore `rng_state()`'s generators (a bare tensor: a checkpoint that kept torch's alone)."""
    if isinstance(state, torch.Tensor):
        torch.set_rng_state(state)
        return
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, key, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, key.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


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
    return params, opt, schedule.scheduler(opt)


def steps_for(n: int, batch_size: int, epochs: int) -> int:
    return max(1, math.ceil(n / batch_size)) * epochs if n else 0


StepFn = Callable[[torch.nn.Module, list[int], torch.device], tuple[torch.Tensor, dict[str, float]]]
WeightFn = Callable[[list[int]], float]
LengthFn = Callable[[int], int]


def _micro(idx: list[int], size: int, length_fn: LengthFn | None = None) -> list[list[int]]:
    """`idx` cut into micro-batches of `size`; with `length_fn` (an item's padded length) sorted by
    it first when there is more than one, so each micro-batch pads to rows of like length. The batch
    keeps its items, so the accumulated gradient is the same sum (up to float rounding)."""
    if length_fn is not None and len(idx) > size:
        idx = sorted(idx, key=lambda i: (length_fn(i), i))
    return [idx[i : i + size] for i in range(0, len(idx), size)] or [[]]


def autocast_to(device: torch.device | str, dtype: torch.dtype | None):
    """torch.autocast to `dtype` on `device`'s type (mixed precision); with None, no change."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=dtype)


@contextlib.contextmanager
def frozen_in(model: torch.nn.Module, dtype: torch.dtype | None):
    """While open, the frozen linear layers' weights (LoRA's base) are held in `dtype`, the dtype autocast
    casts them to in every forward pass anyway: the same products, without a cast of all frozen weights
    per micro-batch (a tenth of a bfloat16 LoRA step on a CPU). Trainable weights, and weights the input
    embedding shares (a tied lm_head: the residual stream starts from it), stay as they are; on exit
    the original tensors are put back, so the model leaves as it came. With None, nothing changes."""
    if dtype is None:
        yield
        return
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    shared = {id(embed.weight)} if embed is not None else set()
    swapped: list[tuple[torch.nn.Module, str, torch.nn.Parameter]] = []
    try:
        for module in model.modules():
            if not isinstance(module, torch.nn.Linear):
                continue
            for name in ("weight", "bias"):
                p = getattr(module, name)
                if p is None or p.requires_grad or id(p) in shared or not p.is_floating_point() or p.dtype == dtype:
                    continue
                swapped.append((module, name, p))
                setattr(module, name, torch.nn.Parameter(p.detach().to(dtype), requires_grad=False))
        yield
    finally:
        for module, name, p in reversed(swapped):
            setattr(module, name, p)


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
    length_fn: LengthFn | None = None,
    autocast: torch.dtype | None = None,
) -> TrainLog:
    """Optimise `model` for `schedule.steps` batches of item indices; step_fn gives the loss.

    Each batch is cut into micro-batches of `micro_batch_size` items: step_fn returns a micro-batch's
    mean loss, which is scaled by its share of the batch's weight (`weight_fn`: its number of
    response tokens for token-mean losses, else of items) before backward, so the accumulated
    gradient is the whole batch's while memory holds one micro-batch. With `length_fn`, a batch's
    items go to micro-batches by length (less padding; which items form a batch is unchanged). With an
    `accelerate.Accelerator`, the model and optimiser are prepared by it and each process takes its
    shard of every batch. With `checkpoints`, training resumes from a matching state. With `autocast`
    (train.bf16), step_fn's forward pass and loss run under torch.autocast to that dtype; backward
    runs outside it, as PyTorch advises, and weights, gradients and the optimiser stay as they are.
    """
    train_log = TrainLog()
    if n == 0 or schedule.steps == 0:
        if checkpoints:
            checkpoints.finish(0)
        return train_log
    weight_fn = weight_fn or (lambda idx: float(len(idx)))
    run = _prepare(model, schedule, accelerator)
    if batch_size < run.world:
        raise TrainingError(f"batch_size {batch_size} is smaller than the {run.world} training processes")
    train_log, start = _resumed(run, model, checkpoints, schedule.steps, desc)
    ema: float | None = None
    for loss in train_log.losses:
        ema = loss if ema is None else 0.9 * ema + 0.1 * loss
    run.runner.train()
    bar = tqdm(total=schedule.steps, initial=start, desc=desc, mininterval=1.0, disable=run.rank != 0)
    for step, idx in enumerate(_batches(n, batch_size, schedule.steps, seed)):
        if step < start:
            continue  # the data order of a resumed run is the uninterrupted one's
        value, stats = _accumulate(run, idx[run.rank::run.world], step_fn, micro_batch_size or batch_size,
                                   weight_fn, length_fn, autocast)
        if not torch.isfinite(value):
            raise TrainingError(f"{desc}: loss is {value.item()} at step {step}; stopping without writing a model")
        _optimiser_step(run, accelerator, max_grad_norm)
        train_log.add(value.item(), **stats)
        bar.update(1)
        ema = value.item() if ema is None else 0.9 * ema + 0.1 * value.item()
        if checkpoints and checkpoints.due(step + 1, schedule.steps):
            checkpoints.save(_state(run, step + 1, train_log))
        if stop_loss is not None and ema < stop_loss:
            break
    bar.close()
    run.runner.eval()
    if accelerator is not None:
        accelerator.wait_for_everyone()
    if checkpoints:
        checkpoints.finish(len(train_log.losses))
    return train_log


def _resumed(run: "_Run", model: torch.nn.Module, checkpoints: Checkpoints | None, steps: int,
             desc: str) -> tuple[TrainLog, int]:
    """The log and the step a run starts from: a matching checkpoint's, else an empty log at step 0 (a
    checkpoint written with FSDP does not resume a run without it, nor the other way round)."""
    state = checkpoints.load() if checkpoints else None
    if state is not None and state.get("sharded", False) != run.sharded:
        log.info("%s: checkpoint written %s FSDP; training from the start", desc,
                 "with" if not run.sharded else "without")
        state = None
    if state is None:
        return TrainLog(), 0
    log.info("%s: resuming from the checkpoint at step %d of %d", desc, state["step"], steps)
    return _resume(run, model, state), state["step"]


def _optimiser_step(run: "_Run", accelerator, max_grad_norm: float) -> None:
    """Clip the accumulated gradient's norm, step the optimiser and the learning-rate schedule."""
    if accelerator is not None:
        accelerator.clip_grad_norm_(run.params, max_grad_norm)
    else:
        torch.nn.utils.clip_grad_norm_(run.params, max_grad_norm)
    run.opt.step()
    run.sched.step()


@dataclass
class _Run:
    """What one training run steps: the model as the accelerator wrapped it, its optimiser, scheduler
    and trainable parameters, and this process's place among the training processes."""

    runner: torch.nn.Module
    opt: torch.optim.Optimizer
    sched: object
    params: list[torch.nn.Parameter]
    names: list[str]
    accelerator: object
    rank: int
    world: int
    device: torch.device
    sharded: bool


def _prepare(model: torch.nn.Module, schedule: Schedule, accelerator) -> _Run:
    """The optimiser and scheduler of `schedule` for `model`'s trainable parameters, both prepared by
    `accelerator` where there is one."""
    params, opt, sched = _optimizer(model, schedule)
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    sharded = is_fsdp(accelerator)
    if accelerator is None:
        return _Run(model, opt, sched, params, names, None, 0, 1, next(model.parameters()).device, False)
    runner, opt = accelerator.prepare(model, opt)
    if sharded:  # FSDP2 replaced the parameters by sharded ones (the optimiser follows them)
        params = [p for p in runner.parameters() if p.requires_grad]
    return _Run(runner, opt, sched, params, names, accelerator, accelerator.process_index,
                accelerator.num_processes, accelerator.device, sharded)


def _resume(run: _Run, model: torch.nn.Module, state: dict) -> TrainLog:
    """The weights, optimiser, scheduler and random state of a checkpoint put back; its log."""
    if run.sharded:  # every process loads the whole state and keeps its shard
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        set_state_dict(run.runner, run.opt.optimizer, model_state_dict=state["trainable"],
                       optim_state_dict=state["optimizer"],
                       options=StateDictOptions(full_state_dict=True, strict=False))
    else:
        current = dict(model.named_parameters())
        with torch.no_grad():
            for name, value in state["trainable"].items():
                current[name].copy_(value.to(current[name].device))
        run.opt.load_state_dict(state["optimizer"])
    run.sched.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    return TrainLog(state["log"]["losses"], state["log"]["extra"], resumed_from=state["step"])


def _accumulate(run: _Run, shard: list[int], step_fn: StepFn, micro: int, weight_fn: WeightFn,
                length_fn: LengthFn | None, autocast: torch.dtype | None) -> tuple[torch.Tensor, dict[str, float]]:
    """One batch's gradient (this process's `shard` of it), accumulated over its micro-batches, each
    loss scaled by the micro-batch's share of the batch's weight; the batch's loss (averaged over the
    processes) and its diagnostics."""
    accelerator = run.accelerator
    total = max(weight_fn(shard), 1e-12)
    parts = _micro(shard, micro, length_fn)
    run.opt.zero_grad(set_to_none=True)
    value = torch.zeros((), device=run.device)
    stats: dict[str, float] = {}
    for k, part in enumerate(parts):
        share = weight_fn(part) / total if len(parts) > 1 else 1.0
        sync = accelerator is None or run.world == 1 or k == len(parts) - 1
        with contextlib.nullcontext() if sync else accelerator.no_sync(run.runner):
            with autocast_to(run.device, autocast):
                loss, part_stats = step_fn(run.runner, part, run.device)
            scaled = loss * share if len(parts) > 1 else loss
            if accelerator is not None:
                accelerator.backward(scaled)
            else:
                scaled.backward()
        value = value + scaled.detach()
        for key, v in part_stats.items():
            stats[key] = stats.get(key, 0.0) + v * (len(part) / len(shard))
    if accelerator is not None and run.world > 1:
        value = accelerator.reduce(value, "mean")
    return value, stats


def _state(run: _Run, step: int, train_log: TrainLog) -> dict:
    """A checkpoint's contents after `step` steps (with FSDP a collective: every process sends its
    shards, the main one keeps the whole)."""
    if run.sharded:
        trainable, optimizer = _gather_sharded(run.runner, run.opt.optimizer)
    else:
        trainable = {k: v.detach().cpu() for k, v in zip(run.names, run.params)}
        optimizer = run.opt.state_dict()
    return {"step": step, "sharded": run.sharded, "trainable": trainable, "optimizer": optimizer,
            "scheduler": run.sched.state_dict(), "log": {"losses": train_log.losses, "extra": train_log.extra},
            "rng": rng_state()}


def _gather_sharded(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """An FSDP model's trainable weights and optimiser state, whole, on the CPU of the main process
    (keyed by parameter name, so any number of processes can resume from them)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
    return get_state_dict(model, optimizer, options=options)
