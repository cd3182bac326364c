"""What a team server lets a caller do: the flows' parameters a UI or API caller sets are checked
against what exists before anything runs, the repo a run works on is the one it was served with, the
team servers refuse to start open beyond loopback, and no secret of the environment reaches an output."""

from __future__ import annotations

import sys
import uuid

import pytest

from flows.comas import self_improve_comas
from flows.loop import ROOT, check_repo, make_worktree, on_cancelled, self_improve_loop

HOSTILE = ["../../etc", "/etc/passwd", "x; rm -rf ~", "$(id)", "`id`", "a" * 10_000, "a\x00b", "line\nbreak",
           "tab\there"]
STRING_PARAMS = {self_improve_loop: ("recipe", "judge_method", "train_algorithm", "experiment_name"),
                 self_improve_comas: ("recipe", "experiment_name")}


@pytest.mark.parametrize("flow, param", [(f, p) for f, ps in STRING_PARAMS.items() for p in ps])
@pytest.mark.parametrize("value", HOSTILE, ids=lambda v: repr(v[:12]))
def test_a_hostile_string_parameter_is_refused_by_name(flow, param, value):
    """Prefect's own validation of the flow's parameters (what a run from the UI or the API meets)."""
    with pytest.raises(Exception, match=param):
        flow.validate_parameters({param: value})


@pytest.mark.parametrize("value", ["a" * 10_000, "a\x00b", "line\nbreak", ""])
def test_a_repo_that_is_no_path_is_refused_by_prefect(value):
    for flow in STRING_PARAMS:
        with pytest.raises(Exception, match="repo"):
            flow.validate_parameters({"repo": value})


@pytest.mark.parametrize("value", ["../../etc", "/etc", "/", "x; rm -rf ~", "$(id)"])
def test_a_repo_the_flow_was_not_served_with_is_refused_before_anything_runs(value, monkeypatch):
    monkeypatch.delenv("SELF_IMPROVE_REPOS", raising=False)
    with pytest.raises(ValueError, match=r"^repo: .*not a repo this flow may work on"):
        check_repo(value)


def test_the_served_repo_and_the_flows_own_checkout_are_allowed(tmp_path, monkeypatch):
    monkeypatch.delenv("SELF_IMPROVE_REPOS", raising=False)
    assert check_repo(str(ROOT)) == ROOT
    with pytest.raises(ValueError, match="not a repo this flow may work on"):
        check_repo(str(tmp_path))
    monkeypatch.setenv("SELF_IMPROVE_REPOS", str(tmp_path))  # what `flows.serve --repo` sets for its runs
    with pytest.raises(ValueError, match="holds no dvc.yaml and params.yaml"):
        check_repo(str(tmp_path))
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    (tmp_path / "params.yaml").write_text("seed: 0\n")
    assert check_repo(str(tmp_path / ".." / tmp_path.name)) == tmp_path.resolve()


def _flow_run(**parameters):
    from prefect.client.schemas.objects import FlowRun

    return FlowRun(flow_id=uuid.uuid4(), name="brisk-otter", parameters=parameters)


def test_a_cancelled_run_leaves_no_worktree_and_its_log_says_cancelled(tmp_path, monkeypatch, caplog):
    """The hook the serving process runs on a cancelled run: the worktree the killed run left is removed
    (only under the repo it was served with, only by the name rule) and the run's last line says Cancelled."""
    import logging
    import subprocess

    from prefect.settings import PREFECT_LOGGING_TO_API_ENABLED, temporary_settings
    from prefect.states import Cancelling

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "dvc.yaml").write_text("stages: {}\n")
    (repo / "params.yaml").write_text("seed: 0\n")
    for args in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=repo, check=True)
    monkeypatch.setenv("SELF_IMPROVE_REPOS", str(repo))
    work = make_worktree(repo, "cancelled-k5", {"seed": 1})
    with caplog.at_level(logging.INFO, logger="prefect.flow_runs"), \
            temporary_settings({PREFECT_LOGGING_TO_API_ENABLED: False}):  # no server to ship to here
        on_cancelled(self_improve_loop, _flow_run(repo=str(repo), experiment_name="../../x"),
                     Cancelling(message="Flow run was cancelled."))
        assert work.exists()  # a name outside the rule touches nothing
        on_cancelled(self_improve_loop, _flow_run(repo=str(tmp_path), experiment_name="cancelled-k5"),
                     Cancelling(message="Flow run was cancelled."))
        assert work.exists()  # nor does a repo the flow was not served with
        on_cancelled(self_improve_loop, _flow_run(repo=str(repo), experiment_name="cancelled-k5"),
                     Cancelling(message="Flow run was cancelled."))
    assert not work.exists()
    assert "cancelled-k5" not in subprocess.run(["git", "worktree", "list"], cwd=repo, capture_output=True,
                                                text=True, check=True).stdout
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Cancelled:")]
    assert len(lines) == 3 and lines[-1] == (f"Cancelled: Flow run was cancelled. The run's process was stopped; "
                                             f"its worktree {work.resolve()} was removed.")
    assert lines[0].endswith("it left no worktree.")


SENTINEL = "s3cr3t-" + uuid.uuid4().hex  # not in any source file a workspace may copy
SECRETS = {"MLFLOW_TRACKING_PASSWORD": SENTINEL, "MLFLOW_TRACKING_USERNAME": "team",
           "PREFECT_API_AUTH_STRING": f"admin:{SENTINEL}", "AWS_SECRET_ACCESS_KEY": SENTINEL,
           "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE"}


