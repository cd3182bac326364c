"""The loop deployed to a Prefect `process` work pool and run by a worker in another process, as a
team runs it: a real Prefect server that asks for the team's auth string, the pool, a worker, a run
triggered through the API with a parameter override (what the UI's form sends)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from research.mlflow_compare import free_port, wait_http

from .conftest import git_copy, tiny_full

pytestmark = pytest.mark.e2e
AUTH = "team:w0rker-e2e-Auth"


def _status(url: str, auth: str | None) -> int:
    import base64
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=b"{}", headers={"Content-Type": "application/json"}, method="POST")
    if auth is not None:
        req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


def _start(cmd: list[str], cwd: Path, env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_worker_runs_the_deployed_loop_with_an_override(tmp_path):
    params = tiny_full()
    params["loop"] = {"it1": {"prev": "it0", "ref": "init"}}  # one iteration: the report follows loop
    ws = tmp_path / "ws"
    ws.mkdir()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PREFECT_HOME": str(tmp_path / "prefect"), "MLFLOW_TRACKING_URI": f"sqlite:///{ws}/mlflow.db"}
    env.pop("PREFECT_API_URL", None)
    git_copy(ws, params, env)
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    # the team's server (make prefect-server): it asks every caller for the auth string
    server = _start([sys.executable, "-m", "self_improve.team", "prefect", "--auth", "--port", str(port)], tmp_path,
                    {**env, "PREFECT_SERVER_API_AUTH_STRING": AUTH}, tmp_path / "server.log")
    worker = None
    try:
        wait_http(f"{api}/health", server, 300)
        assert _status(f"{api}/flows/filter", None) == 401 and _status(f"{api}/flows/filter", "team:wrong") == 401
        assert _status(f"{api}/flows/filter", AUTH) == 200
        env["PREFECT_API_URL"] = api
        deploy = [sys.executable, "-m", "flows.deploy", "--repo", str(ws), "--pool", "team-cpu"]
        out = subprocess.run(deploy, cwd=ws, env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode != 0  # a client without the string is turned away
        env["PREFECT_API_AUTH_STRING"] = AUTH  # what make serve / deploy / worker read from the environment
        out = subprocess.run(deploy, cwd=ws, env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        worker_log = tmp_path / "worker.log"
        worker = _start([sys.executable, "-m", "prefect", "worker", "start", "--pool", "team-cpu", "--type",
                         "process", "--name", "worker-a"], ws, env, worker_log)
        run, task_runs = asyncio.run(_trigger_and_wait(api, {"samples_per_prompt": 3}))
        assert run.state.type.value == "COMPLETED", (run.state, worker_log.read_text()[-3000:])
        assert run.work_pool_name == "team-cpu" and run.parameters["samples_per_prompt"] == 3
        assert str(run.id) in worker_log.read_text()  # that worker picked it up, in its own process
        from runners.dag import stage_order

        stages = stage_order(ws)
        names = sorted(r.name for r in task_runs)
        assert len(names) == len(stages) and {"check_params", "prepare", "it1-judge", "report"} <= set(names)
        assert {r.state.type.value for r in task_runs} == {"COMPLETED"}
        # the override ran as its own DVC experiment, with k = 3
        shown = subprocess.run(["dvc", "exp", "show", "--json"], cwd=ws, env=env, capture_output=True,
                               text=True, check=True).stdout
        assert f"flow-{run.name}" in shown and '"k":3' in shown.replace(" ", "")  # sample.k (tiny: 2)
        # hostile values from the API: each refused by name, nothing run (no run created, or one that
        # fails on its repo before any stage)
        from .test_team import HOSTILE

        for param in ("recipe", "judge_method", "train_algorithm", "experiment_name"):
            for value in HOSTILE:
                refused = asyncio.run(_refused(api, {param: value}))
                assert param in refused, (param, value, refused)
        before = subprocess.run(["dvc", "exp", "list", "--name-only"], cwd=ws, env=env, capture_output=True,
                                text=True, check=True).stdout
        for repo in ("/etc", "../../.."):
            bad, bad_tasks = asyncio.run(_trigger_and_wait(api, {"repo": repo, "samples_per_prompt": 3}))
            assert bad.state.type.value == "FAILED" and not bad_tasks, bad.state
            assert "repo: " in (bad.state.message or "") and "not a repo this flow may work on" in bad.state.message
        assert subprocess.run(["dvc", "exp", "list", "--name-only"], cwd=ws, env=env, capture_output=True,
                              text=True, check=True).stdout == before
    finally:
        if worker is not None:
            _stop(worker)
        _stop(server)


async def _refused(api: str, parameters: dict) -> str:
    """The API's refusal of a run of the deployment with `parameters` (what the UI's form sends)."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api, PREFECT_API_AUTH_STRING: AUTH}):
        async with get_client() as client:
            deployment = await client.read_deployment_by_name("self-improve-loop/self-improve")
            try:
                run = await client.create_flow_run_from_deployment(deployment.id, parameters=parameters)
            except Exception as err:  # noqa: BLE001 - the API's validation error, whatever its type
                return str(err)
            await client.delete_flow_run(run.id)
            return f"accepted: {run.id}"


async def _trigger_and_wait(api: str, parameters: dict):
    """Create a run of the deployment as the UI's form does, wait for its final state; the run
    and its task runs, read through `api` whatever another test's harness set for this process."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.client.schemas.sorting import TaskRunSort
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api, PREFECT_API_AUTH_STRING: AUTH}):
        async with get_client() as client:
            deployment = await client.read_deployment_by_name("self-improve-loop/self-improve")
            created = await client.create_flow_run_from_deployment(deployment.id, parameters=parameters)
            deadline = time.time() + 900
            while True:
                run = await client.read_flow_run(created.id)
                if run.state is not None and run.state.is_final():
                    break
                assert time.time() < deadline, f"flow run still {run.state} after 15 min"
                await asyncio.sleep(3)
            task_runs = await client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])),
                sort=TaskRunSort.EXPECTED_START_TIME_DESC, limit=200)
    return run, task_runs
