"""Named recipes: params overrides kept as files (configs/recipes/<name>.yaml), read alike by the
Makefile, the scripts and the Prefect flow, with the one override parser and the one flattener.

A recipe is a params.yaml fragment: only the keys it changes, nested as in params.yaml. It becomes
DVC's `-S key=value` arguments (`set_args`), is applied to a params tree (`apply`), or is printed for
a shell (`python -m self_improve.recipes smollm2-v2 -S sample.backend=hf`, the Makefile's way).
"""

from __future__ import annotations

import argparse
import copy
import shlex
from pathlib import Path
from typing import Any, Iterable

import yaml

from self_improve.config import flatten_tree as flatten
from self_improve.errors import ConfigError

RECIPES = Path("configs/recipes")


def parse_assignment(text: str) -> tuple[str, Any]:
    """`key=value` (DVC's -S form): the dotted key and the value read as YAML."""
    key, eq, value = text.partition("=")
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


def path_of(name: str | Path) -> Path:
    """A recipe's file: a path as given, or configs/recipes/<name>.yaml."""
    given = Path(name)
    if given.suffix in (".yaml", ".yml"):
        return given
    return RECIPES / f"{name}.yaml"


def available() -> list[str]:
    return sorted(p.stem for p in RECIPES.glob("*.yaml"))


def load(name: str | Path) -> dict[str, Any]:
    """A recipe's overrides as {dotted key: value}, in file order."""
    path = path_of(name)
    if not path.is_file():
        raise ConfigError(f"recipe {name}: {path} not found (recipes: {', '.join(available()) or 'none'})")
    try:
        tree = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"recipe {path}: not valid YAML: {err}".replace("\n", " ")) from None
    if not isinstance(tree, dict):
        raise ConfigError(f"recipe {path}: expected a mapping of params sections")
    return flatten(tree)


def render(value: Any) -> str:
    """A value as DVC's -S reads it back (YAML, one line); a plain string stays as written."""
    if isinstance(value, str) and "\n" not in value and yaml.safe_load(value) == value:
        return value
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def set_args(overrides: dict[str, Any]) -> list[str]:
    """DVC's `-S key=value` arguments of {dotted key: value}."""
    return [a for k, v in overrides.items() for a in ("-S", f"{k}={render(v)}")]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="print a recipe as `-S key=value` arguments for dvc exp run")
    ap.add_argument("recipe", help=f"a name under {RECIPES}/ or a YAML path")
    ap.add_argument("-S", "--set", action="append", default=[], help="key=value on top of the recipe")
    args = ap.parse_args(argv)
    overrides = load(args.recipe) | dict(map(parse_assignment, args.set))
    print(" ".join(shlex.quote(a) for a in set_args(overrides)))


if __name__ == "__main__":
    main()
