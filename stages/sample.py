"""Stage `sample`: k responses per prompt from the iteration's starting model.

Batched generation through the model's chat format (token-length-sorted, left-padded, KV cache;
or vLLM), temperature and top-p from params, seeded per iteration. Each sample records whether it
was cut by `max_new_tokens` (`truncated`), and its final answer as the task reads it (`pred`) with the
convention it was written in (`pred_form`).
"""

from __future__ import annotations

import argparse

import pandas as pd

from .lib import artifacts as art
from .lib.cli import derive_seed, run_stage, stage_provenance
from .lib.backends import Sampler, open_sampler
from .lib.config import Params, SampleConfig
from .lib.generation import SamplingSpec
from .lib.models import set_threads
from .lib.tasks import Task, task_for


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


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--iteration", required=True)
    p.add_argument("--prompts", required=True, help="in: this iteration's prompts")
    p.add_argument("--model", required=True, help="in: the iteration's starting model")
    p.add_argument("--base", help="in: the base model (it0) that adapter chains apply to")
    p.add_argument("--engine", help="in: the model's engine dir (its CTranslate2 conversion)")
    p.add_argument("--out", required=True, help="out: samples (parquet)")


def main(argv: list[str] | None = None) -> None:
    def body(args: argparse.Namespace, params: Params) -> None:
        params.iteration_index(args.iteration)
        set_threads()
        prompts = art.read_table(args.prompts, art.PROMPTS)
        sampler = open_sampler(args.model, params.sample, params.security, args.base, params.model, args.engine)
        df = sample(sampler, prompts, params.sample, derive_seed(params.seed, "sample", args.iteration),
                    task_for(params.task))
        prov = stage_provenance("sample", args.iteration, params, ("seed", "model", "sample", "security"), [args.out])
        prov["backend"] = sampler.backend
        if getattr(sampler, "compute_type", None):
            prov["compute_type"] = sampler.compute_type
        art.write_table(df, args.out, art.SAMPLES, prov)

    run_stage("sample", _args, body, argv)


if __name__ == "__main__":
    main()
