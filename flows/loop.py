"""The loop as a Prefect flow: each task runs one DVC stage (`dvc repro -s <stage>@<iteration>`).

DVC stays the only DAG and cache, so work done by `dvc repro` is not redone here and the reverse.
Run it with `python -m flows.loop` (an ephemeral Prefect server starts if none is configured).
This module imports neither stage code nor models.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from filelock import FileLock, Timeout
from prefect import flow, get_run_logger, task

from .dag import stage_order


class WorkspaceBusy(RuntimeError):
    """Another loop flow holds this workspace."""


def _run_name() -> str:
    from prefect.runtime import task_run

    stage = task_run.parameters["stage"]
    name, _, it = stage.partition("@")
    return f"{it}-{name}" if it else name


@task(task_run_name=_run_name, retries=2, retry_delay_seconds=[5, 30])
def repro_stage(stage: str, repo: str) -> None:
    """`dvc repro -s` one stage, streaming its output to the Prefect logs."""
    logger = get_run_logger()
    # The stages' `python` must be this interpreter, whether or not the venv is activated.
    from prefect.runtime import flow_run

    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
           # the report stage tags its MLflow runs with the flow run that made them
           "SELF_IMPROVE_FLOW_RUN_ID": str(flow_run.id or ""), "SELF_IMPROVE_FLOW_RUN_NAME": str(flow_run.name or "")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dvc", "repro", "-s", stage],
        cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        if line and "it/s]" not in line and "seq/s]" not in line:
            logger.info(line)
    if proc.wait() != 0:
        raise RuntimeError(f"dvc repro -s {stage} exited with {proc.returncode}")


def workspace_lock(repo: str | Path) -> FileLock:
    """One loop flow per workspace: a second one is refused at once instead of interleaving.

    (Within one stage, DVC's own repo lock already keeps `dvc repro` runs apart.)
    """
    path = Path(repo) / ".dvc" / "tmp" / "self-improve-flow.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(path, timeout=0)


@flow(name="self-improve-loop", log_prints=True)
def self_improve_loop(repo: str = ".") -> list[str]:
    """Run every stage of the loop in dependency order; returns the stage names."""
    stages = stage_order(Path(repo))
    try:
        with workspace_lock(repo):
            for stage in stages:
                repro_stage(stage, repo)
    except Timeout:
        raise WorkspaceBusy(f"another self-improve flow is running on {Path(repo).resolve()}; "
                            "wait for it, or run this one in its own clone") from None
    return stages


if __name__ == "__main__":
    self_improve_loop(sys.argv[1] if len(sys.argv) > 1 else ".")
