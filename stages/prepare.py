"""Stage `prepare`: the task's evaluation sets and the base model (iteration 0).

The logic: self_improve/preparation.py."""

from __future__ import annotations

import argparse
import logging

from self_improve import artifacts as art
from self_improve.stage import run_stage, stage_provenance
from self_improve.config import Params
from self_improve.curriculum import initial_state
from self_improve.models.loading import (
    save_model,
    set_threads,
    write_base_record,
)
from self_improve.preparation import prepare

log = logging.getLogger(__name__)

# the params keys this stage reads: dvc.yaml's params for it, and its provenance
PARAMS = ("seed", "model", "task", "prepare", "security")


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--heldout", required=True, help="out: held-out eval set (parquet)")
    p.add_argument("--ttt", required=True, help="out: test-time eval set (parquet)")
    p.add_argument("--seed-data", required=True, help="out: the base model's SFT data (parquet)")
    p.add_argument("--model", required=True, help="out: base model directory")
    p.add_argument("--init-model", required=True, help="out: the base model before its warm-up")
    p.add_argument("--judgments", required=True, help="out: iteration 0's (empty) judgments")
    p.add_argument("--metrics", required=True, help="out: base training metrics (json)")
    p.add_argument("--curriculum", required=True, help="out: the initial curriculum bandit state (json)")


def main(argv: list[str] | None = None) -> None:
    def body(args: argparse.Namespace, params: Params) -> None:
        set_threads()
        out = prepare(params)
        outs = [args.heldout, args.ttt, args.seed_data, args.model]
        prov = stage_provenance("prepare", "it0", params, PARAMS, outs)
        art.write_table(out.heldout, args.heldout, art.PROMPTS, prov)
        art.write_table(out.ttt, args.ttt, art.PROMPTS, prov)
        art.write_table(out.seed_sft, args.seed_data, art.SFT, prov)
        art.write_table(art.empty_table(art.JUDGMENTS), args.judgments, art.JUDGMENTS, prov)
        art.write_json(out.log.summary(), args.metrics)
        with art.atomic_path(args.curriculum) as tmp:
            tmp.write_text(initial_state(out.categories).to_json(), encoding="utf-8")
        if out.base_record is not None:  # it0 (and it1's reference) is the pretrained base as it is
            write_base_record(out.base_record, args.model, prov)
            write_base_record(out.base_record, args.init_model, prov)
        else:
            save_model(out.model, out.tokenizer, args.model, prov)
            save_model(out.init_model, out.tokenizer, args.init_model, prov)

    run_stage("prepare", _args, body, argv, reads=PARAMS)


if __name__ == "__main__":
    main()
