"""Trainers, one per family, in TRL's shape: SFT (base warm-up, RAFT), preference (DPO, IPO, SPIN,
CREAM), GRPO and NFT. Each takes the run settings every trainer shares (`RunContext`) and its own
config section (`train.dpo`, `train.grpo`, `train.nft`), and trains through the one loop
(self_improve/training/loop.py).

Reference log-probs (the preference family's pi_ref, GRPO's pi_old and KL reference, NFT's pi_old)
are computed once before training from the iteration's starting model, in micro-batches, so LoRA
and full fine-tuning work alike and no second copy of the model is kept. Memory is bounded by the
micro-batch: gradients accumulate over micro-batches up to the batch, each padded to its own
longest row, and log-probs are gathered for the response tokens only (self_improve/engines/hf.py).
The preference trainer runs chosen and rejected responses in one forward pass (TRL's
`concatenated_forward`), so a micro-batch of n pairs is 2n rows.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedTokenizerBase

from self_improve.chat import ChatFormat
from self_improve.config import DpoConfig, GrpoConfig, NftConfig, algorithm_of
from self_improve.engines.hf import Row, collate, encode_rows, pad_id, token_batches, token_logprobs
from self_improve.training.loop import Checkpoints, Schedule, TrainLog, autocast_to, fit
from self_improve.training.losses import grpo_loss, nft_loss, sft_loss, with_nll


@dataclass(frozen=True)
class RunContext:
    """What every trainer's run shares: the tokenizer and chat format that encode the rows, the LR
    schedule, the batch (and micro-batch) size, the data-order seed, gradient clipping, the
    `accelerate.Accelerator` for scale-out and the resumable checkpoints."""

    tokenizer: PreTrainedTokenizerBase
    schedule: Schedule
    batch_size: int
    seed: int = 0
    micro_batch_size: int | None = None
    max_grad_norm: float = 1.0
    accelerator: object | None = None
    checkpoints: Checkpoints | None = None
    chat: ChatFormat | None = None
    max_length: int | None = None
    autocast: torch.dtype | None = None  # train.bf16: forward passes in this dtype (weights stay float32)

    def encode(self, prompts: list[str], responses: list[str]) -> Encoded:
        rows = encode_rows(self.chat or ChatFormat.of(self.tokenizer), prompts, responses, self.max_length)
        return Encoded(rows, pad_id(self.tokenizer))

    @property
    def micro(self) -> int:
        return self.micro_batch_size or self.batch_size

    def fit(self, model: torch.nn.Module, n: int, step_fn, desc: str, weight_fn=None,
            stop_loss: float | None = None, length_fn=None) -> TrainLog:
        if n == 0:
            return fit(model, 0, None, self.schedule, self.batch_size, self.seed, checkpoints=self.checkpoints)
        return fit(model, n, step_fn, self.schedule, self.batch_size, self.seed, self.max_grad_norm, desc,
                   stop_loss, self.accelerator, self.checkpoints, self.micro_batch_size, weight_fn, length_fn,
                   self.autocast)

    def reference(self, model: torch.nn.Module, data: Encoded) -> list[torch.Tensor]:
        """`reference_logprobs` in micro-batches, in the precision training runs in."""
        return reference_logprobs(model, data, self.micro, self.autocast)


@dataclass
class Encoded:
    """Training rows of one algorithm, padded per micro-batch (never to the longest row overall)."""

    rows: list[Row]
    pad: int

    def batch(self, idx: list[int], device: torch.device) -> dict[str, torch.Tensor]:
        return {k: v.to(device) for k, v in collate([self.rows[i] for i in idx], self.pad).items()}

    def tokens(self, idx: list[int]) -> float:
        return float(sum(self.rows[i].response_len for i in idx))

    def length(self, i: int) -> int:
        """Row `i`'s tokens, prompt and response: the width it pads its micro-batch to."""
        return len(self.rows[i].ids)


