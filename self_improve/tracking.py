"""MLflow, as an observer only: one parent run per loop, one child run per iteration.

Stages never depend on it: with `tracking.enabled: false` (or SELF_IMPROVE_TRACKING=0) every
stage runs the same and `NoOpTracker` swallows the calls. The store defaults to the SQLite file
`mlflow.db` at the repo root; MLFLOW_TRACKING_URI overrides it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from self_improve.artifacts import git_sha
from self_improve.config import TrackingConfig

log = logging.getLogger(__name__)
DEFAULT_URI = "sqlite:///mlflow.db"


def shown(uri: str) -> str:
    """`uri` as a log line may show it: a password in it (http://user:secret@host) replaced."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(uri)
    except ValueError:
        return "<tracking URI>"
    if parts.password is None:
        return uri
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def default_uri() -> str:
    """The SQLite store at the repo root. DVC sets DVC_ROOT to the user's repo, also while
    `dvc exp run --temp` runs the loop in a temporary copy, so experiments land in one store."""
    root = os.environ.get("DVC_ROOT")
    return f"sqlite:///{Path(root).resolve() / 'mlflow.db'}" if root else DEFAULT_URI


@dataclass
class IterationRecord:
    """What MLflow gets for one iteration (a child run)."""

    iteration: str
    step: int
    metrics: dict[str, float]
    # (context, {"source": path, "digest": md5 of its bytes, "rows": n}): the artifact stays in DVC
    datasets: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)  # artifact file -> rows


@dataclass
class LoopRecord:
    """What MLflow gets for one loop (the parent run)."""

    name: str
    params: dict[str, Any]
    tags: dict[str, str]
    iterations: list[IterationRecord]
    artifacts: list[Path] = field(default_factory=list)


class Tracker(Protocol):
    def log_loop(self, record: LoopRecord) -> str | None: ...


class NoOpTracker:
    def log_loop(self, record: LoopRecord) -> None:
        return None


class MlflowTracker:
    def __init__(self, experiment: str, uri: str | None = None):
        self.experiment = experiment
        self.uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or default_uri()

    def _store_lock(self) -> contextlib.AbstractContextManager:
        """A lock beside a SQLite store: MLflow creating (migrating) a new store is not safe
        against a second process doing the same, so loggers take turns."""
        if not self.uri.startswith("sqlite:///"):
            return contextlib.nullcontext()
        from filelock import FileLock

        return FileLock(self.uri.removeprefix("sqlite:///") + ".lock", timeout=600)

    def log_loop(self, record: LoopRecord) -> str | None:
        """The loop's runs, or None where the store failed (a server down, a full disk): tracking
        observes the loop and never fails it; the warning says how to send the record again."""
        # an unreachable server: a few retries, not MLflow's minutes of them (a user's setting wins)
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
        try:
            with self._store_lock():
                return self._log_loop(record)
        except Exception as err:  # noqa: BLE001 - whatever the store raised, the loop's outputs stand
            log.warning("MLflow tracking at %s failed (%s: %s); every output is written. Send the record "
                        "again once the store is back: make mlflow-resend", shown(self.uri), type(err).__name__,
                        (str(err).splitlines()[0][:300] if str(err) else "").replace(self.uri, shown(self.uri)))
            return None

    def _log_loop(self, record: LoopRecord) -> str:
        """Parent run with every metric at step = iteration; a child run per iteration with its
        prompts and pairs as dataset inputs and its example tables; the reports as artifacts."""
        import mlflow
        from mlflow.data.meta_dataset import MetaDataset

        mlflow.set_tracking_uri(self.uri)
        mlflow.set_experiment(self.experiment)
        with mlflow.start_run(run_name=record.name, tags=record.tags) as parent:
            mlflow.log_params({k: str(v) for k, v in record.params.items()})
            for it in record.iterations:
                mlflow.log_metrics(it.metrics, step=it.step)
                with mlflow.start_run(run_name=f"{record.name}/{it.iteration}", nested=True,
                                      tags={**record.tags, "iteration": it.iteration}):
                    mlflow.log_params({"iteration": it.iteration, "step": it.step})
                    mlflow.log_metrics(it.metrics, step=it.step)
                    for context, meta in it.datasets:
                        ds = MetaDataset(_source(meta["source"]), name=f"{it.iteration}-{context}",
                                         digest=meta["digest"][:36])
                        mlflow.log_input(ds, context=context, tags={"rows": str(meta["rows"])})
                    for name, rows in it.tables.items():
                        rows = rows if len(rows) else rows.astype(object)
                        mlflow.log_table(rows, artifact_file=name)
                        mlflow.log_table(rows, artifact_file=name, run_id=parent.info.run_id)
            for path in record.artifacts:
                if path.is_dir():
                    mlflow.log_artifacts(str(path), artifact_path=path.name)
                elif path.is_file():
                    mlflow.log_artifact(str(path))
            return parent.info.run_id


def _source(path: str):
    """MLflow's record of a local file: its absolute path, as a local artifact source."""
    from mlflow.data.dataset_source_registry import get_registered_sources

    local = next(c for c in get_registered_sources() if c.__name__ == "LocalArtifactDatasetSource")
    return local(str(Path(path).resolve()))


def make_tracker(cfg: TrackingConfig) -> Tracker:
    if not cfg.enabled or os.environ.get("SELF_IMPROVE_TRACKING", "1").lower() in ("0", "false", "off"):
        return NoOpTracker()
    return MlflowTracker(cfg.experiment)


def run_identity() -> tuple[str, dict[str, str]]:
    """The parent run's name and tags: the DVC experiment, else the Prefect flow run, else `loop`."""
    # DVC names `dvc exp run` experiments; a Prefect flow run in its own worktree names its own
    exp = os.environ.get("DVC_EXP_NAME") or os.environ.get("SELF_IMPROVE_EXPERIMENT", "")
    flow_run = os.environ.get("SELF_IMPROVE_FLOW_RUN_ID", "")
    flow_name = os.environ.get("SELF_IMPROVE_FLOW_RUN_NAME", "")
    name = exp or (f"prefect-{flow_name}" if flow_name else "") or "loop"
    tags = {"git_commit": git_sha() or "", "dvc_experiment": exp}
    if flow_run:
        tags.update(prefect_flow_run_id=flow_run, prefect_flow_run_name=flow_name)
    return name, tags
