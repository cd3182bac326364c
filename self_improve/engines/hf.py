"""Batched generation and log-prob scoring with `transformers` (the hf backend, CPU or GPU).

Every prompt goes through the model's chat format (self_improve/chat.py). Prompts are sorted by
token length and left-padded so one `generate()` call with a KV cache serves many prompts and
samples at once; `generate()` derives position ids from the attention mask, so a left-padded
prompt gets the same greedy answer as the same prompt alone (tested). The batch is capped to what
the KV cache of the free memory holds. Generation stops on every stop id of the chat format; a
response that reached `max_new_tokens` without one is counted as truncated.

Log-probs (scoring, training) are taken on the response tokens only: logits are computed for the
positions from the shortest prompt of the micro-batch on (`logits_to_keep`) and reduced with a
selective log-softmax (the target's logit minus a per-row logsumexp, as TRL does), so no
full-vocabulary fp32 tensor over the whole batch is built. Per-token results are response-aligned
(column 0 = the first response token), so they do not depend on how rows were batched.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from self_improve.chat import ChatFormat, Turn

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SamplingSpec:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 16
    greedy: bool = False
    batch_size: int = 1024  # sequences per generate() call
    # where a complete final answer ends (the task's `answer_end`): decoding stops there and the text is
    # cut to it (sample.stop_at_answer); None: until a stop id or max_new_tokens
    stop_at: Optional[Callable[[str], Optional[int]]] = None


def finish(text: str, stop_at: Optional[Callable[[str], Optional[int]]]) -> tuple[str, bool]:
    """`text` cut where `stop_at` says its answer ends, and whether it did: every engine's last step,
    so a response is the same text whether the engine stopped decoding there or ran on."""
    end = stop_at(text) if stop_at is not None else None
    return (text, False) if end is None else (text[:end], True)


class PieceText:
    """Each row's text as it is generated, from a cache of every token's text: enough to see where an
    answer ends while decoding (the final text is decoded whole and cut by `finish`)."""

    def __init__(self, tokenizer, stop_at: Callable[[str], Optional[int]]):
        self.tokenizer, self.stop_at = tokenizer, stop_at
        self.pieces: dict[int, str] = {}
        self.texts: dict = {}

    def add(self, key, token_id: int) -> bool:
        """Append a token to row `key`; True once the row holds a complete answer."""
        piece = self.pieces.get(token_id)
        if piece is None:
            piece = self.pieces[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=True)
        text = self.texts[key] = self.texts.get(key, "") + piece
        return self.stop_at(text) is not None


def answer_stopping(tokenizer, width: int, stop_at: Callable[[str], Optional[int]]):
    """A `generate()` stopping criterion that ends each row once its new tokens hold a complete answer."""
    from transformers import StoppingCriteria

    class AnswerStop(StoppingCriteria):
        def __init__(self):
            self.rows = PieceText(tokenizer, stop_at)
            self.done: Optional[torch.Tensor] = None

        def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
            if self.done is None:
                self.done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
            if input_ids.shape[1] > width:
                last = input_ids[:, -1].tolist()
                for i, t in enumerate(last):
                    if not self.done[i] and self.rows.add(i, t):
                        self.done[i] = True
            return self.done.clone()

    return AnswerStop()


class Generations(list):
    """`n` responses per prompt (a list of lists of str), with `truncated` of the same shape
    (True: stopped by max_new_tokens, not by a stop token) and the count of generated tokens."""

    def __init__(self, texts=(), truncated=None, new_tokens: int = 0):
        super().__init__(texts)
        self.truncated: list[list[bool]] = truncated if truncated is not None else [[False] * len(t) for t in self]
        self.new_tokens = new_tokens

    def truncated_share(self) -> float | None:
        flat = [t for ts in self.truncated for t in ts]
        return sum(flat) / len(flat) if flat else None


def chat_format(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase) -> ChatFormat:
    return ChatFormat.of(tokenizer, getattr(model, "generation_config", None))


def pad_id(tokenizer: PreTrainedTokenizerBase) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[Turn],
    spec: SamplingSpec,
    seed: int,
    desc: str = "generate",
    progress: bool = True,
    chat: ChatFormat | None = None,
) -> Generations:
    """`spec.n` responses for each prompt, in prompt order. Seeded: same inputs, same outputs."""
    if not prompts:
        return Generations()
    chat = chat or chat_format(model, tokenizer)
    device = next(model.parameters()).device
    ids = [chat.prompt_ids(p) for p in prompts]
    order = sorted(range(len(prompts)), key=lambda i: (len(ids[i]), i))
    per_call = max(1, spec.batch_size // spec.n)
    fits = max(1, memory_cap(model, len(ids[order[-1]]) + spec.max_new_tokens) // spec.n)
    if fits < per_call:
        log.warning("%s: %d prompts per generate() call fit in free memory (asked for %d)", desc, fits, per_call)
        per_call = fits
    pad = pad_id(tokenizer)
    texts: list[list[str]] = [[] for _ in prompts]
    cut: list[list[bool]] = [[] for _ in prompts]
    new_tokens = 0
    bar = tqdm(total=len(prompts) * spec.n, desc=desc, unit="seq", disable=not progress, mininterval=1.0)
    for b, start in enumerate(range(0, len(order), per_call)):
        idx = order[start : start + per_call]
        width = max(len(ids[i]) for i in idx)
        input_ids = torch.full((len(idx), width), pad, dtype=torch.long)
        attention = torch.zeros((len(idx), width), dtype=torch.long)
        for j, i in enumerate(idx):  # left padding
            input_ids[j, width - len(ids[i]) :] = torch.tensor(ids[i])
            attention[j, width - len(ids[i]) :] = 1
        torch.manual_seed(seed * 1_000_003 + b)
        kwargs = dict(max_new_tokens=spec.max_new_tokens, num_return_sequences=spec.n, pad_token_id=pad,
                      eos_token_id=chat.stop_ids)
        if spec.greedy:
            kwargs.update(do_sample=False)
        else:
            kwargs.update(do_sample=True, temperature=spec.temperature, top_p=spec.top_p, top_k=0)
        if spec.stop_at is not None:
            from transformers import StoppingCriteriaList

            kwargs["stopping_criteria"] = StoppingCriteriaList([answer_stopping(tokenizer, width, spec.stop_at)])
        seqs = model.generate(input_ids=input_ids.to(device), attention_mask=attention.to(device), **kwargs)
        new = seqs[:, width:].cpu().tolist()
        for j, i in enumerate(idx):
            for r in range(spec.n):
                toks, stopped = chat.cut_at_stop(new[j * spec.n + r])
                if spec.stop_at is not None and not stopped:  # a row ended by the answer stop is padded after it
                    while toks and toks[-1] == pad:
                        toks = toks[:-1]
                text, answered = finish(tokenizer.decode(toks, skip_special_tokens=True), spec.stop_at)
                texts[i].append(text)
                cut[i].append(not (stopped or answered))
                new_tokens += len(toks) + int(stopped)
        bar.update(len(idx) * spec.n)
    bar.close()
    return Generations(texts, cut, new_tokens)


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


def token_cap(model: torch.nn.Module, share: float = 0.25) -> int:
    """Padded tokens one scoring forward pass may hold in `share` of free memory (logits dominate)."""
    cfg = model.config
    width = next(model.parameters()).element_size()
    per_token = cfg.vocab_size * (width + 4) + 8 * max(cfg.hidden_size, getattr(cfg, "intermediate_size", 0)) * width
    return max(1, int(share * _free_bytes(next(model.parameters()).device)) // per_token)


@dataclass(frozen=True)
class Row:
    """One training / scoring row: prompt tokens (exactly as inference sees them), then response."""

    ids: list[int]
    prompt_len: int

    @property
    def response_len(self) -> int:
        return len(self.ids) - self.prompt_len


def encode_rows(chat: ChatFormat, prompts: list[Turn], responses: list[str],
                max_length: int | None = None) -> list[Row]:
    """Rows of prompt + response + end-of-turn; with `max_length`, the response is cut to fit."""
    rows = []
    for p, r in zip(prompts, responses, strict=True):
        p_ids = chat.prompt_ids(p)
        ids = p_ids + chat.response_ids(r)
        if max_length is not None and len(ids) > max_length:
            ids = ids[: max(max_length, len(p_ids) + 1)]
        rows.append(Row(ids, len(p_ids)))
    return rows


def collate(rows: list[Row], pad: int) -> dict[str, torch.Tensor]:
    """Right-padded to the longest row given, with `loss_mask` 1 on response tokens only."""
    width = max(len(r.ids) for r in rows)
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    loss_mask = torch.zeros((len(rows), width), dtype=torch.float)
    for i, r in enumerate(rows):
        input_ids[i, : len(r.ids)] = torch.tensor(r.ids)
        attention[i, : len(r.ids)] = 1
        loss_mask[i, r.prompt_len : len(r.ids)] = 1.0
    return {"input_ids": input_ids, "attention_mask": attention, "loss_mask": loss_mask,
            "prompt_len": torch.tensor([r.prompt_len for r in rows]),
            "response_len": torch.tensor([r.response_len for r in rows])}


def encode_for_training(tokenizer: PreTrainedTokenizerBase, prompts: list[Turn], responses: list[str],
                        chat: ChatFormat | None = None) -> dict[str, torch.Tensor]:
    """Prompt + response + end-of-turn rows, right-padded, with a mask on the response tokens."""
    chat = chat or ChatFormat.of(tokenizer)
    return collate(encode_rows(chat, prompts, responses), pad_id(tokenizer))


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits)[..., index] without a full log-softmax tensor over the batch (TRL's way).

    logits: (B, T, V); index: (B, T). fp32/fp64: the target's logit minus a per-row logsumexp;
    lower precision: log_softmax one row at a time (logsumexp in bf16 loses too much).
    """
    if logits.dtype in (torch.float32, torch.float64):
        selected = torch.gather(logits, -1, index.unsqueeze(-1)).squeeze(-1)
        lse = torch.stack([torch.logsumexp(row, dim=-1) for row in logits])
        return selected - lse
    out = []
    for row, idx in zip(logits, index):
        out.append(F.log_softmax(row.float(), dim=-1).gather(-1, idx.unsqueeze(-1)).squeeze(-1))
    return torch.stack(out)


