"""Preference pairs (DPO family), best-judged samples (RAFT) and groups (GRPO) from an iteration's judgments.

Per prompt: chosen = a highest-reward sample, rejected = a lowest-reward one; prompts whose
rewards tie (or whose margin is not above `min_margin`) and samples without a verdict are
dropped; chosen and rejected are never the same text. Ties within the best or worst set are
broken by a seeded RNG. CREAM's consistency travels with each pair. Where the judge ran the
validity check, an invalid sample is never chosen (nor kept for RAFT) and, among the lowest-reward
samples, an invalid one is rejected first. `pairs.weight: margin` gives each pair its reward margin
as its weight in the loss (ScPO: with vote_share rewards, (votes for chosen - votes for rejected) / k).
`pairs.max_pairs` keeps a seeded draw of at most that many pairs (a control arm's pair budget).

For `spin` the pairs are SPIN's instead: on the seed-data prompts (source `seed`, as posed),
chosen = the seed data's reference answer, rejected = one of the model's own samples that
differs from it. Groups (GRPO): every scored sample of a prompt whose rewards are not all equal,
with its group-relative advantage (r - mean) / (std + eps), std unbiased as in GRPO/TRL; a group
whose rewards are all equal carries no gradient and is left out.
"""

from __future__ import annotations

import random

import numpy as np
import pandas as pd

from self_improve import artifacts as art
from self_improve.config import PairsConfig, PairWeight

ADVANTAGE_EPS = 1e-4


def _value(x) -> float | None:
    return None if x is None or pd.isna(x) else float(x)


def _invalid(row: dict) -> bool:
    v = row.get("valid")
    return v is not None and not pd.isna(v) and not bool(v)


def build(judgments: pd.DataFrame, cfg: PairsConfig, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = random.Random(seed)
    scored = judgments.dropna(subset=["reward"]).sort_values(["prompt_id", "sample_id"])
    groups: dict[str, list[dict]] = {}
    for row in scored.to_dict("records"):
        groups.setdefault(row["prompt_id"], []).append(row)
    pairs, best = [], []
    for pid, rows in groups.items():
        valid = [r for r in rows if not _invalid(r)]
        if not valid:
            continue
        hi = max(float(r["reward"]) for r in valid)
        lo = min(float(r["reward"]) for r in rows)
        top = [r for r in valid if float(r["reward"]) == hi]
        if hi >= cfg.sft_min_reward:
            r = top[rng.randrange(len(top))]
            best.append({"iteration": r["iteration"], "prompt_id": pid, "prompt": r["prompt"],
                         "response": r["response"], "reward": hi, "correct": r["correct"]})
        if hi - lo <= cfg.min_margin:
            continue
        bottom = [r for r in rows if float(r["reward"]) == lo]
        bottom = [r for r in bottom if _invalid(r)] or bottom
        options = [(c, w) for c in top for w in bottom if c["response"] != w["response"]]
        if not options:
            continue
        c, w = options[rng.randrange(len(options))]
        pairs.append({"iteration": c["iteration"], "prompt_id": pid, "prompt": c["prompt"],
                      "chosen": c["response"], "rejected": w["response"],
                      "chosen_reward": hi, "rejected_reward": lo,
                      "chosen_correct": c["correct"], "rejected_correct": w["correct"],
                      "consistency": _value(c.get("consistency")),
                      "weight": hi - lo if cfg.weight == PairWeight.margin else None})
    if cfg.max_pairs is not None and len(pairs) > cfg.max_pairs:  # a control arm's pair budget
        keep = sorted(rng.sample(range(len(pairs)), cfg.max_pairs))
        pairs = [pairs[i] for i in keep]
    return pd.DataFrame(pairs, columns=art.PAIRS.names), pd.DataFrame(best, columns=art.SFT.names)


def spin_pairs(judgments: pd.DataFrame, seed: int) -> pd.DataFrame:
    """SPIN: (reference answer, own sample) on the seed-data prompts as posed."""
    rng = random.Random(seed)
    real = judgments[(judgments["source"] == "seed") & (judgments["variant"] == 0)]
    rows = []
    for pid, group in real.sort_values(["prompt_id", "sample_id"]).groupby("prompt_id", sort=False):
        reference = group["answer"].iloc[0]
        if not isinstance(reference, str):
            continue
        own = [r for r in group.to_dict("records") if r["response"] != reference]
        if not own:
            continue  # the model already writes the reference: nothing to contrast
        w = own[rng.randrange(len(own))]
        rows.append({"iteration": w["iteration"], "prompt_id": pid, "prompt": w["prompt"],
                     "chosen": reference, "rejected": w["response"],
                     "chosen_reward": None, "rejected_reward": _value(w["reward"]),
                     "chosen_correct": 1.0, "rejected_correct": _value(w["correct"]), "consistency": None,
                     "weight": None})
    return pd.DataFrame(rows, columns=art.PAIRS.names)


def group_advantages(rewards: np.ndarray, eps: float = ADVANTAGE_EPS) -> np.ndarray:
    """GRPO's group-relative advantages (Shao et al. 2024, DeepSeekMath), normalised as TRL does:
    A_i = (r_i - mean(r)) / (std(r) + eps) over one prompt's samples, std unbiased (n - 1) as
    torch.std in TRL's GRPOTrainer. A group of one, or whose rewards are all equal, gets exactly 0."""
    r = np.asarray(rewards, dtype=float)
    if len(r) < 2 or np.all(r == r[0]):
        return np.zeros_like(r)
    return (r - r.mean()) / (r.std(ddof=1) + eps)


def groups(judgments: pd.DataFrame, penalty: float = 1.0) -> pd.DataFrame:
    """GRPO groups: scored samples of prompts whose rewards differ, with their advantages; and the
    samples of prompts judge.low_consensus penalise marked, each with advantage -penalty (RESTRAIN)."""
    scored = judgments.dropna(subset=["reward"]).sort_values(["prompt_id", "sample_id"])
    out = []
    for _, g in scored.groupby("prompt_id", sort=False):
        r = g["reward"].astype(float).to_numpy()
        if g["penalised"].fillna(False).astype(bool).all():
            out.append(g.assign(reward=r, advantage=-penalty)[art.GROUPS.names])
            continue
        if len(r) < 2 or np.all(r == r[0]):
            continue
        adv = group_advantages(r)
        out.append(g.assign(reward=r, advantage=adv)[art.GROUPS.names])
    if not out:
        return art.empty_table(art.GROUPS)
    return pd.concat(out, ignore_index=True)
