"""A finished plain workspace's models evaluated again with other settings (another engine, another
precision), so that runs sampled and evaluated on different engines are set against each other with
one instrument.

    python -m research.reevaluate /tmp/loops/smol-vllm-sec-co_reward-validity_any-s0 --iterations it3 \
        -S sample.backend=ct2 --out research/results/smollm2_v3_fast/vllm-sec-co_reward-validity_any-s0-ct2

The workspace is copied (files hard-linked: every stage writes a new file and renames it over the old
one, so the original is never touched) beside itself as `<workspace>-reeval`, its params.yaml gets the
`-S` overrides, and only the engine and evaluate stages of the named iterations run there
(runners/plain.py `--only`). The iterations' trained models, prompts and pairs are the workspace's own;
only the instrument changes. The result: `<out>/answers.parquet` with every iteration's answers (the
named ones re-evaluated, the others as the workspace had them), which `research.paired_runs` reads,
and `<out>/reevaluated.json` saying which iterations were re-evaluated with which overrides.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import yaml

from runners import plain
from runners.comparison import set_by
from runners.experiments import ANSWERS, keep_answers
from self_improve import recipes


def copy_linked(src: Path, dst: Path) -> None:
    """`src` as `dst`, files hard-linked, symbolic links kept as links; the run's log left out."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, symlinks=True, copy_function=os.link, ignore=shutil.ignore_patterns("run.log"))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("workspace", type=Path, help="a finished plain workspace (research.real_loops --plain DIR)")
    p.add_argument("--iterations", nargs="+", required=True, help="e.g. it3 (it0's evaluate_base is not rerun)")
    p.add_argument("-S", "--set-param", dest="sets", action="append", default=[], help="KEY=VALUE (repeatable)")
    p.add_argument("--out", type=Path, required=True, help="a folder for answers.parquet and reevaluated.json")
    args = p.parse_args(argv)

    src = args.workspace.resolve()
    if not (src / "params.yaml").is_file() or not (src / "dvc.yaml").is_file():
        raise SystemExit(f"{src}: not a plain workspace (no params.yaml or dvc.yaml)")
    if "it0" in args.iterations:
        raise SystemExit("--iterations: it0's evaluate_base draws the base support too; re-evaluate itN only")
    missing = [it for it in args.iterations if not (src / "data" / it / "eval.parquet").is_file()]
    if missing:
        raise SystemExit(f"{src}: {', '.join(missing)} not evaluated there (no data/<it>/eval.parquet)")
    overrides = set_by([x for s in args.sets for x in ("-S", s)])
    work = src.with_name(src.name + "-reeval")
    copy_linked(src, work)
    params = recipes.apply(yaml.safe_load((src / "params.yaml").read_text()), overrides)
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    only = tuple(s for it in args.iterations for s in (f"engine@{it}", f"evaluate@{it}"))
    print(f"+ {work}: {', '.join(only)} with {overrides} (log: {work / 'run.log'})", flush=True)
    rc = plain.launch(work, only=only)
    if rc != 0:
        print(f"failed (exit {rc}), {work / 'run.log'} ends:\n" + plain.log_tail(work), file=sys.stderr)
        raise SystemExit(rc)
    args.out.mkdir(parents=True, exist_ok=True)
    keep_answers(work, args.out / ANSWERS)
    (args.out / "reevaluated.json").write_text(json.dumps(
        {"workspace": str(src), "iterations": args.iterations, "overrides": overrides}, indent=1) + "\n")
    shutil.rmtree(work)
    print(f"wrote {args.out / ANSWERS}", flush=True)


if __name__ == "__main__":
    main()
