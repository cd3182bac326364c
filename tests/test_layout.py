"""The house's shape: the library never imports its users, the product never imports research/, light
stages load no torch, templates ship as package data."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT


def _imported_modules(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
    return out


def test_the_library_never_imports_stages_flows_runners_scripts_or_benchmarks():
    for path in (ROOT / "self_improve").rglob("*.py"):
        users = {m for m in _imported_modules(path)
                 if m.split(".")[0] in ("stages", "flows", "runners", "scripts", "benchmarks")}
        assert not users, f"{path.relative_to(ROOT)} imports {sorted(users)}"


# each package of the product may import only those before it: no import upward
LAYERS = ("self_improve", "stages", "runners", "flows")


def test_no_import_upward_and_no_import_cycle():
    """self_improve/ (the library) < stages/ (one DVC stage each) < runners/ (the stages without Prefect,
    variants over seeds, the console script) < flows/ (Prefect only). A module imports nothing of a
    later layer, and the modules of the product import each other without a cycle."""
    graph: dict[str, set[str]] = {}
    for layer in LAYERS:
        for path in (ROOT / layer).rglob("*.py"):
            rel = path.relative_to(ROOT).with_suffix("")
            name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
            mods = _imported_modules(path) | {f"{name.rsplit('.', 1)[0]}.{m}" for m in _relative(path)}
            graph[name] = {m for m in mods if m.split(".")[0] in LAYERS}
            later = {m for m in graph[name] if LAYERS.index(m.split(".")[0]) > LAYERS.index(layer)}
            assert not later, f"{path.relative_to(ROOT)} imports {sorted(later)}, of a later layer"
    known = set(graph)

    def target(m: str) -> str | None:  # a module, or the package whose __init__ it names
        while m and m not in known:
            m = m.rpartition(".")[0]
        return m or None

    edges = {a: {t for m in ms if (t := target(m)) and t != a} for a, ms in graph.items()}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(nxt):] + [node, nxt]
                                                                    if nxt in path else path + [node, nxt]))
            if nxt not in state:
                visit(nxt, path + [node])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [])


def _relative(path: Path) -> set[str]:
    """The modules a file imports relatively (`from .loop import x`: `loop`)."""
    return {node.module for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module}


def test_flows_holds_the_prefect_flows_only():
    """Every module of flows/ is a Prefect flow or its serving and deploying: it imports prefect."""
    for path in (ROOT / "flows").glob("*.py"):
        if path.name != "__init__.py":
            assert any(m.split(".")[0] == "prefect" for m in _imported_modules(path)), path.name


def test_nothing_in_the_product_imports_research():
    """research/ holds analyses and kept runs: self_improve/, stages/, runners/ and flows/ never lean on it."""
    for folder in ("self_improve", "stages", "runners", "flows"):
        for path in (ROOT / folder).rglob("*.py"):
            found = {m for m in _imported_modules(path) if m.split(".")[0] == "research"}
            assert not found, f"{path.relative_to(ROOT)} imports {sorted(found)}"


def test_scripts_holds_build_tools_only():
    """scripts/ builds the repository (generated docs, the pipeline files and their code deps, the install's
    lock, the real model's weights, the CoMAS pipeline file): the runners live in runners/, the analyses in
    research/."""
    assert sorted(p.stem for p in (ROOT / "scripts").glob("*.py")) == [
        "__init__", "comas_pipeline", "deps", "docs", "lock", "pipeline", "smollm2"]


def test_the_console_script_reaches_every_runner():
    from runners.console import COMMANDS, usage

    out = subprocess.run([sys.executable, "-m", "runners.console", "--help"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == usage().strip()
    for name, (module, _) in COMMANDS.items():
        assert name in out and module.split(".")[0] in ("flows", "runners", "self_improve"), name
    bad = subprocess.run([sys.executable, "-m", "runners.console", "nope"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode != 0 and "unknown command 'nope'" in bad.stderr


def test_flows_scripts_and_benchmarks_use_the_library_not_the_stages_internals():
    for folder in ("flows", "runners", "scripts", "benchmarks"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text()
            assert "stages.lib" not in text, path
            assert not {m for m in _imported_modules(path) if m.startswith("stages")}, path


@pytest.mark.parametrize("stage", ["check_params", "judge", "pairs", "evolve", "bstar", "report"])
def test_light_stages_import_no_torch(stage):
    """judge (vote judges), pairs, evolve, bstar (off), report and check_params start in a fraction of a second: torch
    is imported only where a model runs (inside the functions that run one)."""
    probe = f"import sys, stages.{stage}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_every_template_ships_as_package_data_and_resolves_from_anywhere(tmp_path, monkeypatch):
    from self_improve import templates

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = globs["self_improve.templates"]
    folder = ROOT / "self_improve" / "templates"
    for path in folder.glob("*.txt"):
        assert any(path.match(g) for g in shipped), path.name
    monkeypatch.chdir(tmp_path)  # no source tree here: the packaged copy
    got = templates.resolve("self_improve/templates/judge_rubric.txt")
    assert got.read_text() == (folder / "judge_rubric.txt").read_text()
    own = tmp_path / "mine.txt"
    own.write_text("{instruction} {response}")
    assert templates.resolve(str(own)) == own  # the user's own file wins


def test_the_lock_answers_to_pyprojects_dependencies():
    """requirements.lock (make install's constraints) was made for the dependencies pyproject.toml
    lists now; `make lock` makes it again after a change (CI's `make lock-check` also compares it with
    what was installed)."""
    from scripts.lock import HEADER, LOCK, pyproject_digest

    first = LOCK.read_text(encoding="utf-8").splitlines()[0]
    assert first == HEADER + pyproject_digest(), "requirements.lock is stale: run make lock"
    pins = [line for line in LOCK.read_text(encoding="utf-8").splitlines() if line and not line.startswith("#")]
    assert all("==" in p and "+" not in p for p in pins)
    assert any(p.startswith("torch==") for p in pins) and any(p.startswith("dvc==") for p in pins)


def test_functions_a_reader_can_hold():
    """No function of the product, the build tools or the benchmarks runs past 70 lines, its signature
    and docstring included (research/ and tests/ aside): a long body is split into named steps."""
    long = []
    for folder in ("self_improve", "stages", "runners", "flows", "scripts", "benchmarks"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > 70:
                        long.append(f"{path.relative_to(ROOT)}:{node.name} ({lines} lines)")
    assert not long, long
