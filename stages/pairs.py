"""Stage `pairs`: preference pairs (DPO family) and best-judged samples (RAFT).

Per prompt: chosen = a highest-reward sample, rejected = a lowest-reward one; prompts whose
rewards tie (or whose margin is not above `min_margin`) and samples without a verdict are
dropped; chosen and rejected are never the same text. Ties within the best or worst set are
broken by a seeded RNG.
"""

from __future__ import annotations

import argparse
import random

import pandas as pd

from .lib import artifacts as art
from .lib.cli import derive_seed, run_stage, stage_provenance
from .lib.config import PairsConfig, Params


def build(judgments: pd.DataFrame, cfg: PairsConfig, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = random.Random(seed)
    scored = judgments.dropna(subset=["reward"]).sort_values(["prompt_id", "sample_id"])
    groups: dict[str, list[dict]] = {}
    for row in scored.to_dict("records"):
        groups.setdefault(row["prompt_id"], []).append(row)
    pairs, best = [], []
    for pid, rows in groups.items():
        hi = max(float(r["reward"]) for r in rows)
        lo = min(float(r["reward"]) for r in rows)
        top = [r for r in rows if float(r["reward"]) == hi]
        if hi >= cfg.sft_min_reward:
            r = top[rng.randrange(len(top))]
            best.append({"iteration": r["iteration"], "prompt_id": pid, "prompt": r["prompt"],
                         "response": r["response"], "reward": hi, "correct": r["correct"]})
        if hi - lo <= cfg.min_margin:
            continue
        bottom = [r for r in rows if float(r["reward"]) == lo]
        options = [(c, w) for c in top for w in bottom if c["response"] != w["response"]]
        if not options:
            continue
        c, w = options[rng.randrange(len(options))]
        pairs.append({"iteration": c["iteration"], "prompt_id": pid, "prompt": c["prompt"],
                      "chosen": c["response"], "rejected": w["response"],
                      "chosen_reward": hi, "rejected_reward": lo,
                      "chosen_correct": c["correct"], "rejected_correct": w["correct"]})
    return pd.DataFrame(pairs, columns=art.PAIRS.names), pd.DataFrame(best, columns=art.SFT.names)


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--iteration", required=True)
    p.add_argument("--judgments", required=True, help="in: judgments (parquet)")
    p.add_argument("--pairs", required=True, help="out: preference pairs (parquet)")
    p.add_argument("--sft", required=True, help="out: best-judged samples (parquet)")


def main(argv: list[str] | None = None) -> None:
    def body(args: argparse.Namespace, params: Params) -> None:
        params.iteration_index(args.iteration)
        judgments = art.read_table(args.judgments, art.JUDGMENTS)
        pairs, best = build(judgments, params.pairs, derive_seed(params.seed, "pairs", args.iteration))
        prov = stage_provenance("pairs", args.iteration, params, ("seed", "pairs"), [args.pairs, args.sft])
        art.write_table(pairs, args.pairs, art.PAIRS, prov)
        art.write_table(best, args.sft, art.SFT, prov)

    run_stage("pairs", _args, body, argv)


if __name__ == "__main__":
    main()
