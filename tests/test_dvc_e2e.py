"""Real tools end to end: `dvc repro` on a tiny config in a temporary git copy of the repo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import deep_merge, git_copy, tiny_full

pytestmark = pytest.mark.e2e


def sh(args: list[str], cwd: Path, env: dict) -> str:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{args} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A git copy of the tracked files with the tiny params, and `dvc repro` run once."""
    work = tmp_path_factory.mktemp("repo")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "MLFLOW_TRACKING_URI": f"sqlite:///{work}/mlflow.db"}
    git_copy(work, deep_merge(tiny_full(), {"tracking": {"enabled": True, "experiment": "e2e"}}), env)
    out = sh(["dvc", "repro"], work, env)
    return work, env, out


def test_repro_runs_every_stage_and_writes_metrics(repo):
    work, env, out = repo
    for stage in ("prepare", "evaluate_base", "evolve@it1", "judge@it2", "train@it3", "report"):
        assert f"Running stage '{stage}'" in out
    metrics = json.loads(sh(["dvc", "metrics", "show", "--json"], work, env))
    data = next(iter(metrics.values()))["data"]
    for it in ("it0", "it1", "it2", "it3"):
        m = data[f"reports/{it}/metrics.json"]["data"]
        assert {"accuracy", "ttt_accuracy", "maj_accuracy"} <= set(m)
        if it != "it0":
            assert {"reward_mean", "judge_accuracy", "num_pairs"} <= set(m)


def test_noop_and_single_stage_rerun(repo):
    work, env, _ = repo
    out = sh(["dvc", "repro"], work, env)
    assert "Running stage" not in out and "up to date" in out
    before = (work / "data/it2/judgments.parquet").read_bytes()
    out = sh(["dvc", "repro", "-s", "-f", "judge@it2"], work, env)
    assert "Running stage 'judge@it2'" in out and out.count("Running stage") == 1
    assert (work / "data/it2/judgments.parquet").read_bytes() == before
    assert json.loads(sh(["dvc", "status", "--json"], work, env)) == {}


def test_mlflow_parent_and_child_runs(repo):
    from mlflow.tracking import MlflowClient

    work, env, _ = repo
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("e2e")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert sorted(r.data.tags["iteration"] for r in children) == ["it0", "it1", "it2", "it3"]
    history = client.get_metric_history(parents[0].info.run_id, "ttt_accuracy")
    assert sorted(m.step for m in history) == [0, 1, 2, 3]
    it2 = next(r for r in children if r.data.tags["iteration"] == "it2")
    assert {"judge_accuracy", "reward_mean", "num_pairs"} <= set(it2.data.metrics)
    assert parents[0].data.params["judge.method"] == "co_reward"


def test_experiment_with_override(repo):
    work, env, _ = repo
    sh(["dvc", "exp", "run", "-n", "k3", "-S", "sample.k=3"], work, env)
    shown = json.loads(sh(["dvc", "exp", "show", "--json"], work, env))
    names = [e.get("name") for b in shown for e in (b.get("experiments") or []) for e in e.get("revs", [])]
    assert "k3" in names, shown
