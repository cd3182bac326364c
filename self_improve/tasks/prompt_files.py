"""A user's own prompt file (JSONL or parquet), checked row by row.

The pipeline's own prompts come from a task generator, but a user may bring a file of instructions
instead. Such a file is hand-written, so every problem is reported as one line that names the file, the
row (1-based: the line number in JSONL, the row number in parquet) and the column, e.g.
``data/x.jsonl: row 7, column 'prompt': empty prompt``. With ``on_error="skip"`` bad rows are dropped and
counted by reason instead; problems with the file as a whole (missing, unreadable, wrong columns, nothing
usable left) always raise.

Columns: ``prompt`` (required, str), ``answer`` (optional; str, or an int/float turned into str, or null)
and ``category`` (optional; str or null). Prompt text is kept exactly as given: it is stripped only to
test for emptiness.

Model-written rewrites of prompts are filtered in self_improve/tasks/rewrites.py.
"""

from __future__ import annotations

import json
import math
import unicodedata
from collections import Counter
from pathlib import Path
from typing import Any, Iterator, Union

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from self_improve.errors import ConfigError

COLUMNS = ("prompt", "answer", "category")
JSONL_SUFFIXES = (".jsonl", ".json")
PARQUET_SUFFIXES = (".parquet",)
ON_ERROR = ("raise", "skip")
ALLOWED_CONTROL = frozenset("\n\t")

PathLike = Union[str, Path]


