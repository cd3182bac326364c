"""Artifact I/O: atomic writes, record schemas, provenance.

Every output is written to a temporary sibling and renamed into place, so a crash never leaves a
half-written file at an output path. Parquet is written without timestamps, so the same inputs and
seed give byte-identical files (and DVC sees nothing downstream as stale after a rerun).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from self_improve.errors import ArtifactError

# Record schemas between stages. Scores are nullable: a missing judgment is null, never 0.
PROMPTS = pa.schema(
    [
        ("iteration", pa.string()),
        ("prompt_id", pa.string()),
        ("group_id", pa.string()),  # problems that share an answer (rewrites) share a group
        ("variant", pa.int32()),  # 0 = the problem as posed, 1.. = equivalent rewrites
        ("source", pa.string()),  # ttt | fresh | evolved
        ("category", pa.string()),
        ("prompt", pa.string()),
        ("answer", pa.string()),  # ground truth, read only by the verifier and for measurement
    ]
)
SAMPLES = pa.schema(
    list(PROMPTS)
    + [
        ("sample_id", pa.string()),
        ("response", pa.string()),
        ("pred", pa.string()),  # normalised final answer, null when none could be extracted
        ("pred_form", pa.string()),  # how it was read (gsm8k, answer_is, boxed, last_number, ...)
        ("truncated", pa.bool_()),  # cut by max_new_tokens before a stop token
    ]
)
JUDGMENTS = pa.schema(
    list(SAMPLES)
    + [
        ("reward", pa.float64()),  # the configured judge's score, null when it has no verdict
        ("correct", pa.float64()),  # verifier's score, for measurement only; null without answer
        ("label", pa.string()),  # the judge's pseudo-label for the group, when it has one
        ("parse_rate", pa.float64()),  # llm_judge: share of its judgments that parsed; else null
        ("consistency", pa.float64()),  # CREAM: (tau + 1) / 2 with the previous model; else null
        ("valid", pa.bool_()),  # judge.validity: false when the response restates, copies or miscalculates
        ("frozen_yes", pa.float64()),  # judge.frozen: the frozen base model's P(Yes) for the sample
        ("penalised", pa.bool_()),  # judge.low_consensus penalise: the prompt had no label, every sample wrong
    ]
)
PAIRS = pa.schema(
    [
        ("iteration", pa.string()),
        ("prompt_id", pa.string()),
        ("prompt", pa.string()),
        ("chosen", pa.string()),
        ("rejected", pa.string()),
        ("chosen_reward", pa.float64()),
        ("rejected_reward", pa.float64()),
        ("chosen_correct", pa.float64()),
        ("rejected_correct", pa.float64()),
        ("consistency", pa.float64()),  # CREAM's per-prompt C, null for the other algorithms
        ("weight", pa.float64()),  # the pair's weight in the loss (pairs.weight), null: 1
    ]
)
GROUPS = pa.schema(  # GRPO: every scored sample of a prompt whose rewards differ
    [
        ("iteration", pa.string()),
        ("prompt_id", pa.string()),
        ("sample_id", pa.string()),
        ("prompt", pa.string()),
        ("response", pa.string()),
        ("reward", pa.float64()),
        ("advantage", pa.float64()),  # (r - mean) / (std + eps) within the prompt's samples
        ("correct", pa.float64()),
        ("truncated", pa.bool_()),  # cut at sample.max_new_tokens (nft: never right)
        ("valid", pa.bool_()),  # judge.validity's verdict, null without it (nft: invalid is never right)
        ("penalised", pa.bool_()),  # judge.low_consensus penalise (RESTRAIN): advantage -pairs.penalty
    ]
)
SFT = pa.schema(
    [
        ("iteration", pa.string()),
        ("prompt_id", pa.string()),
        ("prompt", pa.string()),
        ("response", pa.string()),
        ("reward", pa.float64()),
        ("correct", pa.float64()),
    ]
)

EVAL = pa.schema(  # evaluate: each problem's greedy answer, so two iterations compare problem by problem
    [
        ("iteration", pa.string()),
        ("set", pa.string()),  # heldout | ttt | ttt_view (a rewrite of each test-time problem) | ttt_sample (it0 only:
        # its sampled answers to both wordings, evaluate.support_k per problem and wording, the label-free base support)
        ("prompt_id", pa.string()),
        ("category", pa.string()),  # the problem's (an operation, a dataset), for per-category rows
        ("answer", pa.string()),
        ("response", pa.string()),
        ("pred", pa.string()),
        ("correct", pa.float64()),  # 1 / 0 by the task's verify
        ("truncated", pa.bool_()),
        ("valid", pa.bool_()),  # the validity check (no gold read); null: no answer, or an open task
        ("restates", pa.bool_()),  # the answer is one of the question's own numbers; null: no answer, or open
        ("frozen_yes", pa.float64()),  # judge.frozen: the base model's P(Yes) for the answer (test-time only)
    ]
)

# A kept run's answers (runners/experiments.py keep_answers: every iteration's EVAL rows in one file under
# reports/): EVAL whole, response texts and categories included, so that a claim can be re-read
# problem by problem after the workspace is gone.
KEPT_EVAL = EVAL
# what every kept run has, those kept before the responses and categories were included too
KEPT_EVAL_COMMON = pa.schema([f for f in EVAL if f.name not in ("response", "category")])

# What evaluate keeps of an iteration for the report (reports/iterations/<it>/examples.json and the
# category mix in metrics.json): the columns of its example tables and the mix metrics' prefix.
JUDGED_EXAMPLE_COLUMNS = ["rank", "sample_id", "prompt", "response", "reward", "label", "correct"]
PAIR_EXAMPLE_COLUMNS = ["prompt_id", "prompt", "chosen", "rejected", "chosen_reward", "rejected_reward",
                        "chosen_correct", "rejected_correct"]
MIX_PREFIX = "mix_"


PROVENANCE_KEY = "self_improve.provenance"


@contextlib.contextmanager
def atomic_path(path: str | Path, is_dir: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success rename it into place, else remove it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A run killed mid-write left a temporary beside this output, or (between the two renames
    # of a directory swap) only the old copy: put that back, drop the rest. DVC's repo lock
    # keeps two writers of one output from running at once.
    old = path.with_name(f".{path.name}.old")
    if old.is_dir() and not path.exists():
        os.replace(old, path)
    for stale in [*path.parent.glob(f".{path.name}.*.tmp"), old]:
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    target = tmp if is_dir else tmp / path.name
    try:
        yield target
        if path.is_dir() and not path.is_symlink():
            os.replace(path, old)
            os.replace(target, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(target, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_table(
    df: pd.DataFrame, path: str | Path, schema: pa.Schema, prov: dict | None = None
) -> None:
    """Write `df` with `schema` atomically; `prov` goes into the file's metadata."""
    missing = [f.name for f in schema if f.name not in df.columns]
    if missing:
        raise ArtifactError(f"{path}: internal error, columns {missing} missing before write")
    table = pa.Table.from_pandas(df[schema.names], schema=schema, preserve_index=False)
    meta = {PROVENANCE_KEY: json.dumps(prov, sort_keys=True)} if prov else None
    table = table.replace_schema_metadata(meta)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")


