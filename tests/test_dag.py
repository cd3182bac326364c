"""dvc.yaml is written from the stages' declarations, and its deps name every module a stage imports, so a
code change reruns the right stages."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
import yaml

from scripts import deps as code_deps
from scripts import pipeline

from .conftest import ROOT

_imports = code_deps.imports  # the import closure the code deps are generated from (scripts/deps.py)


def _covered(path: str, deps: set[str]) -> bool:
    """A file is declared by itself or by a folder that holds it."""
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in deps)


PIPELINES = tuple(pipeline.PIPELINES)  # the loop, and CoMAS's (installed as comas/dvc.yaml)


def _stages() -> dict:
    """Every stage of every pipeline file (comas/dvc.yaml's run from the repo root: wdir ..)."""
    out = {}
    for name in PIPELINES:
        for stage, spec in yaml.safe_load((ROOT / name).read_text())["stages"].items():
            if name != "dvc.yaml":
                assert spec.get("do", spec).get("wdir") == "..", f"{name}:{stage}: paths are the repo root's"
            out[stage if name == "dvc.yaml" else f"{name}:{stage}"] = spec
    return out


def test_the_pipeline_files_are_the_generated_ones():
    """dvc.yaml and CoMAS's pipeline are written by `python -m scripts.pipeline` from each stage's
    DECLARATION and its imports: a declaration or an import changed and not regenerated fails here."""
    assert pipeline.stale(ROOT) == [], "run `python -m scripts.pipeline`"
    out = subprocess.run([sys.executable, "-m", "scripts.pipeline", "--check"], cwd=ROOT, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr


def test_a_stage_is_declared_once_for_its_parser_and_its_pipeline_stages():
    """A stage's argument parser and its dvc.yaml commands come from one declaration: every argument a
    pipeline stage passes is one the parser takes, every required one is passed, and each path it reads
    is a dep and each it writes an output of that stage."""
    import argparse

    stages = _stages()
    for name, (module, decl, run) in pipeline.declarations(ROOT).items():
        parser = argparse.ArgumentParser()
        decl.add_args(parser)
        flags = {a.option_strings[0]: a for a in parser._actions if a.option_strings}  # noqa: SLF001
        assert set(run.args) <= set(flags), name
        assert {f for f, a in flags.items() if a.required} <= set(run.args), name
        parser.parse_args([w for f, v in run.args.items() for w in (f, v)])
        spec = stages[name if name in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
                      else f"configs/pipelines/comas.dvc.yaml:{name}"]
        spec = spec.get("do", spec)
        written = {next(iter(o)) if isinstance(o, dict) else o
                   for key in ("outs", "metrics", "plots") for o in spec.get(key, [])}
        for flag, value in run.args.items():
            role = decl.arg(flag).role
            if role == "in":
                assert value in spec["deps"], (name, flag)
            elif role in ("out", "metric", "plot"):
                assert value in written, (name, flag)
        assert f"python -m {module} " in spec["cmd"] + " ", name


def test_a_pipeline_stage_no_module_declares_is_refused(monkeypatch):
    text = pipeline.render("dvc.yaml", ROOT)
    assert text == (ROOT / "dvc.yaml").read_text()
    monkeypatch.setitem(pipeline.PIPELINES, "dvc.yaml",
                        (pipeline.LOOP_HEADER, ("check_params", "no_such_stage"), ""))
    with pytest.raises(ValueError, match="no stage module declares no_such_stage"):
        pipeline.render("dvc.yaml", ROOT)


def test_a_table_entry_named_as_a_string_is_a_dep_of_the_stages_that_run_it():
    """The engine stage reaches CTranslate2's conversion only through the engine table's
    "module:function" names: an edit to it still reruns the engine stages, and not the prepare stage."""
    refs = code_deps.table_refs(ROOT / "self_improve/config/engines.py")
    assert "self_improve.engines.ct2" in refs and "self_improve.engines.sampler" in refs
    assert "self_improve/engines/ct2.py" in code_deps.code_deps("stages.engine", ROOT)
    assert "self_improve/engines/ct2.py" not in code_deps.code_deps("stages.prepare", ROOT)


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
    from self_improve.stage import run_stage, stage_provenance
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