class _RowError(Exception):
    """One bad row: `reason` is the key it is counted under in skip mode."""

    def __init__(self, reason: str, message: str, column: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.column = column


def _where(path: PathLike, row: int | None = None, column: str | None = None) -> str:
    out = str(path)
    if row is not None:
        out += f": row {row}"
    if column is not None:
        out += f", column '{column}'" if row is not None else f": column '{column}'"
    return out


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _type_name(value: Any) -> str:
    return {dict: "object", list: "list", bool: "bool", int: "int", float: "float", str: "string"}.get(
        type(value), type(value).__name__
    )


def _check_prompt(value: Any, max_chars: int) -> str:
    if value is None:
        raise _RowError("missing", "prompt is null", "prompt")
    if not isinstance(value, str):
        raise _RowError("wrong_type", f"prompt must be a string, got {_type_name(value)}", "prompt")
    if not value.strip():
        raise _RowError("empty", "empty prompt", "prompt")
    if len(value) > max_chars:
        raise _RowError("too_long", f"prompt has {len(value)} characters, more than max_chars={max_chars}",
                        "prompt")
    for i, c in enumerate(value):
        if c not in ALLOWED_CONTROL and unicodedata.category(c) == "Cc":
            raise _RowError("control_char", f"control character {c!r} at character {i + 1}", "prompt")
    return value


def _check_answer(value: Any) -> str | None:
    """str as is; int/float as text (12 and 12.0 both give "12"); null (or NaN) as None."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _RowError("wrong_type", f"answer must be a string or a number, got {_type_name(value)}",
                        "answer")
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            raise _RowError("wrong_type", f"answer must be a finite number, got {value}", "answer")
        if value.is_integer():
            return str(int(value))
    return str(value)


def _check_category(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise _RowError("wrong_type", f"category must be a string, got {_type_name(value)}", "category")


def _jsonl_rows(path: Path, mapped: bool = False) -> Iterator[tuple[int, dict[str, Any] | _RowError]]:
    """(line number, the row's object or what is wrong with the line); blank lines are skipped.
    With a column mapping (`mapped`), columns it does not name are allowed (and ignored)."""
    for number, raw in enumerate(path.read_bytes().split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as e:
            yield number, _RowError("bad_utf8", f"bad UTF-8 encoding at byte {e.start + 1} of the line")
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            yield number, _RowError("invalid_json", f"not valid JSON: {e.msg} (character {e.pos + 1})")
            continue
        if not isinstance(obj, dict):
            yield number, _RowError("not_object", f"not a JSON object (got {_type_name(obj)})")
            continue
        for key in obj:
            if key not in COLUMNS and not mapped:
                allowed = ", ".join(COLUMNS)
                raise ConfigError(f"{_where(path, number, key)}: unknown column (allowed: {allowed})")
        yield number, obj


def _read_jsonl(path: Path, names: dict[str, str]) -> list[tuple[int, dict[str, Any] | _RowError]]:
    rows = list(_jsonl_rows(path, mapped=names["prompt"] != "prompt" or len(names) != len(COLUMNS)))
    if not rows:
        raise ConfigError(f"{path}: empty file, no rows")
    objects = [r for _, r in rows if isinstance(r, dict)]
    if objects and not any(names["prompt"] in r for r in objects):
        raise ConfigError(f"{path}: no row has the required column '{names['prompt']}'")
    return rows


def _read_parquet(path: Path, names: dict[str, str]) -> list[tuple[int, dict[str, Any] | _RowError]]:
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError, ValueError) as e:
        raise ConfigError(f"{path}: cannot read parquet: {_one_line(str(e))}") from None
    mapped = names["prompt"] != "prompt" or len(names) != len(COLUMNS)
    wanted = names
    names = table.column_names
    if wanted["prompt"] not in names:
        raise ConfigError(f"{path}: missing required column '{wanted['prompt']}' "
                          f"(columns: {', '.join(names) or 'none'})")
    for name in names:
        if name not in COLUMNS and not mapped:
            raise ConfigError(f"{_where(path, column=name)}: unknown column (allowed: {', '.join(COLUMNS)})")
    names = [n for n in names if n in wanted.values()]
    if table.num_rows == 0:
        raise ConfigError(f"{path}: empty file, no rows")
    try:
        columns = {name: table.column(name).to_pylist() for name in names}
    except (pa.ArrowException, ValueError) as e:  # e.g. a binary column that is not valid UTF-8
        raise ConfigError(f"{path}: cannot read parquet: {_one_line(str(e))}") from None
    rows: list[tuple[int, dict[str, Any] | _RowError]] = []
    for i in range(table.num_rows):
        row: dict[str, Any] = {}
        for name in names:
            value = columns[name][i]
            if isinstance(value, bytes):
                try:
                    value = value.decode("utf-8")
                except UnicodeDecodeError as e:
                    bad = _RowError("bad_utf8", f"bad UTF-8 encoding at byte {e.start + 1}", name)
                    rows.append((i + 1, bad))
                    break
            row[name] = value
        else:
            rows.append((i + 1, row))
    return rows


def load_prompt_file(
    path: PathLike, max_chars: int = 2000, on_error: str = "raise", columns: dict[str, str] | None = None,
    require_answer: bool = False,
) -> tuple[pd.DataFrame, dict[str, int]]:
    """Read and check a prompt file; returns (prompt, answer, category) in file order and skip counts.

    `columns` maps prompt/answer/category to the file's own column names (e.g. GSM8K's `question`);
    messages then name the file's columns, and columns it does not name are ignored. With
    `require_answer` a row without an answer is a bad row (reason "missing").

    `on_error="raise"`: the first bad row raises ConfigError. `on_error="skip"`: bad rows are dropped
    and counted by reason (missing, wrong_type, empty, too_long, control_char, duplicate, invalid_json,
    not_object, bad_utf8); the counts are empty when nothing was skipped. A duplicate is an exact repeat
    of the prompt text of an earlier kept row.
    """
    if on_error not in ON_ERROR:
        raise ConfigError(f"on_error must be one of {', '.join(ON_ERROR)}, got {on_error!r}")
    if max_chars < 1:
        raise ConfigError(f"max_chars must be at least 1, got {max_chars}")
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in JSONL_SUFFIXES + PARQUET_SUFFIXES:
        raise ConfigError(f"{path}: unknown extension {p.suffix or '(none)'!r}, "
                          f"expected one of {', '.join(JSONL_SUFFIXES + PARQUET_SUFFIXES)}")
    if not p.is_file():
        raise ConfigError(f"{path}: no such file")
    names = dict(columns) if columns else {c: c for c in COLUMNS}
    col = {c: names.get(c) for c in COLUMNS}  # ours -> the file's (None: not read)
    rows = _read_jsonl(p, names) if suffix in JSONL_SUFFIXES else _read_parquet(p, names)

    out: dict[str, list[str | None]] = {c: [] for c in COLUMNS}
    seen: dict[str, int] = {}
    skipped: Counter[str] = Counter()
    for number, row in rows:
        try:
            if isinstance(row, _RowError):
                raise row
            if col["prompt"] not in row:
                raise _RowError("missing", "prompt is missing", "prompt")
            prompt = _check_prompt(row[col["prompt"]], max_chars)
            answer = _check_answer(row.get(col["answer"])) if col["answer"] else None
            if require_answer and (answer is None or not answer.strip()):
                raise _RowError("missing", "no answer (a gold answer is needed: #### N, \\boxed{...} or a value)",
                                "answer")
            category = _check_category(row.get(col["category"])) if col["category"] else None
            if prompt in seen:
                raise _RowError("duplicate", f"duplicate of row {seen[prompt]}", "prompt")
        except _RowError as e:
            if on_error == "raise":
                column = col.get(e.column, e.column) if e.column else None
                message = e.message.replace(f"{e.column} ", f"{column} ", 1) if column != e.column else e.message
                raise ConfigError(f"{_where(path, number, column)}: {message}") from None
            skipped[e.reason] += 1
            continue
        seen[prompt] = number
        out["prompt"].append(prompt)
        out["answer"].append(answer)
        out["category"].append(category)
    if not out["prompt"]:
        detail = ", ".join(f"{k}: {v}" for k, v in sorted(skipped.items()))
        raise ConfigError(f"{path}: no usable rows left (skipped {detail})")
    frame = pd.DataFrame({c: pd.Series(v, dtype=object) for c, v in out.items()})
    return frame, dict(sorted(skipped.items()))
