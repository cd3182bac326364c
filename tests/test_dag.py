"""dvc.yaml's deps name every module a stage imports, so a code change reruns the right stages."""

from __future__ import annotations

import ast
from pathlib import Path

import yaml

from .conftest import ROOT


def _imports(path: Path) -> set[str]:
    """Repo modules (as paths) that `path` imports, directly or through other repo modules."""
    seen: set[str] = set()
    todo = [path]
    while todo:
        mod = todo.pop()
        for node in ast.walk(ast.parse(mod.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = mod.parent
                for _ in range(node.level - 1):
                    base = base.parent
                names = [node.module] if node.module else []
                names += [f"{node.module}.{a.name}" if node.module else a.name for a in node.names]
                for name in names:
                    target = base.joinpath(*name.split(".")).with_suffix(".py")
                    if not target.is_file():  # a package
                        target = base.joinpath(*name.split("."), "__init__.py")
                    if not target.is_file() or not target.read_text().strip():
                        continue
                    rel = str(target.relative_to(ROOT))
                    if rel not in seen:
                        seen.add(rel)
                        todo.append(target)
    return seen


def _covered(path: str, deps: set[str]) -> bool:
    """A file is declared by itself or by a folder that holds it."""
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in deps)


def test_every_stage_depends_on_the_modules_it_imports():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    for name, spec in stages.items():
        spec = spec.get("do", spec)
        module = spec["cmd"].split()[2]
        path = ROOT.joinpath(*module.split(".")).with_suffix(".py")
        deps = set(spec["deps"])
        assert str(path.relative_to(ROOT)) in deps, name
        missing = {m for m in _imports(path) if not _covered(m, deps)}
        assert not missing, f"{name}: dvc.yaml deps lack {sorted(missing)}"


def test_every_stage_depends_on_the_package_that_pins_the_cpu_kernels():
    """stages/__init__.py runs before any stage module and picks the kernels torch uses: a change to
    it changes outputs, so every stage declares it."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    for name, spec in stages.items():
        assert "stages/__init__.py" in spec.get("do", spec)["deps"], name
