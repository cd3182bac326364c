"""Named recipes: params overrides kept as files, read alike by the Makefile, `dvc exp run -S`, the
runners and the Prefect flow, with the one override parser and the one flattener.

A recipe is a params.yaml fragment: only the keys it changes, nested as in params.yaml. Two kinds
share one namespace: setups (configs/recipes/<name>.yaml: a model, a task, their sizes) and rules
(configs/rules/<name>.yaml: a judge and its pairs, such as `scpo+validity_any` or the control arm
`random`). Recipes compose left to right: `smollm2-gym scpo` is the gym setup judged by ScPO. A
recipe becomes DVC's `-S key=value` arguments (`set_args`), is applied to a params tree (`apply`),
or is printed for a shell, the Makefile's way:

    dvc exp run $(python -m self_improve.recipes smollm2-gym scpo -S seed=1)

or run as one command that passes every value to DVC as one argument, whatever its spaces and
quotes (`exp`; the shell's `$(...)` above splits `task.instruction=Answer with ...` into words):

    self-improve exp smollm2-gym scpo -S seed=1 -n gym-scpo-s1
"""

from __future__ import annotations

import argparse
import copy
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable

import yaml

from self_improve.config import flatten_tree as flatten
from self_improve.errors import ConfigError

RECIPES = Path("configs/recipes")
RULES = Path("configs/rules")


def parse_assignment(text: str) -> tuple[str, Any]:
    """`key=value` (DVC's -S form, `++key=value` too): the dotted key and the value read as YAML."""
    key, eq, value = text.partition("=")
    key = key.strip().removeprefix("++").removeprefix("+")
    if not eq or not key.strip():
        raise ConfigError(f"override {text!r}: expected key=value")
    try:
        return key.strip(), yaml.safe_load(value)
    except yaml.YAMLError as err:
        raise ConfigError(f"override {key}: value is not valid YAML: {err}".replace("\n", " ")) from None


def assign(tree: dict, key: str, value: Any) -> None:
    """Set the dotted `key` in `tree` in place, creating sections as needed."""
    *parents, leaf = key.split(".")
    node = tree
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {key}: {part} is a value, not a section")
        node = child
    node[leaf] = value


def apply(raw: dict, overrides: dict[str, Any] | Iterable[str]) -> dict:
    """A copy of the params tree `raw` with `overrides` ({dotted key: value} or `key=value` texts)."""
    out = copy.deepcopy(raw)
    items = overrides.items() if isinstance(overrides, dict) else map(parse_assignment, overrides)
    for key, value in items:
        assign(out, key, value)
    return out


def path_of(name: str | Path, root: Path = Path(".")) -> Path:
    """A recipe's file (relative to `root` unless given as a path): a path as given, else
    configs/recipes/<name>.yaml, else configs/rules/<name>.yaml (the first that exists)."""
    given = Path(name)
    if given.suffix in (".yaml", ".yml"):
        return given
    for folder in (RECIPES, RULES):
        if (root / folder / f"{name}.yaml").is_file():
            return folder / f"{name}.yaml"
    return RECIPES / f"{name}.yaml"


def available(root: Path = Path(".")) -> list[str]:
    return sorted(p.stem for folder in (RECIPES, RULES) for p in (root / folder).glob("*.yaml"))


def rules(root: Path = Path(".")) -> list[str]:
    """The rule recipes' names (configs/rules/)."""
    return sorted(p.stem for p in (root / RULES).glob("*.yaml"))


def load(name: str | Path, root: Path = Path(".")) -> dict[str, Any]:
    """A recipe's overrides as {dotted key: value}, in file order."""
    path = path_of(name, root)
    path = path if path.is_absolute() else root / path
    if not path.is_file():
        raise ConfigError(f"recipe {name}: {path} not found (recipes: {', '.join(available(root)) or 'none'})")
    try:
        tree = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"recipe {path}: not valid YAML: {err}".replace("\n", " ")) from None
    if not isinstance(tree, dict):
        raise ConfigError(f"recipe {path}: expected a mapping of params sections")
    return flatten(tree)


