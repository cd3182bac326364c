"""Stage `prepare`: the task's evaluation sets and the base model (iteration 0).

The logic: self_improve/preparation.py."""

from __future__ import annotations

import argparse
import logging

from self_improve import artifacts as art
from self_improve.config import Params
from self_improve.curriculum import initial_state
from self_improve.models.loading import (
    save_model,
    set_threads,
    write_base_record,
)
from self_improve.preparation import prepare
from self_improve.stage import Arg, Declaration, Run, run_stage, stage_provenance

log = logging.getLogger(__name__)

# the params keys this stage reads: dvc.yaml's params for it, and its provenance
PARAMS = ("seed", "model", "task", "prepare", "security")


DECLARATION = Declaration(
    args=(
        Arg("--heldout", "out", "held-out eval set (parquet)", required=True),
        Arg("--ttt", "out", "test-time eval set (parquet)", required=True),
        Arg("--seed-data", "out", "the base model's SFT data (parquet)", required=True),
        Arg("--model", "out", "base model directory", required=True),
        Arg("--init-model", "out", "the base model before its warm-up", required=True),
        Arg("--judgments", "out", "iteration 0's (empty) judgments", required=True),
        Arg("--metrics", "out", "base training metrics (json)", required=True),
        Arg("--curriculum", "out", "the initial curriculum bandit state (json)", required=True),
    ),
    params=PARAMS,
    param_notes={"security": "model.base checks (trust_remote_code, hub downloads)"},
    runs=(Run("prepare", {
        "--heldout": "data/task/heldout.parquet", "--ttt": "data/task/ttt.parquet",
        "--seed-data": "data/task/seed.parquet", "--model": "data/it0/model", "--init-model": "data/init/model",
        "--judgments": "data/it0/judgments.parquet", "--metrics": "data/it0/train_metrics.json",
        "--curriculum": "data/it0/curriculum.json"},
        deps=("${task.prompt_file}",
              "data/inputs  # the input data and the user's task files (task.heldout_file): a changed file reruns prepare",
              "models  # local base models live here (make smollm2): a changed base reruns prepare")),),
)


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

    run_stage("prepare", DECLARATION.add_args, body, argv, reads=PARAMS)


if __name__ == "__main__":
    main()
