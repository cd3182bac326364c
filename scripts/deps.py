"""dvc.yaml's code dependencies, generated from what each stage imports.

    python -m scripts.deps            # rewrite the code deps of dvc.yaml and configs/pipelines/comas.dvc.yaml
    python -m scripts.deps --check    # exit 1, naming the stages, when a file is stale (tests/test_dag.py)

A stage's code deps are its module, the packages above it, and every repository module it imports,
directly or through other repository modules (with the packages above each: importing a module runs
its packages' __init__.py first). A package whose modules are imported through its __init__
(self_improve/config, tasks, judges) is declared as its folder. Only these lines of a stage's
`deps:` are written: data, templates, params.yaml and the model folders stay as the file has them,
comments and all, so an edit to a library module reruns exactly the stages that import it.
"""

from __future__ import annotations

import argparse
import ast
import functools
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("self_improve", "stages")
PIPELINES = ("dvc.yaml", "configs/pipelines/comas.dvc.yaml")  # the loop, and CoMAS's (installed as comas/dvc.yaml)
FOLDERS = ("self_improve/config", "self_improve/tasks", "self_improve/judges")  # declared as a whole
FIRST = ("stages/__init__.py", "self_improve/__init__.py", "self_improve/cpu.py")  # every stage's, in this order
PLUGINS = "plugins"  # the user's modules that params.yaml's `plugins` imports: every stage's
STAGE = re.compile(r"^  ([A-Za-z0-9_@-]+):(\s|$)")  # a stage's first line under `stages:`
# a table's entries name their code as "module:function" strings, imported when a runner resolves them: a
# stage whose closure holds a runner depends on the modules the table names (and what they import)
TABLE_RUNNERS = {"self_improve/engines/engine.py": "self_improve/config/engines.py",
                 "self_improve/engines/sampler.py": "self_improve/config/engines.py"}
REF = re.compile(r"^((?:self_improve|stages)(?:\.\w+)+):\w+$")
NOTES = {"self_improve/__init__.py": "pins the CPU kernels",
         PLUGINS: "the modules params.yaml's `plugins` imports"}


@functools.lru_cache(maxsize=None)
def _tree(path: str, mtime_ns: int, size: int) -> ast.Module:
    return ast.parse(Path(path).read_text())


def parse(path: Path) -> ast.Module:
    """The file's syntax tree, parsed once while the file is unchanged (every stage's closure
    walks mostly the same modules)."""
    st = path.stat()
    return _tree(str(path), st.st_mtime_ns, st.st_size)


def defines_something(path: Path) -> bool:
    """False for a package's __init__.py that holds only its docstring: importing it runs nothing."""
    body = parse(path).body
    return any(not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)) for n in body)


def module_file(name: str, root: Path = ROOT) -> Path | None:
    """The repo file of a dotted module name (a module or a package's __init__.py), None outside the repo."""
    if name.split(".")[0] not in PACKAGES:
        return None
    base = root.joinpath(*name.split("."))
    for target in (base.with_suffix(".py"), base / "__init__.py"):
        if target.is_file():
            return target
    return None


def imported_names(mod: Path, node: ast.AST, root: Path = ROOT) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        package = mod.parent.relative_to(root).parts
        package = package[: len(package) - (node.level - 1)]
        prefix = ".".join(package + ((node.module,) if node.module else ()))
    else:
        prefix = node.module
    return [prefix] + [f"{prefix}.{a.name}" for a in node.names]


def table_refs(table: Path) -> list[str]:
    """The modules a table's entries name as "module:function"."""
    return [m.group(1) for node in ast.walk(parse(table))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and (m := REF.match(node.value))]


@functools.lru_cache(maxsize=None)
def _names(path: str, mtime_ns: int, size: int, root: Path) -> tuple[str, ...]:
    mod = Path(path)
    return tuple(name for node in ast.walk(parse(mod)) for name in imported_names(mod, node, root))


def imports(path: Path, root: Path = ROOT) -> set[str]:
    """Repo modules (as paths relative to `root`) that `path` imports, directly or through other repo
    modules (or through a table a module runs, TABLE_RUNNERS), with the packages above each."""
    seen: set[str] = set()
    todo = [path]
    while todo:
        mod = todo.pop()
        st = mod.stat()
        names = list(_names(str(mod), st.st_mtime_ns, st.st_size, root))
        table = TABLE_RUNNERS.get(str(mod.relative_to(root)))
        if table is not None:
            names += table_refs(root / table)
        for name in names:
            parts = name.split(".")
            for i in range(1, len(parts) + 1):
                target = module_file(".".join(parts[:i]), root)
                if target is None or not defines_something(target):
                    continue
                rel = str(target.relative_to(root))
                if rel not in seen:
                    seen.add(rel)
                    todo.append(target)
    return seen


def is_code(dep: str) -> bool:
    """A deps entry this tool writes: a .py file of the packages, or one of FOLDERS."""
    return dep in FOLDERS or dep == PLUGINS or (dep.split("/")[0] in PACKAGES and dep.endswith(".py"))


def code_deps(module: str, root: Path = ROOT) -> list[str]:
    """The code deps of the stage that runs `python -m module`, in the order they are written."""
    path = root.joinpath(*module.split(".")).with_suffix(".py")
    own = str(path.relative_to(root))
    found = imports(path, root) | {own, *FIRST}
    folded = {next((f for f in FOLDERS if p.startswith(f + "/")), p) for p in found}
    rest = sorted(folded - {own, *FIRST})
    return [*FIRST, own, *rest, PLUGINS]


def _stage_modules(text: str) -> dict[str, str]:
    """{stage name: the module its cmd runs} of a pipeline file."""
    out = {}
    for name, spec in yaml.safe_load(text)["stages"].items():
        out[name] = spec.get("do", spec)["cmd"].split()[2]
    return out


def _item(line: str) -> str:
    return line.strip()[2:].split("#")[0].strip()


def rewrite(text: str, root: Path = ROOT) -> str:
    """The pipeline file `text` with every stage's code deps generated; every other line as it was."""
    modules = _stage_modules(text)
    lines = text.split("\n")
    out: list[str] = []
    stage = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if (m := STAGE.match(line)) and m.group(1) in modules:
            stage = m.group(1)
        if line.strip() == "deps:" and stage is not None:
            out.append(line)
            indent = " " * (len(line) - len(line.lstrip()) + 2)
            i += 1
            items = []
            while i < len(lines) and lines[i].startswith(indent + "- "):
                items.append(lines[i])
                i += 1
            kept = [x for x in items if not is_code(_item(x))]
            at = next((k for k, x in enumerate(items) if is_code(_item(x))), len(items))
            before = [x for x in items[:at] if not is_code(_item(x))]
            after = [x for x in kept if x not in before]
            generated = [f"{indent}- {d}" + (f"  # {NOTES[d]}" if d in NOTES else "")
                         for d in code_deps(modules[stage], root)]
            out += before + generated + after
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


def stale(root: Path = ROOT) -> list[str]:
    """The pipeline files whose code deps are not what the stages import."""
    return [name for name in PIPELINES
            if rewrite((root / name).read_text(), root) != (root / name).read_text()]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m scripts.deps", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only say which files are stale (exit 1 if any)")
    args = ap.parse_args(argv)
    if args.check:
        if bad := stale():
            sys.exit(f"stale code deps in {', '.join(bad)}: run `python -m scripts.deps`")
        return
    for name in PIPELINES:
        path = ROOT / name
        text = path.read_text()
        new = rewrite(text)
        if new != text:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(new)
            tmp.replace(path)
            print(f"wrote {name}")


if __name__ == "__main__":
    main()
