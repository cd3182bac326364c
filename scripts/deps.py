"""dvc.yaml's code dependencies: what each stage imports (`python -m scripts.pipeline` writes them).

A stage's code deps are its module, the packages above it, and every repository module it imports,
directly or through other repository modules (with the packages above each: importing a module runs
its packages' __init__.py first). A package whose modules are imported through its __init__
(self_improve/config, tasks, judges) is declared as its folder. So an edit to a library module
reruns exactly the stages that import it.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("self_improve", "stages")
FOLDERS = ("self_improve/config", "self_improve/tasks", "self_improve/judges")  # declared as a whole
FIRST = ("stages/__init__.py", "self_improve/__init__.py", "self_improve/cpu.py")  # every stage's, in this order
PLUGINS = "plugins"  # the user's modules that params.yaml's `plugins` imports: every stage's
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


def code_deps(module: str, root: Path = ROOT) -> list[str]:
    """The code deps of the stage that runs `python -m module`, in the order they are written."""
    path = root.joinpath(*module.split(".")).with_suffix(".py")
    own = str(path.relative_to(root))
    found = imports(path, root) | {own, *FIRST}
    folded = {next((f for f in FOLDERS if p.startswith(f + "/")), p) for p in found}
    rest = sorted(folded - {own, *FIRST})
    return [*FIRST, own, *rest, PLUGINS]
