"""dvc.yaml and CoMAS's pipeline, written from the stages' declarations.

    python -m scripts.pipeline            # write dvc.yaml and configs/pipelines/comas.dvc.yaml
    python -m scripts.pipeline --check    # exit 1, naming the files, when one is stale (tests/test_dag.py)

Each stage module declares its arguments (what it reads and writes), the params keys it reads and
the pipeline stages that run it (`DECLARATION`, self_improve/stage.py); its argument parser is built
from the same declaration. A pipeline stage's command line is its module and the value of each
argument; its deps are data/params.ok, its code (scripts/deps.py: the modules it imports), the paths
it reads and any other files it declares; its outs, metrics and plots are the paths it writes.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import textwrap
from pathlib import Path

from scripts.deps import NOTES, ROOT, code_deps
from self_improve.stage import Declaration, Run

WIDTH = 110  # a line's characters after its indent
PARAMS_OK = "data/params.ok"

LOOP_HEADER = """\
# The only DAG: written by `python -m scripts.pipeline` from each stage's DECLARATION (stages/*.py); edit
# those, not this file (a test fails when it is stale). Every path lives here; stages get them as arguments.
# data/it0/model is the base: the tiny model's weights, or the record of a pretrained model.base;
# with LoRA every later data/itN/model is an adapter chain applied to it (--base).
# Iterations are unrolled from params.yaml `loop` (DVC has no cycles): stage@itN reads itN's
# predecessor through ${item.prev}. Adding an iteration: add it to `loop` (recipes: configs/recipes/long.yaml).
# The code deps (stages/, self_improve/) are each stage's imports (scripts/deps.py).
"""

LOOP_FOOTER = """
# `dvc plots show` / `dvc plots diff`: the same curves as reports/figures, across iterations.
plots:
  - accuracy:
      template: linear
      x: step
      y:
        reports/iterations.csv: [accuracy, maj_accuracy, ttt_accuracy]
  - judge:
      template: linear
      x: step
      y:
        reports/iterations.csv: [judge_accuracy, judge_auc, label_accuracy, sample_accuracy]
  - reward:
      template: linear
      x: step
      y:
        reports/iterations.csv: [reward_mean]
  - pairs:
      template: linear
      x: step
      y:
        reports/iterations.csv: [num_pairs, num_sft]
  - reports/figures/categories.png  # the task's own categories, drawn by the report
  - length:
      template: linear
      x: step
      y:
        reports/iterations.csv: [response_length]
"""

COMAS_HEADER = """\
# CoMAS (arXiv 2510.08529) as its own DAG, installed as comas/dvc.yaml by `python -m
# scripts.comas_pipeline` (`make loop-comas` does it), then run with `dvc repro comas/dvc.yaml`. It is
# opt-in: DVC's `dvc pull`, `dvc checkout` and `dvc exp apply` stop on a pipeline that never ran, so a
# repo carries comas/dvc.yaml only once it runs CoMAS (commit it with its comas/dvc.lock). Agents on
# one chat base solve, evaluate and score each other; each trains on its own interactions. It reads
# the loop's base model and problem sets (prepare, evaluate_base in ../dvc.yaml) and params.yaml
# `agents`; `dvc repro` alone never runs it. Iterations are unrolled from `agents.loop`. Every path
# is relative to the repo root (wdir: ..). Written by `python -m scripts.pipeline` from the comas_*
# stages' DECLARATION.
vars:
  - ../params.yaml
