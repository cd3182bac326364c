"""k responses per prompt from a sampler, as the samples table (the sample stage's logic).

Batched generation through the model's chat format (token-length-sorted, left-padded, KV cache;
or vLLM), temperature and top-p from params, seeded per iteration. Each sample records whether it
was cut by `max_new_tokens` (`truncated`), and its final answer as the task reads it (`pred`) with the
convention it was written in (`pred_form`).
"""

from __future__ import annotations

import pandas as pd

from self_improve.config import SampleConfig
from self_improve.engines.hf import SamplingSpec
from self_improve.engines.sampler import Sampler
from self_improve.tasks import Task


def sample(sampler: Sampler, prompts: pd.DataFrame, cfg: SampleConfig, seed: int, task: Task,
           progress: bool = True) -> pd.DataFrame:
    spec = SamplingSpec(
        n=cfg.k, temperature=cfg.temperature, top_p=cfg.top_p,
        max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size,
    )
    responses = sampler.generate(list(prompts["prompt"]), spec, seed, desc="sample", progress=progress)
    rows = prompts.loc[prompts.index.repeat(cfg.k)].reset_index(drop=True)
    flat = [r for rs in responses for r in rs]
    rows["sample_id"] = [f"{pid}/s{j}" for pid in prompts["prompt_id"] for j in range(cfg.k)]
    rows["response"] = flat
    answers = [task.extract(r) for r in flat]
    rows["pred"] = [a.answer for a in answers]
    rows["pred_form"] = [a.form for a in answers]
    rows["truncated"] = [t for ts in responses.truncated for t in ts]
    return rows
