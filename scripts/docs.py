"""The parameter reference, docs/parameters.md, generated from the params schema.

    python -m scripts.docs      # rewrite docs/parameters.md (tests/test_docs.py checks it is current)

Walks `Params.model_fields` in `self_improve/config/` recursively: one heading per section (a
nested pydantic model), one table row per key (dotted, as `dvc exp run -S` takes it) with its type,
its constraints, its default and its `description`, and at the end every closed choice (an enum)
with its values and what each means, read from the comments beside them in the source. Only
`self_improve.config` is imported, which does not load torch.
"""

from __future__ import annotations

import enum
import inspect
import re
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from self_improve.config import Params

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "parameters.md"

HEADER = """\
# Parameters

Every key of `params.yaml`, generated from the schema in
[`self_improve/config/`](../self_improve/config/) by `python -m scripts.docs` (do not edit by
hand: `tests/test_docs.py` checks that this page is current). Keys are dotted as
`dvc exp run -S KEY=VALUE` takes them. Defaults are the schema's: the committed `params.yaml` sets
some keys to other values, and a key it leaves out takes the default here. An unknown key, a value
of the wrong type or one outside its range stops the loop before any stage runs
([how the file is checked](operations.md#parameters)).
"""


def _is_model(tp: Any) -> bool:
    return inspect.isclass(tp) and issubclass(tp, BaseModel)


def _is_enum(tp: Any) -> bool:
    return inspect.isclass(tp) and issubclass(tp, enum.Enum)


def _args(tp: Any) -> tuple[Any, ...]:
    return typing.get_args(tp)


def _optional(tp: Any) -> tuple[Any, bool]:
    """(the type without None, whether None is allowed)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in _args(tp) if a is not type(None)]
        if len(rest) < len(_args(tp)):
            return (rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]), True
    return tp, False


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _choice_heading(key: str) -> str:
    return f"`{key}`"


def _type(tp: Any, key: str) -> str:
    tp, nullable = _optional(tp)
    origin = typing.get_origin(tp)
    if _is_enum(tp):
        values = ", ".join(f"`{m.value}`" for m in tp)
        text = f"one of {values} ([choices](#{_slug(_choice_heading(key))}))"
    elif _is_model(tp):
        text = f"section `{key}`"
    elif origin is list:
        (item,) = _args(tp) or (Any,)
        text = f"list of {_type(item, key + '[]')}" if not _is_model(item) else f"list of `{key}[]` entries"
    elif origin is dict:
        k, v = _args(tp) or (Any, Any)
        if _is_model(v):
            text = f"mapping of name to a `{key}.<name>` entry"
        elif v is Any:
            text = "mapping"
        else:
            text = f"mapping of {_type(k, key)} to {_type(v, key)}"
    elif tp is Any:
        text = "any"
    elif inspect.isclass(tp):
        text = tp.__name__
    else:
        text = str(tp)
    return text + (" or null" if nullable else "")


_BOUNDS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}


def _constraints(field: FieldInfo) -> list[str]:
    out = []
    for meta in field.metadata:
        for attr, sign in _BOUNDS.items():
            value = getattr(meta, attr, None)
            if value is not None:
                out.append(f"{sign} {_yaml(value)}")
        min_length = getattr(meta, "min_length", None)
        if min_length is not None:
            out.append("not empty" if min_length == 1 else f"length >= {min_length}")
    return out


def _yaml(value: Any) -> str:
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if isinstance(value, str):
        return value
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default
    return f"`{_yaml(value)}`"


def _source_comment(cls: type, name: str) -> str:
    """A field without a description: the comment beside it, or the comment lines just above it."""
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return ""
    for i, line in enumerate(lines):
        match = re.match(rf"\s+{re.escape(name)}\s*:[^#]*(?:#\s*(.*))?$", line)
        if not match:
            continue
        if match.group(1):
            return match.group(1).strip()
        above = []
        for prev in reversed(lines[:i]):
            comment = re.match(r"\s+#\s?(.*)$", prev)
            if not comment:
                break
            above.insert(0, comment.group(1).strip())
        return " ".join(above)
    return ""


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _doc(cls: type) -> str:
    doc = cls.__dict__.get("__doc__")
    return " ".join(doc.split()) if doc else ""


def _tables() -> dict[str, dict[str, str]]:
    """Choices that live in a table of the library rather than an enum: {key: {name: what it is}}."""
    from self_improve.config import ALGORITHMS, JUDGES, TASKS

    return {"task.name": {name: task.about for name, task in TASKS.items()},
            "judge.method": {name: judge.about for name, judge in JUDGES.items()},
            "train.algorithm": {name: algo.about for name, algo in ALGORITHMS.items()}}


def _sections(model: type[BaseModel], prefix: str, depth: int, enums: dict[str, type]) -> list[str]:
    """The table of `model`'s keys, then the sections nested in it, in field order."""
    rows, nested = [], []
    for name, field in model.model_fields.items():
        key = f"{prefix}.{name}" if prefix else name
        tp, _ = _optional(field.annotation)
        origin = typing.get_origin(tp)
        if _is_model(tp):
            nested.append((key, tp))
            continue
        if _is_enum(tp):
            enums[key] = tp
        if origin is list and _args(tp) and _is_model(_args(tp)[0]):
            nested.append((f"{key}[]", _args(tp)[0]))
        if origin is dict and _args(tp) and _is_model(_args(tp)[-1]):
            nested.append((f"{key}.<name>", _args(tp)[-1]))
        kind = _type(field.annotation, key)
        if key in (tables := _tables()):
            enums[key] = tables[key]
            table = {"task.name": "task", "judge.method": "judge", "train.algorithm": "algorithm"}[key]
            kind = (f"a name of the {table} table: {', '.join(f'`{n}`' for n in tables[key])} "
                    f"([choices](#{_slug(_choice_heading(key))}))")
        limits = _constraints(field)
        if limits:
            kind += ", " + ", ".join(limits)
        about = field.description or _source_comment(model, name)
        rows.append(f"| `{key}` | {_cell(kind)} | {_cell(_default(field))} | {_cell(about)} |")
    out: list[str] = []
    if rows:
        out += ["| key | type | default | description |", "|---|---|---|---|", *rows, ""]
    for key, sub in nested:
        out += [f"{'#' * min(depth + 1, 6)} `{key}`", ""]
        if _doc(sub):
            out += [_doc(sub), ""]
        out += _sections(sub, key, depth + 1, enums)
    return out


def _enum_meanings(cls: type[enum.Enum]) -> dict[str, str]:
    """Each member's value -> the comment beside it in the source."""
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return {}
    out = {}
    for line in lines:
        match = re.match(r"\s+(\w+)\s*=\s*(['\"])(.*?)\2\s*(?:#\s*(.*))?$", line)
        if match and match.group(4):
            out[match.group(3)] = match.group(4).strip()
    return out


def parameters_markdown() -> str:
    enums: dict[str, type] = {}
    body = ["## Top level", ""] + _sections(Params, "", 1, enums)
    choices = ["## Choices", "", "The values each closed choice takes, with what each means.", ""]
    for key, cls in enums.items():
        meanings = cls if isinstance(cls, dict) else _enum_meanings(cls)
        values = list(cls) if isinstance(cls, dict) else [m.value for m in cls]
        choices += [f"### {_choice_heading(key)}", "", "| value | meaning |", "|---|---|"]
        choices += [f"| `{v}` | {_cell(meanings.get(v, ''))} |" for v in values]
        choices.append("")
    text = HEADER + "\n" + "\n".join(body + choices)
    return text.rstrip("\n") + "\n"


def main() -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(parameters_markdown(), encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