"""

# each pipeline file: its header, its stages in order, and what follows them
PIPELINES = {
    "dvc.yaml": (LOOP_HEADER, ("check_params", "prepare", "engine_base", "evaluate_base", "evolve", "bstar",
                               "sample", "judge", "pairs", "train", "engine", "evaluate", "report"), LOOP_FOOTER),
    "configs/pipelines/comas.dvc.yaml": (COMAS_HEADER, ("comas_init", "comas_discuss", "comas_train",
                                                         "comas_evaluate", "comas_report"), ""),
}


def declarations(root: Path = ROOT) -> dict[str, tuple[str, Declaration, Run]]:
    """{pipeline stage name: (module, its declaration, the run)} over every stage module."""
    out = {}
    for path in sorted((root / "stages").glob("*.py")):
        module = f"stages.{path.stem}"
        decl = getattr(importlib.import_module(module), "DECLARATION", None)
        for run in decl.runs if decl else ():
            if run.name in out:
                raise ValueError(f"pipeline stage {run.name} declared by {out[run.name][0]} and {module}")
            out[run.name] = (module, decl, run)
    return out


def _item(path: str, note: str = "") -> str:
    return f"- {path}  # {note}" if note else f"- {path}"


def _split(entry: str) -> tuple[str, str]:
    path, _, note = entry.partition("  # ")
    return path, note


def _cmd(module: str, run: Run) -> list[str]:
    words = [f"python -m {module}"] + [f"{flag} {value}" for flag, value in run.args.items()]
    one = " ".join(words)
    if len("cmd: ") + len(one) <= WIDTH:
        return [f"cmd: {one}"]
    lines, line = [], ""
    for word in words:
        if line and len(line) + 1 + len(word) > WIDTH:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return ["cmd: >-"] + [f"  {x}" for x in lines + [line]]


def _deps(module: str, decl: Declaration, run: Run) -> list[str]:
    seen: set[str] = set()
    out = []

    def add(path: str, note: str = "") -> None:
        if path not in seen:
            seen.add(path)
            out.append(_item(path, note))

    writes = {v for f, v in run.args.items() if decl.arg(f).role not in ("in", "value", "switch")}
    if PARAMS_OK not in writes:
        add(PARAMS_OK, "check_params ran first")
    for dep in code_deps(module):
        add(dep, NOTES.get(dep, ""))
    for flag, value in run.args.items():
        arg = decl.arg(flag)
        if arg.role == "in":
            add(value, arg.note)
    for entry in run.deps:
        add(*_split(entry))
    return out


def _outputs(decl: Declaration, run: Run, role: str) -> list[str]:
    out = []
    for flag, value in run.args.items():
        arg = decl.arg(flag)
        if arg.role != role:
            continue
        options = ([] if arg.cache else ["cache: false"]) + (["persist: true"] if arg.persist else [])
        if options:
            out.append(f"- {value}:" + (f"  # {arg.note}" if arg.note else ""))
            out += [f"    {o}" for o in options]
        else:
            out.append(_item(value, arg.note))
    return out


def stage_text(name: str, module: str, decl: Declaration, run: Run) -> str:
    """The pipeline file's lines for one stage (at the indent of `stages:`'s entries)."""
    head = f"  {name}:"
    if run.note and len(head) + 4 + len(run.note) <= WIDTH + 2:
        lines = [f"{head}  # {run.note}"]
    else:
        lines = [head] + [f"    # {x}" for x in textwrap.wrap(run.note, WIDTH - 4)]
    indent = "    "
    if run.foreach:
        lines += [f"    foreach: {run.foreach}", "    do:"]
        indent = "      "
    body = ([f"wdir: {run.wdir}"] if run.wdir else []) + _cmd(module, run)
    body += ["deps:"] + [f"  {x}" for x in _deps(module, decl, run)]
    params = run.params if run.params is not None else decl.params
    if params:
        body += ["params:"] + [f"  {_item(k, decl.param_notes.get(k, ''))}" for k in params]
    for section, role in (("outs", "out"), ("metrics", "metric"), ("plots", "plot")):
        if entries := _outputs(decl, run, role):
            body += [f"{section}:"] + [f"  {x}" for x in entries]
    return "\n".join(lines + [indent + x for x in body])


def render(name: str, root: Path = ROOT) -> str:
    """The text of one pipeline file, from the declarations."""
    header, order, footer = PIPELINES[name]
    found = declarations(root)
    missing = [s for s in order if s not in found]
    if missing:
        raise ValueError(f"{name}: no stage module declares {', '.join(missing)}")
    stages = [stage_text(s, *found[s]) for s in order]
    return header + "stages:\n" + "\n\n".join(stages) + "\n" + footer


def stale(root: Path = ROOT) -> list[str]:
    """The pipeline files that differ from what the declarations give."""
    return [name for name in PIPELINES if render(name, root) != (root / name).read_text()]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m scripts.pipeline", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only say which files are stale (exit 1 if any)")
    args = ap.parse_args(argv)
    if args.check:
        if bad := stale():
            sys.exit(f"stale: {', '.join(bad)}: run `python -m scripts.pipeline`")
        return
    for name in PIPELINES:
        path = ROOT / name
        text = render(name)
        if not path.exists() or path.read_text() != text:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(path)
            print(f"wrote {name}")


if __name__ == "__main__":
    main()
