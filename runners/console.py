"""`self-improve`: one command for the product's runners (the make targets call it).

    self-improve seeds --name dpo --seeds 0 1 2 -S train.algorithm=dpo    # a variant over seeds
    self-improve seeds --variants configs/variants.yaml --seeds 0 1 2      # every README comparison
    self-improve seeds --recipe smollm2-gym scpo --name scpo --out DIR     # a setup and a rule over seeds
    self-improve table --out reports/seeds                                 # the tables from kept results
    self-improve recipe smollm2-gym scpo -S seed=1                         # -S arguments for dvc exp run
    self-improve exp smollm2-gym scpo -S seed=1 -n gym-scpo-s1             # run them: dvc exp run, quoted for you
    self-improve plain WORKDIR                                             # the stages without DVC
    self-improve flow [REPO]                                               # the loop as a Prefect flow
    self-improve export --iteration it2 --out exported/it2                 # an iteration as an HF directory

Each subcommand takes the arguments of the module it runs (`self-improve seeds --help`).
"""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module with main(argv), what it does)
COMMANDS = {
    "seeds": ("runners.experiments", "a variant (or a file of variants) over seeds as DVC experiments, mean +- sd"),
    "table": ("runners.experiments", "rebuild the seeds tables and plot from kept results (--out DIR)"),
    "arms": ("runners.arms", "per-category and control-arm tables of a directory of kept results"),
    "recipe": ("self_improve.recipes", "print recipes (configs/recipes/, configs/rules/) as -S arguments"),
    "exp": ("self_improve.recipes", "run recipes as one DVC experiment (dvc exp run with their -S arguments)"),
    "plain": ("runners.plain", "run the loop's stages in a work directory without DVC"),
    "flow": ("flows.loop", "run the loop as a Prefect flow (one task per stage, DVC's cache)"),
    "deploy": ("flows.deploy", "deploy the loop to a Prefect work pool"),
    "serve": ("flows.serve", "serve the loop as a deployment for the Prefect UI"),
    "export": ("self_improve.models.export", "an iteration's model as a standalone HF directory"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {what}" for name, (_, what) in COMMANDS.items())
    return f"usage: self-improve COMMAND [ARGS...]\n\ncommands:\n{rows}\n\n`self-improve COMMAND --help` for its arguments"


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        raise SystemExit(f"self-improve: unknown command {name!r}\n\n{usage()}")
    module = importlib.import_module(COMMANDS[name][0])
    sys.argv = [f"self-improve {name}", *rest]  # argparse's prog
    if name == "table":
        rest = ["--table", *rest]
    if name == "flow":
        module.self_improve_loop(rest[0] if rest else ".")
        return
    if name == "exp":
        module.exp_main(rest)
        return
    module.main(rest)


if __name__ == "__main__":
    main()
