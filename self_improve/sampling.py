"""k responses per prompt from a sampler, as the samples table (the sample stage's logic).

Batched generation through the model's chat format (token-length-sorted, left-padded, KV cache;
or vLLM), temperature and top-p from params, seeded per iteration. Each sample records whether it
was cut by `max_new_tokens` (`truncated`), and its final answer as the task reads it (`pred`) with the
convention it was written in (`pred_form`). With `sample.stop_at_answer` a response ends where its
first complete final answer does (the task's `answer_end`); with `sample.adaptive` and a vote judge,
prompts are sampled in windows and a vote group stops once more samples cannot change what the judge
makes of it (self_improve/adaptive.py), so a prompt has between `window` and k samples.
"""

from __future__ import annotations

from typing import Callable, Optional

import pandas as pd

from self_improve import adaptive
from self_improve.config import JudgeConfig, SampleConfig
from self_improve.engines.hf import SamplingSpec
from self_improve.engines.sampler import Sampler
from self_improve.judges.validity import invalid_reason
from self_improve.tasks import Task, answer_stop


def spec_of(cfg: SampleConfig, task: Task, n: int) -> SamplingSpec:
    """The sampling spec of `cfg` for n responses per prompt, with the task's answer stop when asked for."""
    return SamplingSpec(n=n, temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens,
                        batch_size=cfg.batch_size, stop_at=answer_stop(task, cfg.stop_at_answer))


def sample(sampler: Sampler, prompts: pd.DataFrame, cfg: SampleConfig, seed: int, task: Task,
           progress: bool = True, judge: Optional[JudgeConfig] = None, stats: Optional[dict] = None) -> pd.DataFrame:
    """The samples table of `prompts`. `judge`: the iteration's judge, which adaptive sampling reads
    (its vote key, gate and validity check); `stats` receives what was drawn."""
    key = adaptive.vote_key(judge) if judge is not None and cfg.adaptive.enabled else None
    prompt_list = list(prompts["prompt"])
    if key is None:
        responses = sampler.generate(prompt_list, spec_of(cfg, task, cfg.k), seed, desc="sample", progress=progress)
        texts, cut, tokens = list(responses), responses.truncated, responses.new_tokens
        drawn = {"samples": sum(len(t) for t in texts), "samples_at_k": len(texts) * cfg.k, "saved_share": 0.0}
    else:
        got = _adaptive(sampler, prompts, cfg, seed, task, judge, key, progress)
        texts, cut, tokens, drawn = got.texts, got.truncated, got.new_tokens, got.stats
    if stats is not None:
        stats.update(drawn, new_tokens=tokens)
    counts = [len(t) for t in texts]
    rows = prompts.loc[prompts.index.repeat(counts)].reset_index(drop=True)
    flat = [r for rs in texts for r in rs]
    rows["sample_id"] = [f"{pid}/s{j}" for pid, n in zip(prompts["prompt_id"], counts) for j in range(n)]
    rows["response"] = flat
    answers = [task.extract(r) for r in flat]
    rows["pred"] = [a.answer for a in answers]
    rows["pred_form"] = [a.form for a in answers]
    rows["truncated"] = [t for ts in cut for t in ts]
    return rows


def vote_reader(task: Task, judge: JudgeConfig, prompts: list[str]) -> Callable[[int, str], Optional[str]]:
    """`vote(i, response)`: the answer a response to prompts[i] votes for, as the judge reads it (None:
    no answer, or with judge.validity an invalid response, which does not vote: judges/registry.py)."""
    question = getattr(task, "question", lambda prompt: prompt)
    ruled_out = task.ruled_out if judge.shortcut else (lambda prompt: frozenset())

    def vote(i: int, response: str) -> Optional[str]:
        pred = task.extract(response).answer
        if pred is not None and judge.validity and invalid_reason(
                question(prompts[i]), response, pred, judge.restates.value, ruled_out(prompts[i])) is not None:
            return None
        return pred

    return vote


def _adaptive(sampler: Sampler, prompts: pd.DataFrame, cfg: SampleConfig, seed: int, task: Task,
              judge: JudgeConfig, key: str, progress: bool) -> adaptive.Drawn:
    prompt_list = list(prompts["prompt"])

    def generate(idx: list[int], n: int, round_seed: int):
        res = sampler.generate([prompt_list[i] for i in idx], spec_of(cfg, task, n), round_seed,
                               desc=f"sample ({len(idx)} prompts x {n})", progress=progress)
        return list(res), res.truncated, res.new_tokens

    return adaptive.draw(generate, [str(g) for g in prompts[key]], vote_reader(task, judge, prompt_list), cfg.k,
                         cfg.adaptive.window, judge.min_share, seed, adaptive.harmonic_of(judge),
                         cfg.adaptive.unanimous)
