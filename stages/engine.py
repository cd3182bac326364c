"""Stage `engine`: the iteration's model made ready for the inference engine, once per iteration.

With `sample.backend` ct2 (or `auto` on a CPU where CTranslate2 is installed) the model, merged
with its adapters, is converted into CTranslate2's format here, and every stage that samples or
evaluates this model loads the conversion (self_improve/engines/ct2.py) instead of converting again. For
vLLM the model is merged with its adapters once into `hf/` (a plain HF dir, what vLLM and
`vllm serve` load); for hf there is nothing to prepare: the directory only records the engine.
With `auto`, a model the converter does not know falls back to hf (recorded with the reason);
with `ct2` it is an error naming the architecture.
"""

from __future__ import annotations

import argparse
import json
import logging

from self_improve import artifacts as art
from self_improve.config import Params
from self_improve.engines.engine import prepare
from self_improve.stage import BASE, ITERATION, Arg, Declaration, Run, run_stage, stage_provenance

log = logging.getLogger(__name__)


# the params keys this stage reads: dvc.yaml's params for it, and its provenance
PARAMS = ("model", "sample.backend", "security")


DECLARATION = Declaration(
    args=(
        ITERATION,
        Arg("--model", "in", "the iteration's model", required=True),
        BASE,
        Arg("--out", "out", "the engine dir (engine.json, and the converted model)", required=True),
    ),
    params=PARAMS,
    runs=(
        Run("engine_base", {"--iteration": "it0", "--model": "data/it0/model", "--base": "data/it0/model",
                            "--out": "data/it0/engine"},
            note="it0's model made ready for the inference engine (the CTranslate2 conversion)"),
        Run("engine", {"--iteration": "${key}", "--model": "data/${key}/model", "--base": "data/it0/model",
                       "--out": "data/${key}/engine"}, foreach="${loop}",
            note="each iteration's model converted once, for every stage that samples or evaluates it"),
    ),
)


def main(argv: list[str] | None = None) -> None:
    def body(args: argparse.Namespace, params: Params) -> None:
        if args.iteration != "it0":
            params.iteration_index(args.iteration)
        prov = stage_provenance("engine", args.iteration, params, PARAMS, [args.out])
        prov["params"]["sample"] = {"backend": params.sample.backend}  # the one sample key it reads
        with art.atomic_path(args.out, is_dir=True) as tmp:
            record = prepare(params.sample.backend, args.model, args.base, tmp, params.security, params.model)
            (tmp / "provenance.json").write_text(json.dumps(prov, indent=2, sort_keys=True) + "\n")
        log.info("%s: %s", args.out, record)

    run_stage("engine", DECLARATION.add_args, body, argv, reads=PARAMS)


if __name__ == "__main__":
    main()
