"""`python -m self_improve.models.export`: an iteration's model as a standalone Hugging Face directory.

With LoRA an iteration's directory holds adapters (itN = the base + the adapters of it1..itN),
and it0 of a pretrained base only records where the base lives. Export merges them once into
plain safetensors weights with the tokenizer (and its chat template) and the generation config,
which transformers, vLLM or any HF tool loads without this project:

    python -m self_improve.models.export --iteration it2 --out exported/it2
    python -m self_improve.models.export --iteration recommended --out exported/best   # chosen without labels
    python -m self_improve.models.export --model data/it2/model --base data/it0/model --out exported/it2

`--iteration` reads the model and base paths from dvc.yaml (the train stage's `--out` and the
prepare stage's `--model`), so they are written in one place. `--iteration recommended` takes
the iteration the report recommends from label-free signals only (self_improve/choice.py), read
from the evaluate stages' reports/iterations/. Not a DVC stage: run it when you need the weights.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import yaml

from self_improve.stage import run_stage, stage_provenance
from self_improve.config import Params
from self_improve.errors import ConfigError


def dvc_paths(iteration: str, dvc_yaml: str | Path = "dvc.yaml") -> tuple[str, str]:
    """(model dir of `iteration`, base dir) as dvc.yaml names them."""
    try:
        stages = yaml.safe_load(Path(dvc_yaml).read_text(encoding="utf-8"))["stages"]
    except (OSError, KeyError, TypeError, yaml.YAMLError) as err:
        raise ConfigError(f"{dvc_yaml}: cannot read the stages ({err}); give --model and --base") from None

    def flag(cmd: str, name: str) -> str:
        args = shlex.split(cmd)
        return args[args.index(name) + 1]

    base = flag(stages["prepare"]["cmd"], "--model")
    if iteration == "it0":
        return base, base
    template = flag(stages["train"]["do"]["cmd"], "--out")
    return re.sub(r"\$\{key\}", iteration, template), base


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--iteration", help="itN: take --model and --base from dvc.yaml; recommended: the "
                   "iteration chosen without labels from --iterations")
    p.add_argument("--iterations", default="reports/iterations",
                   help="in: the evaluate stages' <it>/metrics.json, for --iteration recommended")
    p.add_argument("--model", help="in: a model directory of the pipeline (full, base record or adapter chain)")
    p.add_argument("--base", help="in: the base model (it0) that an adapter chain applies to")
    p.add_argument("--out", required=True, help="out: the standalone model directory")


def main(argv: list[str] | None = None) -> None:
    def body(args: argparse.Namespace, params: Params) -> None:
        from self_improve.models.loading import export_merged, set_threads

        if args.iteration == "recommended":
            from self_improve.choice import recommend
            from self_improve.iterations import history, load_iterations

            rec = recommend(history(load_iterations(args.iterations, params)[0]))
            print(f"recommended without labels: {rec['iteration']} ({rec['reason']})")
            args.iteration = rec["iteration"]
        if args.iteration:
            if args.iteration != "it0":
                params.iteration_index(args.iteration)
            model, base = dvc_paths(args.iteration)
            model, base = args.model or model, args.base or base
        elif args.model:
            model, base = args.model, args.base
        else:
            raise ConfigError("export: give --iteration, or --model (and --base for an adapter chain)")
        set_threads()
        prov = stage_provenance("export", args.iteration or "", params, ("model", "security"), [args.out])
        prov.update(exported_from=model, base=base)
        export_merged(model, base, args.out, params.security, params.model, prov)
        print(f"{args.out}: standalone model of {model}")

    run_stage("export", _args, body, argv)


if __name__ == "__main__":
    main()