@pytest.mark.loop
def test_no_secret_of_the_environment_reaches_any_output(tmp_path, tiny_raw, monkeypatch, capfd, caplog):
    """A whole tiny loop logged to MLflow with the team's secrets in the environment (the tracking
    password, Prefect's auth string, the DVC remote's keys): none in any file of the workspace, in
    dvc-tracked metadata, in an MLflow param, tag or artifact, or in a log line."""
    import logging

    import mlflow
    import yaml

    from .conftest import run_all

    caplog.set_level(logging.DEBUG)
    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)
    store = tmp_path / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
    tiny_raw["tracking"] = {"enabled": True, "experiment": "sweep"}
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(tiny_raw))
    work = tmp_path / "work"
    work.mkdir()
    run_all(work, params, monkeypatch)
    leaked = [str(p) for p in tmp_path.rglob("*") if p.is_file() and p != store
              and SENTINEL.encode() in p.read_bytes()]
    assert not leaked, leaked
    out, err = capfd.readouterr()
    assert SENTINEL not in out + err + caplog.text
    client = mlflow.tracking.MlflowClient(f"sqlite:///{store}")
    runs = client.search_runs([client.get_experiment_by_name("sweep").experiment_id])
    assert runs  # the loop was logged
    for run in runs:
        assert SENTINEL not in repr(run.data.params) + repr(run.data.tags)
        for art in client.list_artifacts(run.info.run_id):
            if not art.is_dir:
                path = client.download_artifacts(run.info.run_id, art.path, str(tmp_path / "dl"))
                assert SENTINEL.encode() not in open(path, "rb").read(), art.path
    assert SENTINEL.encode() not in store.read_bytes()


def test_a_tracking_uri_with_a_password_is_never_logged(caplog):
    """A server down, the tracking URI holding credentials: the warning names the server, not the password."""
    from self_improve.tracking import LoopRecord, MlflowTracker, shown

    uri = f"http://team:{SENTINEL}@127.0.0.1:9/"
    assert shown(uri) == "http://team:***@127.0.0.1:9/" and shown("sqlite:///x.db") == "sqlite:///x.db"
    import os
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
    assert MlflowTracker("e", uri).log_loop(LoopRecord("r", {}, {}, [], [])) is None
    assert "127.0.0.1" in caplog.text and SENTINEL not in caplog.text


def test_team_servers_beyond_loopback_refuse_to_start_open(tmp_path):
    """`make mlflow-server` / `make prefect-server`: on loopback as before; beyond it (or --auth) only
    with their secrets in the environment, each missing one named; none on the command line."""
    from self_improve.team import Refused, is_loopback, mlflow_command, prefect_command

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.5") and not is_loopback("tracking-host")
    args = ("sqlite:///s.db", str(tmp_path / "a"), False, "sqlite:///auth.db")
    cmd, _ = mlflow_command("127.0.0.1", 5000, *args, env={})
    assert "--app-name" not in cmd
    with pytest.raises(Refused, match="MLFLOW_AUTH_ADMIN_PASSWORD is not set"):
        mlflow_command("0.0.0.0", 5000, *args, env={"MLFLOW_FLASK_SERVER_SECRET_KEY": "k"})
    with pytest.raises(Refused, match="MLFLOW_FLASK_SERVER_SECRET_KEY is not set"):
        mlflow_command("0.0.0.0", 5000, *args, env={"MLFLOW_AUTH_ADMIN_PASSWORD": "x"})
    with pytest.raises(Refused, match="old default password"):
        mlflow_command("0.0.0.0", 5000, *args, env={"MLFLOW_AUTH_ADMIN_PASSWORD": "password1234",
                                                    "MLFLOW_FLASK_SERVER_SECRET_KEY": "k"})
    env = {"MLFLOW_AUTH_ADMIN_PASSWORD": SENTINEL, "MLFLOW_FLASK_SERVER_SECRET_KEY": "k" * 32}
    cmd, out = mlflow_command("0.0.0.0", 5000, *args, env=env, config_dir=tmp_path / "conf")
    assert cmd[-2:] == ["--app-name", "basic-auth"] and SENTINEL not in " ".join(cmd)
    ini = tmp_path / "conf" / "basic_auth.ini"
    assert out["MLFLOW_AUTH_CONFIG_PATH"] == str(ini) and oct(ini.stat().st_mode & 0o777) == "0o600"
    assert "database_uri = sqlite:///auth.db" in ini.read_text() and SENTINEL not in ini.read_text()
    cmd, out = prefect_command("127.0.0.1", 4200, False, env={})
    assert out["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"
    with pytest.raises(Refused, match="PREFECT_SERVER_API_AUTH_STRING is not set"):
        prefect_command("0.0.0.0", 4200, False, env={})
    with pytest.raises(Refused, match="expected user:password"):
        prefect_command("0.0.0.0", 4200, False, env={"PREFECT_SERVER_API_AUTH_STRING": "nocolon"})
    cmd, _ = prefect_command("0.0.0.0", 4200, False, env={"PREFECT_SERVER_API_AUTH_STRING": f"team:{SENTINEL}"})
    assert SENTINEL not in " ".join(cmd)
