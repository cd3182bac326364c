"""The Prefect flow on a tiny config: every stage a task, the DVC cache shared with `dvc repro`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from .conftest import git_copy, tiny_full

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="session")
def prefect_harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=300):
        yield


@pytest.mark.heavy  # a whole loop through Prefect: `make test-e2e`, not CI (the worker test runs one)
def test_flow_runs_every_stage_as_a_task(tmp_path, prefect_harness, monkeypatch):
    from prefect.client.orchestration import get_client

    from flows.loop import self_improve_loop, stage_order

    from .conftest import deep_merge

    git_copy(tmp_path, deep_merge(tiny_full(), {"tracking": {"enabled": True, "experiment": "flow"}}),
             dict(os.environ))
    monkeypatch.setenv("SELF_IMPROVE_REPOS", str(tmp_path))  # as `flows.serve --repo` names it
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)

    # Another DVC process holds the repo for the first seconds: the first stage (check_params)
    # fails on DVC's lock, is retried after its backoff, and the flow completes.
    import zc.lockfile

    (tmp_path / ".dvc" / "tmp").mkdir(parents=True, exist_ok=True)
    held = zc.lockfile.LockFile(str(tmp_path / ".dvc" / "tmp" / "lock"))
    threading.Timer(10, held.close).start()
    state = self_improve_loop(str(tmp_path), return_state=True)
    assert state.is_completed(), state
    stages = state.result()
    assert stages == stage_order(tmp_path) and "judge@it2" in stages

    import asyncio

    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.client.schemas.sorting import TaskRunSort

    async def task_runs():
        async with get_client() as client:
            return await client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id])),
                sort=TaskRunSort.EXPECTED_START_TIME_DESC, limit=200,
            )

    task_list = asyncio.run(task_runs())
    runs = {r.name: r.state.type.value for r in task_list}
    assert "it2-judge" in runs and "prepare" in runs
    assert len(runs) == len(stages) and set(runs.values()) == {"COMPLETED"}
    attempts = {r.name: r.run_count for r in task_list}
    assert attempts["check_params"] == 2 and attempts["prepare"] == 1 and attempts["it1-sample"] == 1

    async def artifacts():
        # by key, the newest version: what the UI's artifact pages show
        async with get_client() as client:
            found = {}
            for key in ("metrics-it0", "metrics-it1", "metrics-it2", "metrics-it3", "iterations"):
                resp = await client._client.get(f"/artifacts/{key}/latest")
                assert resp.status_code == 200, (key, resp.text)
                found[key] = resp.json()
            return found

    made = asyncio.run(artifacts())
    flow_run_id = str(state.state_details.flow_run_id)
    assert {a["flow_run_id"] for a in made.values()} == {flow_run_id}
    assert made["metrics-it2"]["type"] == "markdown" and "ttt_accuracy" in made["metrics-it2"]["data"]
    table = made["iterations"]["data"]
    assert made["iterations"]["type"] == "table" and len(json.loads(table) if isinstance(table, str) else table) == 4
    for it in ("it0", "it1", "it2", "it3"):
        assert (tmp_path / "reports" / "iterations" / it / "metrics.json").is_file()
    # the flow and `dvc repro` share one cache: nothing is left to do
    out = subprocess.run([sys.executable, "-m", "dvc", "status", "dvc.yaml"], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    assert "up to date" in out.stdout, out.stdout
    # the loop's MLflow parent run is named after the flow run and tagged with its id
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    parents = [r for r in client.search_runs([client.get_experiment_by_name("flow").experiment_id])
               if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1
    assert parents[0].data.tags["prefect_flow_run_id"] == str(state.state_details.flow_run_id)
    assert parents[0].info.run_name.startswith("prefect-")


def test_a_second_flow_on_the_same_workspace_is_refused(tmp_path, prefect_harness, monkeypatch):
    from flows.loop import WorkspaceBusy, self_improve_loop, workspace_lock

    git_copy(tmp_path, tiny_full(), dict(os.environ))
    monkeypatch.setenv("SELF_IMPROVE_REPOS", str(tmp_path))
    with workspace_lock(tmp_path):  # as a running flow holds it
        state = self_improve_loop(str(tmp_path), return_state=True)
    assert state.is_failed()
    with pytest.raises(WorkspaceBusy, match="another self-improve flow is running"):
        state.result()
    assert not (tmp_path / "data" / "task").exists()  # nothing ran


@pytest.mark.heavy  # a whole loop through Prefect: `make test-e2e`, not CI (the worker test runs one)
def test_the_comas_flow_runs_its_stages_with_an_override_as_an_experiment(tmp_path, prefect_harness, bpe_model_dir,
                                                                          monkeypatch):
    """CoMAS's flow: the loop's base stages and comas/dvc.yaml's, each a task, in a worktree (an
    override given) that ends as a DVC experiment; the working copy is untouched."""
    from flows.comas import self_improve_comas
    from runners.dag import comas_order

    from .conftest import deep_merge

    raw = deep_merge(tiny_full(), {
        "model": {"base": str(bpe_model_dir), "max_length": 160}, "evaluate": {"max_new_tokens": 4},
        "train": {"batch_size": 8, "epochs": 1, "lora": {"r": 4, "alpha": 8}},
        "agents": {"rounds": 1, "references": 1, "problems": 2, "max_new_tokens": 6, "loop": {"it1": {"prev": "it0"}}}})
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    git_copy(tmp_path, raw, env)
    before = (tmp_path / "params.yaml").read_bytes()
    monkeypatch.setenv("SELF_IMPROVE_REPOS", str(tmp_path))
    state = self_improve_comas(str(tmp_path), agents=3, experiment_name="comas-3", return_state=True)
    assert state.is_completed(), state
    assert state.result() == comas_order(tmp_path)
    assert state.result()[-1] == "comas/dvc.yaml:comas_report"
    assert (tmp_path / "params.yaml").read_bytes() == before
    shown = subprocess.run([sys.executable, "-m", "dvc", "exp", "show", "--json"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, check=True).stdout
    assert "comas-3" in shown


@pytest.mark.heavy  # a whole loop through Prefect: `make test-e2e`, not CI
def test_a_six_iteration_recipe_runs_through_the_flow_and_stops_early(tmp_path, prefect_harness, monkeypatch):
    """The flow with recipe `long` (it4-it6 and the stop) runs every stage of six iterations as tasks, in a
    worktree that ends as a DVC experiment; with patience 1 the iterations after the first that does not
    pass the rule pose no prompts and train nothing, and the summary says where the loop stopped."""
    from flows.loop import self_improve_loop

    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    git_copy(tmp_path, tiny_full(), env)
    # a user's own recipe, composed after `long` (whose patience is 3)
    (tmp_path / "configs" / "recipes" / "patience-1.yaml").write_text("stop:\n  patience: 1\n")
    monkeypatch.setenv("SELF_IMPROVE_REPOS", str(tmp_path))
    state = self_improve_loop(str(tmp_path), recipe="long,patience-1", experiment_name="long", return_state=True)
    assert state.is_completed(), state
    stages = state.result()
    assert "evaluate@it6" in stages and stages[-1] == "report"
    subprocess.run([sys.executable, "-m", "dvc", "exp", "apply", "long"], cwd=tmp_path, env=env, check=True,
                   capture_output=True)
    its = ("it1", "it2", "it3", "it4", "it5", "it6")
    stops = {it: json.loads((tmp_path / "data" / it / "stop.json").read_text()) for it in its}
    first = next(it for it, s in stops.items() if s["stopped"])  # the tiny base: it1 passes no 2-point rise
    for it in its[its.index(first):]:
        assert stops[it]["stopped"] and stops[it]["at"] == stops[first]["at"]
        assert json.loads((tmp_path / "data" / it / "train_metrics.json").read_text())["train_examples"] == 0
    summary = (tmp_path / "reports" / "summary.md").read_text()
    assert f"**The loop stopped after {stops[first]['at']}**" in summary and "| it6 |" in summary
