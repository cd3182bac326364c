"""Stage `comas_init` (comas/dvc.yaml): refuse what CoMAS cannot run on, then write it0's agents.

CoMAS's agents converse through a chat template: the tiny default model (no chat template) or a
pretrained one without a template is refused here, naming `model.base`, before any other stage of
comas/dvc.yaml deletes an output (a bad `agents` value is refused earlier, by check_params, with the
rest of params.yaml). it0's agents are records that each starts as the base model.

The logic: self_improve/agents/."""

from __future__ import annotations

import argparse
from pathlib import Path

from self_improve.agents.roster import write_start
from self_improve.chat import ChatFormat
from self_improve.config import ConfigError, Params
from self_improve.models.base import base_location, read_record
from self_improve.stage import Arg, Declaration, Run, run_stage, stage_provenance

# the params keys this stage reads: comas/dvc.yaml's params for it, and its provenance
PARAMS = ("model", "agents.n", "security")


DECLARATION = Declaration(
    args=(
        Arg("--base", "in", "the base model (it0), as prepare recorded it", required=True),
        Arg("--out", "out", "it0's agents (each one the base model)", required=True),
    ),
    params=PARAMS,
    runs=(Run("comas_init", {"--base": "data/it0/model", "--out": "data/comas/it0/agents"}, wdir="..",
              deps=("models  # local base models live here (make smollm2): the chat template is read there",),
              note="refuses a model without a chat template (model.base) before any stage here runs"),),
)


def main(argv: list[str] | None = None) -> None:
    def body(args: argparse.Namespace, params: Params) -> None:
        if params.model.builtin:
            raise ConfigError("model.base: CoMAS needs a chat model (its agents talk through a chat template) "
                              "and the builtin tiny model has none; set model.base to a chat model, e.g. "
                              "models/smollm2-135m-instruct (make smollm2)")
        where = base_location(read_record(Path(args.base)))
        chat = ChatFormat.from_dir(where, params.security.trust_remote_code)
        if not chat.templated:
            raise ConfigError(f"model.base: {params.model.base} has no chat template; CoMAS needs a chat model")
        write_start(args.out, params.agents.n, stage_provenance("comas_init", "it0", params, PARAMS, [args.out]))

    run_stage("comas_init", DECLARATION.add_args, body, argv, reads=PARAMS)


if __name__ == "__main__":
    main()