def read_table(path: str | Path, schema: pa.Schema) -> pd.DataFrame:
    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"{path}: file not found")
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as err:
        raise ArtifactError(f"{path}: not a readable parquet file ({err})") from None
    missing = [n for n in schema.names if n not in table.column_names]
    if missing:
        raise ArtifactError(f"{path}: missing columns {missing}")
    try:
        table = table.select(schema.names).cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
        raise ArtifactError(f"{path}: wrong column types ({err})") from None
    return table.to_pandas()


def read_provenance(path: str | Path) -> dict | None:
    meta = pq.read_schema(path).metadata or {}
    raw = meta.get(PROVENANCE_KEY.encode())
    return json.loads(raw) if raw else None


def empty_table(schema: pa.Schema) -> pd.DataFrame:
    return schema.empty_table().to_pandas()


def write_json(obj: Any, path: str | Path, sort_keys: bool = True) -> None:
    """Write `obj` as JSON whole or not at all (a run killed mid-write keeps the last whole file)."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=sort_keys) + "\n", encoding="utf-8")


def read_json(path: str | Path) -> Any:
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ArtifactError(f"{path}: file not found") from None
    except json.JSONDecodeError as err:
        raise ArtifactError(f"{path}: not valid JSON ({err})") from None


def git_sha() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _versions() -> dict[str, str]:
    names = ["torch", "transformers", "peft", "pandas", "pyarrow", "tokenizers", "dvc", "mlflow"]
    found = {}
    for name in names:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    found["python"] = sys.version.split()[0]
    return found


def provenance(stage: str, iteration: str, params: dict[str, Any], outputs: list[str]) -> dict:
    """What produced an output: stage, the params it read, package versions.

    Nothing that changes when nothing that matters changed: no timestamps and no git commit (a
    commit that only edits the README must not change a byte; the commit is an MLflow tag, and
    dvc.lock's history says which commit wrote which output). The same seed on the same machine
    gives identical bytes.
    """
    return {
        "stage": stage,
        "iteration": iteration,
        "params": params,
        "versions": _versions(),
        "outputs": outputs,
    }