def _response_logits(model: torch.nn.Module, batch: dict[str, torch.Tensor]):
    """Logits predicting every response token, the targets, and the start column `s`.

    Only positions from the shortest prompt on get logits (`logits_to_keep`): the lm_head and
    the log-softmax never see the rest of the prompt.
    """
    input_ids = batch["input_ids"]
    width = input_ids.shape[1]
    s = max(0, int(batch["prompt_len"].min()) - 1)  # the first position whose logits predict a response token
    try:
        out = model(input_ids=input_ids, attention_mask=batch["attention_mask"], logits_to_keep=width - s)
        logits = out.logits[:, :-1]  # positions s .. width-2
    except TypeError:  # an architecture without logits_to_keep: all positions, then the slice
        logits = model(input_ids=input_ids, attention_mask=batch["attention_mask"]).logits[:, s:-1]
    return logits, input_ids[:, s + 1 :], s


def _align(per_position: torch.Tensor, batch: dict[str, torch.Tensor], s: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, width-1-s) values at positions s.. -> (B, R) response-aligned values and their mask."""
    rlen = batch["response_len"].to(per_position.device)
    r_max = max(1, int(rlen.max()))
    cols = torch.arange(r_max, device=per_position.device)
    start = (batch["prompt_len"].to(per_position.device) - 1 - s).unsqueeze(1)
    pos = (start + cols).clamp(max=per_position.shape[1] - 1)
    mask = (cols.unsqueeze(0) < rlen.unsqueeze(1)).to(torch.float)
    return torch.gather(per_position, 1, pos) * mask, mask


def token_logprobs(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of the response tokens (B, R), response-aligned and 0 where masked, and the mask (B, R)."""
    logits, targets, s = _response_logits(model, batch)
    return _align(selective_log_softmax(logits, targets), batch, s)


