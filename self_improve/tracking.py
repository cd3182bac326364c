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


LIVE = "self_improve.live"  # the tag of a parent run whose iterations are logged as they end: the loop's key


class Tracker(Protocol):
    def log_loop(self, record: LoopRecord, key: str = "") -> str | None: ...

    def log_iteration(self, name: str, tags: dict[str, str], key: str, record: IterationRecord) -> str | None: ...


class NoOpTracker:
    def log_loop(self, record: LoopRecord, key: str = "") -> None:
        return None

    def log_iteration(self, name: str, tags: dict[str, str], key: str, record: IterationRecord) -> None:
        return None


def loop_key(params_file: str | Path) -> str:
    """What names one loop while it runs: its workspace and its params file (a digest). The evaluation of
    each iteration logs to the running parent run of that key; the report finishes it."""
    import hashlib

    text = Path(params_file).read_bytes()
    return hashlib.sha256(str(Path.cwd().resolve()).encode() + b"\n" + text).hexdigest()[:32]


def numeric(metrics: dict[str, Any]) -> dict[str, float]:
    """The metrics MLflow takes: finite numbers (not the step, which is MLflow's own)."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and v == v and k != "step"}


def log_as_it_ends(params_file: str | Path, iteration: str, step: int, metrics: dict[str, Any]) -> str | None:
    """An iteration's metrics to MLflow as soon as its evaluation ends, so a loop's iterations compare
    while it runs. Tracking is an observer: its settings are read here, outside the stage's declared
    params, since no output depends on them (turning tracking off reruns nothing)."""
    from self_improve.config import load_params

    tracker = make_tracker(load_params(str(params_file)).tracking)
    name, tags = run_identity()
    return tracker.log_iteration(name, tags, loop_key(params_file), IterationRecord(iteration, step, numeric(metrics)))


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

    def _guarded(self, what, *args):
        """`what(*args)`, or None where the store failed (a server down, a full disk): tracking
        observes the loop and never fails it; the warning says how to send the record again."""
        # an unreachable server: a few retries, not MLflow's minutes of them (a user's setting wins)
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
        try:
            with self._store_lock():
                return what(*args)
        except Exception as err:  # noqa: BLE001 - whatever the store raised, the loop's outputs stand
            log.warning("MLflow tracking at %s failed (%s: %s); every output is written. Send the record "
                        "again once the store is back: make mlflow-resend", shown(self.uri), type(err).__name__,
                        (str(err).splitlines()[0][:300] if str(err) else "").replace(self.uri, shown(self.uri)))
            return None

    def log_loop(self, record: LoopRecord, key: str = "") -> str | None:
        """The loop's runs (finishing the running parent of `key` that its iterations logged to, if any),
        or None where the store failed."""
        return self._guarded(self._log_loop, record, key)

    def log_iteration(self, name: str, tags: dict[str, str], key: str, record: IterationRecord) -> str | None:
        """One iteration's metrics as its evaluation ends: on the loop's running parent run (`key`; made
        now, named `name` with `tags`, if there is none) at step = iteration, and in its child run."""
        return self._guarded(self._log_iteration, name, tags, key, record)

    def _experiment(self):
        import mlflow

        mlflow.set_tracking_uri(self.uri)
        return mlflow.set_experiment(self.experiment).experiment_id

    @staticmethod
    def _running(client, experiment_id: str, key: str):
        """The running parent run of loop `key`, and its children by iteration."""
        if not key:
            return None, {}
        runs = client.search_runs([experiment_id], f"tags.`{LIVE}` = '{key}' and attributes.status = 'RUNNING'",
                                  order_by=["attributes.start_time DESC"], max_results=1)
        if not runs:
            return None, {}
        parent = runs[0].info.run_id
        kids = client.search_runs([experiment_id], f"tags.`mlflow.parentRunId` = '{parent}'")
        return parent, {r.data.tags.get("iteration"): r for r in kids}

    def _log_iteration(self, name: str, tags: dict[str, str], key: str, it: IterationRecord) -> str:
        import time

        from mlflow import MlflowClient
        from mlflow.entities import Metric, Param

        client = MlflowClient(self.uri)
        experiment_id = self._experiment()
        parent, kids = self._running(client, experiment_id, key)
        if parent is None:  # left running: the report finishes it
            parent = client.create_run(experiment_id, run_name=name, tags={**tags, LIVE: key}).info.run_id
        child = kids.get(it.iteration)
        child = child.info.run_id if child else client.create_run(
            experiment_id, run_name=f"{name}/{it.iteration}",
            tags={**tags, "iteration": it.iteration, "mlflow.parentRunId": parent}).info.run_id
        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, it.step) for k, v in it.metrics.items()]
        client.log_batch(parent, metrics=metrics)
        client.log_batch(child, metrics=metrics,
                         params=[Param("iteration", it.iteration), Param("step", str(it.step))])
        client.set_terminated(child)
        return parent

    def _log_loop(self, record: LoopRecord, key: str = "") -> str:
        """Parent run with every metric at step = iteration; a child run per iteration with its
        prompts and pairs as dataset inputs and its example tables; the reports as artifacts. The
        parent and children the iterations logged to as they ended are reused, and only what they
        lack is logged to them."""
        import mlflow
        from mlflow.data.meta_dataset import MetaDataset

        client = mlflow.MlflowClient(self.uri)
        experiment_id = self._experiment()
        live, kids = self._running(client, experiment_id, key)
        with mlflow.start_run(run_id=live, run_name=None if live else record.name, tags=record.tags) as parent:
            if live:
                mlflow.set_tags(record.tags)
            mlflow.log_params({k: str(v) for k, v in record.params.items()})
            for it in record.iterations:
                child = kids.get(it.iteration)
                logged = child.data.metrics if child else {}
                new = {k: v for k, v in it.metrics.items() if logged.get(k) != v}
                mlflow.log_metrics(new, step=it.step)
                with mlflow.start_run(run_id=child.info.run_id if child else None, nested=True,
                                      run_name=None if child else f"{record.name}/{it.iteration}",
                                      tags={**record.tags, "iteration": it.iteration}):
                    mlflow.log_params({"iteration": it.iteration, "step": it.step})
                    mlflow.log_metrics(new, step=it.step)
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
