"""The loop's per-iteration metrics as the evaluate stages wrote them (reports/iterations/<it>/),
read back for the report, the export of the recommended iteration and the scripts."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from self_improve import artifacts as art
from self_improve.config import Params
from self_improve.errors import ConfigError


def load_iterations(directory: str | Path, params: Params) -> tuple[pd.DataFrame, dict[str, dict]]:
    """Metrics of it0 and of every iteration in `loop`, and the loop iterations' examples, from
    <directory>/<it>/metrics.json and examples.json (the evaluate stages' outputs)."""
    directory = Path(directory)
    rows, examples = [], {}
    for it in ["it0", *params.loop]:
        path = directory / it / "metrics.json"
        if not path.is_file():
            raise ConfigError(f"report: {path} is missing; the evaluate stage of {it} writes it "
                              f"(params.yaml loop has {list(params.loop)})")
        row = art.read_json(path)
        if row.get("iteration") != it:
            raise ConfigError(f"report: {path} holds iteration {row.get('iteration')!r}, not {it!r}")
        rows.append(row)
        if it != "it0":
            examples[it] = art.read_json(directory / it / "examples.json")
    return pd.DataFrame(rows).sort_values("step").reset_index(drop=True), examples


def history(df: pd.DataFrame) -> list[dict]:
    """The per-iteration metrics as dicts, missing values as None."""
    return [{k: (None if pd.isna(v) else v) for k, v in r.items()} for r in df.to_dict("records")]
