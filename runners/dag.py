"""The stages of dvc.yaml in dependency order, iterations unrolled from params.yaml `loop`.

Read from the two files only (no Prefect, no stage code), so the flow, the tests and the
benchmarks agree with DVC on what runs and in which order.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

STEPS = ("evolve", "bstar", "sample", "judge", "pairs", "train", "engine", "evaluate")


def _loop(repo: Path) -> dict:
    """params.yaml's iterations in their number's order (as the params' check reads them)."""
    loop = yaml.safe_load((repo / "params.yaml").read_text(encoding="utf-8")).get("loop") or {}
    return dict(sorted(loop.items(), key=lambda kv: int(kv[0][2:]) if str(kv[0])[2:].isdigit() else 0))


def stage_order(repo: Path) -> list[str]:
    """DVC stage names in dependency order, e.g. check_params, prepare, engine_base, evaluate_base,
    evolve@it1, bstar@it1, ..., report."""
    return ["check_params", "prepare", "engine_base", "evaluate_base"] + [f"{s}@{it}" for it in _loop(repo) for s in STEPS] + ["report"]


def stage_commands(repo: Path) -> list[tuple[str, list[str]]]:
    """(stage name, argv) for every stage in order, with `${key}` / `${item.prev}` / `${item.ref}` filled in."""
    return [(s.name, s.argv) for s in stage_specs(repo)]


@dataclass(frozen=True)
class Stage:
    """One stage of dvc.yaml as it runs: its command, and what DVC reads (deps: paths; params: params.yaml
    keys) and writes (outs, metrics and plots: paths), `${...}` filled in."""

    name: str
    argv: list[str]
    deps: tuple[str, ...]
    params: tuple[str, ...]
    outs: tuple[str, ...]


def param(params: dict, key: str):
    """The value of a dotted params.yaml key (`judge.frozen`), None where it is absent."""
    value = params
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _paths(entries) -> tuple[str, ...]:
    """dvc.yaml's list of paths, each a string or `{path: options}`."""
    return tuple(p for e in entries or () for p in (e if isinstance(e, dict) else [e]))


def stage_specs(repo: Path) -> list[Stage]:
    """Every stage in order, its command, deps, params and outputs with `${key}` / `${item.prev}` /
    `${item.ref}` and params interpolations (`${task.prompt_file}`) filled in, as DVC fills them."""
    spec = yaml.safe_load((repo / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    params = yaml.safe_load((repo / "params.yaml").read_text(encoding="utf-8")) or {}
    loop = _loop(repo)
    out = []
    for name in stage_order(repo):
        stage, _, it = name.partition("@")
        body = spec[stage]["do"] if it else spec[stage]

        def fill(text: str) -> str:
            if it:
                text = text.replace("${key}", it)
                text = text.replace("${item.prev}", loop[it]["prev"]).replace("${item.ref}", loop[it]["ref"])
            return re.sub(r"\$\{([\w.]+)\}", lambda m: str(param(params, m.group(1))), text)

        outs = _paths(body.get("outs")) + _paths(body.get("metrics")) + _paths(body.get("plots"))
        out.append(Stage(name, shlex.split(fill(body["cmd"])), tuple(fill(d) for d in _paths(body.get("deps"))),
                         tuple(body.get("params") or ()), tuple(fill(o) for o in outs)))
    return out


# the stages that make and evaluate it0, nothing trained (research/base_screen.py runs only these)
BASE_STAGES = ("check_params", "prepare", "engine_base", "evaluate_base")

# CoMAS (comas/dvc.yaml, installed from its template): the loop's stages it reads, then its own,
# iterations from `agents.loop`
COMAS_FILE = "comas/dvc.yaml"
COMAS_TEMPLATE = "configs/pipelines/comas.dvc.yaml"
COMAS_BASE = BASE_STAGES  # ../dvc.yaml stages it reads
COMAS_STEPS = ("comas_discuss", "comas_train", "comas_evaluate")


def _agents_loop(repo: Path) -> dict:
    return (yaml.safe_load((repo / "params.yaml").read_text(encoding="utf-8")).get("agents") or {}).get("loop") or {}


def install_comas(repo: Path) -> Path:
    """comas/dvc.yaml written from the template (opt-in: DVC's pull, checkout and `exp apply` stop
    on a pipeline that never ran); an installed copy that differs is the user's, kept as it is."""
    target, template = repo / COMAS_FILE, (repo / COMAS_TEMPLATE).read_text(encoding="utf-8")
    if target.is_file():
        if target.read_text(encoding="utf-8") != template:
            print(f"{target} differs from {COMAS_TEMPLATE}: kept as it is", file=sys.stderr)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(template, encoding="utf-8")
    return target


def _comas_spec(repo: Path) -> dict:
    installed = repo / COMAS_FILE
    path = installed if installed.is_file() else repo / COMAS_TEMPLATE
    return yaml.safe_load(path.read_text(encoding="utf-8"))["stages"]


def comas_order(repo: Path) -> list[str]:
    """DVC stage names of a CoMAS run in dependency order: the loop's base stages, then
    comas/dvc.yaml:comas_init, comas/dvc.yaml:comas_discuss@it1, ..., comas/dvc.yaml:comas_report."""
    own = ["comas_init"] + [f"{s}@{it}" for it in _agents_loop(repo) for s in COMAS_STEPS] + ["comas_report"]
    return list(COMAS_BASE) + [f"{COMAS_FILE}:{name}" for name in own]


def comas_commands(repo: Path) -> list[tuple[str, list[str]]]:
    """(stage name, argv) of every stage of a CoMAS run, in order, `${key}` / `${item.prev}` filled in."""
    root = dict(stage_commands(repo))
    spec = _comas_spec(repo)
    agents = _agents_loop(repo)
    out = []
    for name in comas_order(repo):
        if name in root:
            out.append((name, root[name]))
            continue
        stage, _, it = name.removeprefix(f"{COMAS_FILE}:").partition("@")
        if it:
            cmd = spec[stage]["do"]["cmd"].replace("${key}", it).replace("${item.prev}", agents[it]["prev"])
        else:
            cmd = spec[stage]["cmd"]
        out.append((name, shlex.split(cmd)))
    return out
