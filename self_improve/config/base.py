"""The base of every params.yaml section: unknown keys refused by name, values frozen."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, use_enum_values=False)