def concatenated(first: Encoded, second: Encoded, idx: list[int], device: torch.device) -> dict[str, torch.Tensor]:
    """Rows `idx` of `first` then the same rows of `second`, one batch padded to the longest of both."""
    rows = [first.rows[i] for i in idx] + [second.rows[i] for i in idx]
    return {k: v.to(device) for k, v in collate(rows, first.pad).items()}


@torch.no_grad()
def reference_logprobs(model: torch.nn.Module, data: Encoded, batch_size: int = 64,
                       autocast: torch.dtype | None = None) -> list[torch.Tensor]:
    """Per-token log-probs of each row's response tokens under `model` as it is now (kept as fp32 on
    the CPU); with `autocast`, its forward passes run in that dtype, as training's do."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out: list[torch.Tensor] = [torch.empty(0)] * len(data.rows)
    for idx in token_batches([len(r.ids) for r in data.rows], batch_size, 1 << 62):
        with autocast_to(device, autocast):
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


class SFTTrainer:
    """Fine-tuning on (prompt, response) rows with the token-mean NLL of the response (the base
    warm-up, RAFT). With `stop_loss`, training ends once a moving average of the loss falls below it."""

    def __init__(self, ctx: RunContext, desc: str = "sft", stop_loss: float | None = None):
        self.ctx, self.desc, self.stop_loss = ctx, desc, stop_loss

    def train(self, model: torch.nn.Module, prompts: list[str], responses: list[str]) -> TrainLog:
        data = self.ctx.encode(prompts, responses)

        def step(runner, idx, device):
            logps, mask = token_logprobs(runner, data.batch(idx, device))
            return sft_loss(logps, mask), {}

        return self.ctx.fit(model, len(prompts), step, self.desc, data.tokens, self.stop_loss, data.length)


class PreferenceTrainer:
    """DPO, IPO, SPIN or CREAM on (prompt, chosen, rejected); the reference is the starting model.

    The loss and how it reads the log-probs come from the algorithm table (self_improve/config/algorithms.py:
    `loss`, `mean_logps`, `nll`, `consistency`). The NLL term on the chosen answer (iterative RPO,
    `train.dpo.rpo_alpha`) applies to dpo, cream and spin (where the chosen answer is the seed
    data's reference; `rpo_alpha: 0` gives SPIN's original loss). `weights`: one per pair
    (pairs.weight), multiplying its preference and NLL terms; None: all 1.
    """

    def __init__(self, ctx: RunContext, algorithm: str, cfg: DpoConfig):
        spec = algorithm_of(algorithm)
        if spec.family != "preference":
            raise ValueError(f"not a preference algorithm: {algorithm} ({spec.family})")
        self.ctx, self.algorithm, self.cfg = ctx, algorithm, cfg
        self.loss, self.fn = spec, spec.loss_function()

    def train(self, model: torch.nn.Module, prompts: list[str], chosen: list[str], rejected: list[str],
              consistency: list[float] | None = None, weights: list[float] | None = None) -> TrainLog:
        if not prompts:
            return self.ctx.fit(model, 0, None, self.algorithm)
        spec, beta, alpha = self.loss, self.cfg.beta, self.cfg.rpo_alpha
        enc_c, enc_r = self.ctx.encode(prompts, chosen), self.ctx.encode(prompts, rejected)

        def seq(per_row: list[torch.Tensor]) -> torch.Tensor:
            sums = torch.tensor([float(t.sum()) for t in per_row])
            if spec.mean_logps:
                return sums / torch.tensor([max(1, len(t)) for t in per_row], dtype=torch.float)
            return sums

        ref_c = seq(self.ctx.reference(model, enc_c))
        ref_r = seq(self.ctx.reference(model, enc_r))
        cons = torch.tensor(consistency if consistency is not None else [0.5] * len(prompts), dtype=torch.float)
        pair_w = torch.tensor(weights, dtype=torch.float) if weights is not None else None

        def step(runner, idx, device):
            logps, mask = token_logprobs(runner, concatenated(enc_c, enc_r, idx, device))
            n = len(idx)
            lc, mc, mr = logps[:n], mask[:n], mask[n:]
            pc, pr = lc.sum(-1), logps[n:].sum(-1)
            if spec.mean_logps:
                pc, pr = pc / mc.sum(-1).clamp(min=1), pr / mr.sum(-1).clamp(min=1)
            w = pair_w[idx].to(device) if pair_w is not None else None
            extra = {"consistency": cons[idx].to(device)} if spec.consistency else {}
            loss, stats = self.fn(pc, pr, ref_c[idx].to(device), ref_r[idx].to(device), beta=beta, weight=w, **extra)
            if spec.nll:
                loss = with_nll(loss, -lc.sum(-1) / mc.sum(-1).clamp(min=1), alpha, w)
            return loss, {
                "reward_margin": stats["reward_margin"].mean().item(),
                "reward_accuracy": stats["reward_accuracy"].mean().item(),
            }

        return self.ctx.fit(model, len(prompts), step, self.algorithm,
                            length_fn=lambda i: max(enc_c.length(i), enc_r.length(i)))


@dataclass
class OnPolicyTrainer(ABC):
    """The trainers of stored samples (GRPO, NFT): the samples were drawn by the starting model, so
    it is pi_old, its token log-probs taken once before the first step; each step calls
    `loss(logps, old, mask, **the batch's per-sample values)`, token-weighted across micro-batches.
    Abstract: only its subclasses, which define the loss, can be made."""

    ctx: RunContext
    name: str = field(init=False, default="")

    @abstractmethod
    def loss(self, logps, old, mask, **values) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The per-batch loss and its detached diagnostics."""

    def train_on(self, model: torch.nn.Module, prompts: list[str], responses: list[str],
                 per_sample: dict[str, list[float]]) -> TrainLog:
        if not prompts:
            return self.ctx.fit(model, 0, None, self.name)
        data = self.ctx.encode(prompts, responses)
        old = self.ctx.reference(model, data)
        values = {k: torch.tensor(v, dtype=torch.float) for k, v in per_sample.items()}

        def step(runner, idx, device):
            logps, mask = token_logprobs(runner, data.batch(idx, device))
            o = _stack(old, idx, logps.shape[1], device)
            loss, stats = self.loss(logps, o, mask, **{k: v[idx].to(device) for k, v in values.items()})
            return loss, {k: float(v) for k, v in stats.items()}

        return self.ctx.fit(model, len(prompts), step, self.name, data.tokens, length_fn=data.length)


