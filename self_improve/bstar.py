"""B-STaR's balance between exploration and exploitation (Zeng et al. 2024, arXiv 2412.17256;
hkust-nlp/B-STaR's determine_hyper.py): each iteration's sampling temperature and reward threshold
are chosen on a dev subset of its prompts, by the balance score, instead of being fixed.

For a temperature T and a threshold t, every dev prompt i is sampled k times at T and judged; the
selected responses are its distinct responses with reward >= t (n_i of them), n'_i of those are
right, and

    bs(T, t) = mean over the dev prompts of min(n'_i / n*, 1) * n'_i / n_i

(exploration: enough distinct right responses, up to n*; exploitation: the share of the selected
that are right). A prompt with nothing selected scores 0: the official script leaves such prompts
out of the mean, which lets a threshold that keeps almost nothing win on the few it keeps. "Right"
is the judge's pseudo-label (label-free: a sample whose answer is the label its group's vote gave)
or the verifier's (the oracle's choice, to compare). The highest score wins; ties go to the lower
temperature, then the higher threshold. The chosen threshold is RAFT's (pairs.sft_min_reward).
"""

from __future__ import annotations

import random
import time

import pandas as pd

from self_improve.config import BstarLabels, Params
from self_improve.judges import JudgeContext, judge_samples
from self_improve.judges.registry import ruled_out_by


def off(params: Params) -> dict:
    """The fixed choice when B-STaR is off: the params' own temperature and threshold."""
    return {"enabled": False, "temperature": params.sample.temperature, "threshold": params.pairs.sft_min_reward}


def dev_prompts(prompts: pd.DataFrame, size: int, seed: int) -> pd.DataFrame:
    """`size` problems drawn (seeded) from the iteration's prompts, each with all its rewrites (its group)."""
    groups = list(dict.fromkeys(prompts["group_id"]))
    random.Random(seed).shuffle(groups)
    keep = set(groups[:size])
    return prompts[prompts["group_id"].isin(keep)].reset_index(drop=True)


def right(judged: pd.DataFrame, labels: BstarLabels) -> pd.Series:
    """Per sample: is it right? The verifier's verdict, or the judge's pseudo-label (where the judge
    gives none, a reward of at least 0.5); an answer the validity check rejected is never right."""
    if labels == BstarLabels.verifier:
        return judged["correct"].astype("Float64").fillna(0.0).astype(float) >= 1.0
    label = judged["label"].astype(object)
    pred = judged["pred"].astype(object)
    by_label = pd.Series([isinstance(p, str) and isinstance(lab, str) and p == lab for p, lab in zip(pred, label)],
                         index=judged.index)
    by_reward = judged["reward"].astype("Float64").fillna(0.0).astype(float) >= 0.5
    out = by_label.where(label.notna(), by_reward)
    valid = judged["valid"].astype("boolean").fillna(True).astype(bool) if "valid" in judged else True
    return out.astype(bool) & valid


def balance(judged: pd.DataFrame, is_right: pd.Series, threshold: float, n_star: int) -> dict:
    """The balance score of one threshold on judged samples (one temperature), with its two parts."""
    rows = []
    for _, g in judged.groupby("prompt_id", sort=False):
        reward = g["reward"].astype("Float64")
        chosen = g[(reward >= threshold).fillna(False).astype(bool)]
        seen: dict[str, bool] = {}
        for resp, ok in zip(chosen["response"], is_right[chosen.index]):
            key = resp.strip() if isinstance(resp, str) else ""
            seen[key] = seen.get(key, False) or bool(ok)
        n, n_right = len(seen), sum(seen.values())
        rows.append((min(n_right / n_star, 1.0) * n_right / n if n else 0.0, n, n_right))
    if not rows:
        return {"balance": 0.0, "selected": 0.0, "right": 0.0}
    return {"balance": sum(r[0] for r in rows) / len(rows), "selected": sum(r[1] for r in rows) / len(rows),
            "right": sum(r[2] for r in rows) / len(rows)}


def choose(grid: list[dict]) -> dict:
    """The grid point with the highest balance; ties: the lower temperature, then the higher threshold."""
    return max(grid, key=lambda g: (round(g["balance"], 12), -g["temperature"], g["threshold"]))


def sweep(sampler, prompts: pd.DataFrame, params: Params, task, seed: int, min_share: float,
          progress: bool = True) -> dict:
    """Sample the dev subset at every temperature, judge it, score every (temperature, threshold)."""
    from self_improve.sampling import sample  # torch: only when the sweep runs

    cfg = params.sample.bstar
    start = time.perf_counter()
    dev = dev_prompts(prompts, cfg.dev_size, seed)
    judge_cfg = params.judge.model_copy(update={"min_share": min_share})
    ctx = JudgeContext(verify=task.verify, question=getattr(task, "question", lambda prompt: prompt),
                       progress=False)
    if judge_cfg.shortcut:
        ctx.ruled_out = ruled_out_by(task, params.task.name)
    grid, sampled = [], 0
    for j, temperature in enumerate(cfg.temperatures):
        spec = params.sample.model_copy(update={"temperature": temperature})
        samples = sample(sampler, dev, spec, seed + 1 + j, task, progress=progress)
        sampled += len(samples)
        judged = judge_samples(samples, judge_cfg, ctx)
        ok = right(judged, cfg.labels)
        for threshold in cfg.thresholds:
            grid.append({"temperature": temperature, "threshold": threshold,
                         **balance(judged, ok, threshold, cfg.n_star)})
    best = choose(grid)
    return {"enabled": True, "temperature": best["temperature"], "threshold": best["threshold"],
            "balance": best["balance"], "labels": cfg.labels.value, "dev_prompts": len(dev),
            "samples": sampled, "seconds": round(time.perf_counter() - start, 3), "grid": grid}