def load_all(names: Iterable[str | Path], root: Path = Path(".")) -> dict[str, Any]:
    """Several recipes' overrides, applied left to right (a later one wins on a key both set)."""
    out: dict[str, Any] = {}
    for name in names:
        out |= load(name, root)
    return out


def split(text: str) -> list[str]:
    """A comma-separated list of recipe names (the flow's `recipe` parameter): `smollm2-gym,scpo`."""
    return [part.strip() for part in text.split(",") if part.strip()]


def render(value: Any) -> str:
    """A value as DVC's -S reads it back (YAML, one line); a plain string stays as written."""
    if isinstance(value, str) and "\n" not in value and yaml.safe_load(value) == value:
        return value
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


OPEN = ("loop.", "agents.loop.")  # sections whose keys a recipe may add (iterations): DVC takes them as `++key`


def set_args(overrides: dict[str, Any]) -> list[str]:
    """DVC's `-S key=value` arguments of {dotted key: value}; a key of an open section (an iteration
    of `loop`, which params.yaml may not have yet) as `++key=value`, Hydra's add-or-override."""
    return [a for k, v in overrides.items()
            for a in ("-S", f"{'++' if k.startswith(OPEN) else ''}{k}={render(v)}")]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="print recipes as `-S key=value` arguments for dvc exp run")
    ap.add_argument("recipe", nargs="+", help=f"names under {RECIPES}/ or {RULES}/ (applied left to right), "
                                              "or YAML paths")
    ap.add_argument("-S", "--set", action="append", default=[], help="key=value on top of the recipes")
    args = ap.parse_args(argv)
    try:
        overrides = load_all(args.recipe) | dict(map(parse_assignment, args.set))
    except ConfigError as err:
        raise SystemExit(f"error: {err}") from None
    print(" ".join(shlex.quote(a) for a in set_args(overrides)))


def missing_inputs(overrides: dict[str, Any], root: Path = Path(".")) -> list[str]:
    """What the recipe needs that is not here, each with the command that makes it: a local
    `model.base` under models/ (`make smollm2` for SmolLM2)."""
    base = overrides.get("model.base")
    if isinstance(base, str) and base.startswith("models/") and not (root / base).exists():
        hint = "make smollm2" if "smollm2" in base else "put the model there (docs/own-model.md)"
        return [f"{base} (model.base) is missing: {hint}"]
    return []


def exp_main(argv: list[str] | None = None) -> None:
    """`self-improve exp RECIPE... [-S KEY=VALUE]... [-n NAME] [--dry-run] [-- DVC ARGS]`: `dvc exp run`
    with the recipes' overrides, each one argument (no shell splits a value with spaces)."""
    ap = argparse.ArgumentParser(description="run recipes as one DVC experiment (dvc exp run -S ... for you)")
    ap.add_argument("recipe", nargs="+", help=f"names under {RECIPES}/ or {RULES}/ (applied left to right)")
    ap.add_argument("-S", "--set", action="append", default=[], help="key=value on top of the recipes")
    ap.add_argument("-n", "--name", help="the experiment's name (dvc exp run -n)")
    ap.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
    args, extra = ap.parse_known_args(argv)
    extra = extra[1:] if extra[:1] == ["--"] else extra
    try:
        overrides = load_all(args.recipe) | dict(map(parse_assignment, args.set))
    except ConfigError as err:
        raise SystemExit(f"error: {err}") from None
    cmd = ["dvc", "exp", "run", *(["-n", args.name] if args.name else []), *set_args(overrides), *extra]
    if args.dry_run:
        print(shlex.join(cmd))
        return
    missing = missing_inputs(overrides)
    if missing:
        raise SystemExit("error: " + "; ".join(missing))
    dvc = shutil.which("dvc") or str(Path(sys.executable).parent / "dvc")
    raise SystemExit(subprocess.run([dvc, *cmd[1:]]).returncode)


if __name__ == "__main__":
    main()
