"""dvc.yaml's deps name every module a stage imports, so a code change reruns the right stages."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
import yaml

from .conftest import ROOT, defines_something

PACKAGES = ("self_improve", "stages")


def _module_file(name: str) -> Path | None:
    """The repo file of a dotted module name (a module or a package's __init__.py), None outside the repo."""
    if name.split(".")[0] not in PACKAGES:
        return None
    base = ROOT.joinpath(*name.split("."))
    for target in (base.with_suffix(".py"), base / "__init__.py"):
        if target.is_file():
            return target
    return None


def _imported_names(mod: Path, node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        package = mod.parent.relative_to(ROOT).parts
        package = package[: len(package) - (node.level - 1)]
        prefix = ".".join(package + ((node.module,) if node.module else ()))
    else:
        prefix = node.module
    return [prefix] + [f"{prefix}.{a.name}" for a in node.names]


def _imports(path: Path) -> set[str]:
    """Repo modules (as paths) that `path` imports, directly or through other repo modules, with the
    packages above each (importing a module runs its packages' __init__.py first)."""
    seen: set[str] = set()
    todo = [path]
    while todo:
        mod = todo.pop()
        for node in ast.walk(ast.parse(mod.read_text())):
            for name in _imported_names(mod, node):
                parts = name.split(".")
                for i in range(1, len(parts) + 1):
                    target = _module_file(".".join(parts[:i]))
                    if target is None or not defines_something(target):
                        continue
                    rel = str(target.relative_to(ROOT))
                    if rel not in seen:
                        seen.add(rel)
                        todo.append(target)
    return seen


def _covered(path: str, deps: set[str]) -> bool:
    """A file is declared by itself or by a folder that holds it."""
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in deps)


PIPELINES = ("dvc.yaml", "configs/pipelines/comas.dvc.yaml")  # the loop, and CoMAS's (installed as comas/dvc.yaml)


def _stages() -> dict:
    """Every stage of every pipeline file (comas/dvc.yaml's run from the repo root: wdir ..)."""
    out = {}
    for name in PIPELINES:
        for stage, spec in yaml.safe_load((ROOT / name).read_text())["stages"].items():
            if name != "dvc.yaml":
                assert spec.get("do", spec).get("wdir") == "..", f"{name}:{stage}: paths are the repo root's"
            out[stage if name == "dvc.yaml" else f"{name}:{stage}"] = spec
    return out


def test_every_stage_depends_on_the_modules_it_imports():
    stages = _stages()
    for name, spec in stages.items():
        spec = spec.get("do", spec)
        module = spec["cmd"].split()[2]
        path = ROOT.joinpath(*module.split(".")).with_suffix(".py")
        deps = set(spec["deps"])
        assert str(path.relative_to(ROOT)) in deps, name
        missing = {m for m in _imports(path) if not _covered(m, deps)}
        assert not missing, f"{name}: dvc.yaml deps lack {sorted(missing)}"


def test_every_stage_depends_on_the_module_that_pins_the_cpu_kernels():
    """self_improve/cpu.py runs before any stage module (stages/__init__.py imports the library) and
    picks the kernels torch uses: a change to it changes outputs, so every stage declares it."""
    stages = _stages()
    for name, spec in stages.items():
        deps = spec.get("do", spec)["deps"]
        assert {"stages/__init__.py", "self_improve/__init__.py", "self_improve/cpu.py"} <= set(deps), name


def _declared(module: str, stage: str) -> tuple[str, ...]:
    mod = importlib.import_module(module)
    if stage == "evaluate_base":
        return mod.BASE_PARAMS
    return mod.PARAMS


def test_each_stage_declares_the_params_dvc_yaml_gives_it():
    """One declaration per stage (its module's PARAMS): dvc.yaml's params list is the same set, so a
    change to a key the stage reads reruns it, and a key it does not read does not."""
    stages = _stages()
    for name, spec in stages.items():
        spec = spec.get("do", spec)
        module = spec["cmd"].split()[2]
        if module == "stages.check_params":  # reads the whole file, declared as a file dep
            assert "params.yaml" in spec["deps"]
            continue
        assert sorted(_declared(module, name)) == sorted(spec.get("params", [])), name


def test_a_stage_that_reads_an_undeclared_key_stops_naming_it(tmp_path, capsys):
    """A stage sees only its declared keys: reading another one stops it (exit 2) with the key named,
    and its provenance records exactly the declared keys."""
    from self_improve.cli import run_stage, stage_provenance
    from self_improve.config import SampleConfig

    from .conftest import tiny_full

    raw = tiny_full()
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump(raw))
    seen = {}

    def body(args, params):
        seen["k"] = params.sample.k  # declared through its section
        seen["is_sample_config"] = isinstance(params.sample, SampleConfig)
        seen["index"] = params.iteration_index("it1")  # a method runs on the params themselves
        seen["prov"] = stage_provenance("probe", "it1", params, None, [])["params"]
        seen["lr"] = params.train.lr  # not declared

    with pytest.raises(SystemExit) as exit_:
        run_stage("probe", lambda p: None, body, ["--params", str(params_file)], reads=("seed", "sample.k"))
    assert exit_.value.code == 2
    assert "read params key train, which it does not declare" in capsys.readouterr().err
    assert seen == {"k": raw["sample"]["k"], "is_sample_config": True, "index": 1,
                    "prov": {"seed": raw["seed"], "sample.k": raw["sample"]["k"]}}


def test_no_stage_depends_on_library_modules_it_does_not_import():
    """The other way round: a library module a stage never imports is not its dep, so an edit to it
    reruns nothing it cannot change."""
    stages = _stages()
    for name, spec in stages.items():
        spec = spec.get("do", spec)
        path = ROOT.joinpath(*spec["cmd"].split()[2].split(".")).with_suffix(".py")
        imported = _imports(path)
        extra = [d for d in spec["deps"] if d.startswith("self_improve/") and d.endswith(".py") and d not in imported]
        assert not extra, f"{name}: dvc.yaml deps name {extra}, which it does not import"
