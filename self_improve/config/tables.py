"""The library's tables of named parts (tasks, judges, training algorithms): a name -> entry mapping
that params validation reads, that plugins extend with `register`, and that refuses an unknown name
with the names it holds. An entry points at its code as `"module:function"`, imported only when it
runs (`resolve`), so that reading a table loads no model code."""

from __future__ import annotations

import importlib
from typing import Any, Callable, Generic, TypeVar, Union

T = TypeVar("T")


def resolve(ref: Union[str, Callable[..., Any]]) -> Callable[..., Any]:
    """The function `ref` names (`"module:function"`), or `ref` itself when it is one."""
    if callable(ref):
        return ref
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


class Table(dict, Generic[T]):
    """{name: entry} of one `kind` of part ("judge", "algorithm")."""

    def __init__(self, kind: str, entries: dict[str, T]):
        super().__init__(entries)
        self.kind = kind

    def register(self, name: str, entry: T, *, replace: bool = False) -> None:
        """Add `entry` under `name`; an existing name only with `replace`."""
        if not name.isidentifier():
            raise ValueError(f"{self.kind} name {name!r}: letters, digits and _ only")
        if name in self and not replace:
            raise ValueError(f"{self.kind} {name!r} exists already (replace=True to override it)")
        self[name] = entry

    def unregister(self, name: str) -> None:
        self.pop(name, None)

    def of(self, name: str) -> T:
        """The entry of `name`; an unknown name is refused with the names the table holds."""
        try:
            return self[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} {name!r} ({self.kind}s: {', '.join(self)})") from None


def named_in(table: Table) -> Callable[[str], str]:
    """A pydantic AfterValidator's function: the value must be a name of `table` (else refused with them)."""
    def check(name: str) -> str:
        table.of(name)
        return name

    return check