def _mean_minus_own(row: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(T,) mean logit over the vocabulary minus the target token's logit, for one row (T, V)."""
    return row.mean(-1) - row.gather(-1, target.unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def response_scores(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: the summed log-prob of its response tokens (B,), token_logprobs's, and self-certainty
    (B,) (Kang et al. 2025): the mean over those tokens of KL(Uniform || p) = -log V - mean_j log p_j,
    where mean_j log p_j = log p(token) + mean_j logit_j - logit(token) (the logsumexp cancels)."""
    logits, targets, s = _response_logits(model, batch)
    logps, mask = _align(selective_log_softmax(logits, targets), batch, s)
    offset = torch.stack([_mean_minus_own(row.float(), t) for row, t in zip(logits, targets)])
    mean_logp = logps.float() + _align(offset, batch, s)[0]
    kl = (-math.log(logits.shape[-1]) - mean_logp) * mask
    return logps.float().sum(-1), kl.sum(-1) / mask.sum(-1).clamp(min=1)


@dataclass(frozen=True)
class Scores:
    """Per (prompt, response): summed log-prob of the response tokens (with end-of-turn), their
    count, and self-certainty, the mean over those tokens of KL(Uniform || p) = -log V - mean_j log p_j."""

    logp: list[float]
    tokens: list[int]
    self_certainty: list[float]
    processed_tokens: int  # prompt + response tokens run through the model


def token_batches(lengths: list[int], max_rows: int, max_tokens: int) -> list[list[int]]:
    """Indices sorted by length, cut into batches of at most `max_rows` rows and `max_tokens`
    padded tokens (rows x longest row); a row longer than `max_tokens` goes alone."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        if cur and (len(cur) + 1 > max_rows or (len(cur) + 1) * lengths[i] > max_tokens):
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


@torch.no_grad()
def score(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[Turn],
    responses: list[str],
    batch_size: int = 256,
    desc: str = "score",
    progress: bool = True,
    max_tokens: int = 8192,
    chat: ChatFormat | None = None,
) -> Scores:
    """Score many responses in token-sized, length-sorted batches; results in input order."""
    n = len(prompts)
    logp, count, certainty = [0.0] * n, [0] * n, [0.0] * n
    processed = 0
    if n == 0:
        return Scores(logp, count, certainty, 0)
    chat = chat or chat_format(model, tokenizer)
    device = next(model.parameters()).device
    rows = encode_rows(chat, prompts, responses)
    budget = min(max_tokens, token_cap(model))
    pad = pad_id(tokenizer)
    bar = tqdm(total=n, desc=desc, unit="seq", disable=not progress, mininterval=1.0)
    for idx in token_batches([len(r.ids) for r in rows], batch_size, budget):
        batch = {k: v.to(device) for k, v in collate([rows[i] for i in idx], pad).items()}
        sums, certs = response_scores(model, batch)
        sums, certs = sums.tolist(), certs.tolist()
        for j, i in enumerate(idx):
            logp[i], count[i], certainty[i] = sums[j], rows[i].response_len, certs[j]
        processed += int(batch["attention_mask"].sum().item())
        bar.update(len(idx))
    bar.close()
    return Scores(logp, count, certainty, processed)


def label_token_ids(tokenizer: PreTrainedTokenizerBase, labels: list[str]) -> list[list[int]]:
    """Per label, the first token of its spellings with and without a leading space (distinct)."""
    out = []
    for label in labels:
        ids = []
        for text in (label, " " + label):
            toks = tokenizer(text, add_special_tokens=False)["input_ids"]
            if toks and toks[0] not in ids:
                ids.append(int(toks[0]))
        out.append(ids)
    return out


@torch.no_grad()
def next_token_probs(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    turns: list[Turn],
    labels: list[str],
    prefill: str = "",
    batch_size: int = 64,
    max_tokens: int = 8192,
    desc: str = "judge",
    progress: bool = True,
    chat: ChatFormat | None = None,
) -> list[list[float]]:
    """P(label) for each prompt as the model's next token after its chat prompt and `prefill`
    (the start of its answer), one forward pass per prompt, only the last position's logits
    computed. A label's probability sums its spellings' first tokens (`label_token_ids`)."""
    if not turns:
        return []
    chat = chat or chat_format(model, tokenizer)
    device = next(model.parameters()).device
    extra = list(tokenizer(prefill, add_special_tokens=False)["input_ids"]) if prefill else []
    rows = [chat.prompt_ids(t) + extra for t in turns]
    ids_of = label_token_ids(tokenizer, labels)
    pad = pad_id(tokenizer)
    out: list[list[float]] = [[] for _ in rows]
    bar = tqdm(total=len(rows), desc=desc, unit="seq", disable=not progress, mininterval=1.0)
    for idx in token_batches([len(r) for r in rows], batch_size, min(max_tokens, token_cap(model))):
        width = max(len(rows[i]) for i in idx)
        input_ids = torch.full((len(idx), width), pad, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for j, i in enumerate(idx):  # left-padded: every row's last token is at the last column
            input_ids[j, width - len(rows[i]):] = torch.tensor(rows[i])
            mask[j, width - len(rows[i]):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        kwargs = {"input_ids": input_ids.to(device), "attention_mask": mask.to(device),
                  "position_ids": positions.to(device)}
        try:
            logits = model(**kwargs, logits_to_keep=1).logits[:, -1]
        except TypeError:
            logits = model(**kwargs).logits[:, -1]
        probs = torch.softmax(logits.float(), dim=-1).cpu()
        for j, i in enumerate(idx):
            out[i] = [float(probs[j, ids].sum()) for ids in ids_of]
        bar.update(len(idx))
    bar.close()
    return out