@dataclass
class GRPOTrainer(OnPolicyTrainer):
    """GRPO on stored groups: the samples were drawn by the starting model, which is both pi_old
    (the clipped ratio, `train.grpo.epsilon`) and the KL reference (`train.grpo.beta`); several
    epochs over them move the ratio off 1."""

    cfg: GrpoConfig = field(default_factory=GrpoConfig)
    name: str = field(init=False, default="grpo")

    def loss(self, logps, old, mask, adv):
        beta = self.cfg.beta
        return grpo_loss(logps, old, adv, mask, self.cfg.epsilon, ref_logps=old if beta > 0 else None, kl_beta=beta)

    def train(self, model: torch.nn.Module, prompts: list[str], responses: list[str],
              advantages: list[float]) -> TrainLog:
        return self.train_on(model, prompts, responses, {"adv": advantages})


@dataclass
class NFTTrainer(OnPolicyTrainer):
    """NFT on stored samples with 1/0 labels and their prompt's rate of right samples (pi_old: the
    starting model, which drew them)."""

    cfg: NftConfig = field(default_factory=NftConfig)
    name: str = field(init=False, default="nft")

    def loss(self, logps, old, mask, labels, rates):
        return nft_loss(logps, old, labels, rates, mask, self.cfg.eps, self.cfg.neg_weight, self.cfg.omega.value)

    def train(self, model: torch.nn.Module, prompts: list[str], responses: list[str], labels: list[float],
              rates: list[float]) -> TrainLog:
        return self.train_on(model, prompts, responses, {"labels": labels, "rates": rates})
