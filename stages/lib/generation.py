"""Batched generation and log-prob scoring with `transformers` (the hf backend, CPU or GPU).

Prompts are length-sorted and left-padded so one `generate()` call with a KV cache serves many
prompts and samples at once; `generate()` derives position ids from the attention mask, so a
left-padded prompt gets the same greedy answer as the same prompt alone (tested). The batch is
capped to what the KV cache of the free memory holds. Scoring (log-probs, self-certainty) runs
length-sorted batches of prompt + response through one forward pass each.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class SamplingSpec:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 16
    greedy: bool = False
    batch_size: int = 1024  # sequences per generate() call


def _decode(tokenizer: PreTrainedTokenizerBase, ids: torch.Tensor) -> str:
    ids = ids.tolist()
    if tokenizer.eos_token_id in ids:
        ids = ids[: ids.index(tokenizer.eos_token_id)]
    return tokenizer.decode(ids, skip_special_tokens=True)


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    spec: SamplingSpec,
    seed: int,
    desc: str = "generate",
    progress: bool = True,
) -> list[list[str]]:
    """`spec.n` responses for each prompt, in prompt order. Seeded: same inputs, same outputs."""
    if not prompts:
        return []
    device = next(model.parameters()).device
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
    per_call = max(1, spec.batch_size // spec.n)
    longest = len(tokenizer(prompts[order[-1]])["input_ids"]) + spec.max_new_tokens
    fits = max(1, memory_cap(model, longest) // spec.n)
    if fits < per_call:
        log.warning("%s: %d prompts per generate() call fit in free memory (asked for %d)", desc, fits, per_call)
        per_call = fits
    out: list[list[str]] = [[] for _ in prompts]
    tokenizer.padding_side = "left"
    bar = tqdm(total=len(prompts) * spec.n, desc=desc, unit="seq", disable=not progress, mininterval=1.0)
    for b, start in enumerate(range(0, len(order), per_call)):
        idx = order[start : start + per_call]
        enc = tokenizer([prompts[i] for i in idx], return_tensors="pt", padding=True).to(device)
        torch.manual_seed(seed * 1_000_003 + b)
        kwargs = dict(
            max_new_tokens=spec.max_new_tokens,
            num_return_sequences=spec.n,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        if spec.greedy:
            kwargs.update(do_sample=False)
        else:
            kwargs.update(do_sample=True, temperature=spec.temperature, top_p=spec.top_p, top_k=0)
        seqs = model.generate(**enc, **kwargs)
        new = seqs[:, enc["input_ids"].shape[1] :].cpu()
        for j, i in enumerate(idx):
            out[i] = [_decode(tokenizer, new[j * spec.n + r]) for r in range(spec.n)]
        bar.update(len(idx) * spec.n)
    bar.close()
    return out


def _free_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def memory_cap(model: torch.nn.Module, seq_len: int, share: float = 0.5) -> int:
    """How many sequences of `seq_len` tokens one generate() call may hold in `share` of free memory.

    Counts the KV cache, the prefill activations and the last step's logits of each sequence.
    """
    cfg = model.config
    param = next(model.parameters())
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    width = param.element_size()
    kv = 2 * cfg.num_hidden_layers * kv_heads * head_dim * seq_len * width
    activations = 4 * max(cfg.hidden_size, getattr(cfg, "intermediate_size", 0)) * seq_len * width
    logits = 3 * cfg.vocab_size * 4
    return max(1, int(share * _free_bytes(param.device)) // (kv + activations + logits))


def encode_for_training(
    tokenizer: PreTrainedTokenizerBase, prompts: list[str], responses: list[str]
) -> dict[str, torch.Tensor]:
    """Right-padded prompt+response+<eos> with a mask that is 1 on response tokens only."""
    rows = []
    for p, r in zip(prompts, responses, strict=True):
        p_ids = tokenizer(p)["input_ids"]
        r_ids = tokenizer(r, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append((p_ids + r_ids, [0] * len(p_ids) + [1] * len(r_ids)))
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    loss_mask = torch.zeros((len(rows), width), dtype=torch.float)
    for i, (ids, mask) in enumerate(rows):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention[i, : len(ids)] = 1
        loss_mask[i, : len(ids)] = torch.tensor(mask, dtype=torch.float)
    return {"input_ids": input_ids, "attention_mask": attention, "loss_mask": loss_mask}


def token_logprobs(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs of the response tokens and their mask, both (batch, seq-1)."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
    targets = batch["input_ids"][:, 1:]
    logps = torch.gather(F.log_softmax(logits.float(), dim=-1), 2, targets.unsqueeze(-1)).squeeze(-1)
    mask = batch["loss_mask"][:, 1:]
    return logps * mask, mask


@dataclass(frozen=True)
class Scores:
    """Per (prompt, response): summed log-prob of the response tokens (with <eos>), their count,
    and self-certainty, the mean over those tokens of KL(Uniform || p) = -log V - mean_j log p_j."""

    logp: list[float]
    tokens: list[int]
    self_certainty: list[float]
    processed_tokens: int  # prompt + response tokens run through the model


@torch.no_grad()
def score(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    responses: list[str],
    batch_size: int = 256,
    desc: str = "score",
    progress: bool = True,
) -> Scores:
    """Score many responses in length-sorted batches, one forward pass each; results in input order."""
    n = len(prompts)
    logp, count, certainty = [0.0] * n, [0] * n, [0.0] * n
    processed = 0
    if n == 0:
        return Scores(logp, count, certainty, 0)
    device = next(model.parameters()).device
    order = sorted(range(n), key=lambda i: (len(prompts[i]) + len(responses[i]), i))
    bar = tqdm(total=n, desc=desc, unit="seq", disable=not progress, mininterval=1.0)
    for start in range(0, n, batch_size):
        idx = order[start : start + batch_size]
        batch = encode_for_training(tokenizer, [prompts[i] for i in idx], [responses[i] for i in idx])
        batch = {k: v.to(device) for k, v in batch.items()}
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
        logps = F.log_softmax(logits.float(), dim=-1)
        mask = batch["loss_mask"][:, 1:]
        target = torch.gather(logps, 2, batch["input_ids"][:, 1:].unsqueeze(-1)).squeeze(-1)
        kl_uniform = -math.log(logps.shape[-1]) - logps.mean(-1)
        tokens = mask.sum(-1)
        sums = (target * mask).sum(-1).tolist()
        certs = ((kl_uniform * mask).sum(-1) / tokens.clamp(min=1)).tolist()
        for j, i in enumerate(idx):
            logp[i], count[i], certainty[i] = sums[j], int(tokens[j].item()), certs[j]
        processed += int(batch["attention_mask"].sum().item())
        bar.update(len(idx))
    bar.close()
    return Scores(logp, count, certainty, processed)
