"""Stage `pairs`: preference pairs (DPO family), best-judged samples (RAFT), groups (GRPO), built by
self_improve/pairs.py from the iteration's judgments."""

from __future__ import annotations

import argparse

from self_improve import artifacts as art
from self_improve.config import Params
from self_improve.pairs import build, groups, spin_pairs
from self_improve.stage import ITERATION, Arg, Declaration, Run, derive_seed, run_stage, stage_provenance

# the params keys this stage reads: dvc.yaml's params for it, and its provenance
PARAMS = ("seed", "pairs", "train.algorithm")


DECLARATION = Declaration(
    args=(
        ITERATION,
        Arg("--judgments", "in", "judgments (parquet)", required=True),
        Arg("--pairs", "out", "preference pairs (parquet)", required=True),
        Arg("--sft", "out", "best-judged samples (parquet)", required=True),
        Arg("--groups", "out", "GRPO groups with advantages (parquet)", required=True),
        Arg("--bstar", "in", "the bstar stage's choice (its threshold is RAFT's); none: pairs.sft_min_reward"),
    ),
    params=PARAMS,
    runs=(Run("pairs", {
        "--iteration": "${key}", "--judgments": "data/${key}/judgments.parquet", "--pairs": "data/${key}/pairs.parquet",
        "--sft": "data/${key}/sft.parquet", "--groups": "data/${key}/groups.parquet", "--bstar": "data/${key}/bstar.json"},
        foreach="${loop}"),),
)


def main(argv: list[str] | None = None) -> None:
    def body(args: argparse.Namespace, params: Params) -> None:
        params.iteration_index(args.iteration)
        judgments = art.read_table(args.judgments, art.JUDGMENTS)
        seed = derive_seed(params.seed, "pairs", args.iteration)
        cfg = params.pairs
        if args.bstar:
            cfg = cfg.model_copy(update={"sft_min_reward": float(art.read_json(args.bstar)["threshold"])})
        pairs, best = build(judgments, cfg, seed)
        if params.train.entry.reference_pairs:
            pairs = spin_pairs(judgments, seed)
        outs = [args.pairs, args.sft, args.groups]
        prov = stage_provenance("pairs", args.iteration, params, PARAMS, outs)
        prov["spin"] = params.train.entry.reference_pairs  # the seed data's reference answers as chosen
        prov["sft_min_reward"] = cfg.sft_min_reward  # the one used: the params', or B-STaR's choice
        art.write_table(pairs, args.pairs, art.PAIRS, prov)
        art.write_table(best, args.sft, art.SFT, prov)
        art.write_table(groups(judgments, cfg.penalty), args.groups, art.GROUPS, prov)

    run_stage("pairs", DECLARATION.add_args, body, argv, reads=PARAMS)


if __name__ == "__main__":
    main()
