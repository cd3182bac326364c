"""Real tools end to end: `dvc repro` on a tiny config in a temporary git copy of the repo."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml

from research.mlflow_compare import browse, chromium, free_port, screenshot, wait_http

from .conftest import GIT_ENV, ROOT, deep_merge, defines_something, git_copy, tiny_full
from .test_reliability import BAD_PARAMS

pytestmark = pytest.mark.e2e


def sh(args: list[str], cwd: Path, env: dict) -> str:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{args} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


PARAMS = deep_merge(tiny_full(), {"tracking": {"enabled": True, "experiment": "e2e"}})
# two iterations: it2 builds on a trained it1 and keeps it0 as its reference, as every later one would;
# each loop these tests run costs a third less than with the default three
PARAMS["loop"] = {"it1": {"prev": "it0", "ref": "init"}, "it2": {"prev": "it1", "ref": "it0"}}
SECRET = "dvc-remote-" + uuid.uuid4().hex  # a sentinel secret key for the DVC remote (not in any source file)
HEAVY = pytest.mark.heavy  # a whole extra loop (or CoMAS's) beyond the shared one: `make test-e2e`, not CI


def _env(work: Path) -> dict:
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "MLFLOW_TRACKING_URI": f"sqlite:///{work}/mlflow.db"}


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A git copy of the tracked files with the tiny params, and `dvc repro` run once."""
    work = tmp_path_factory.mktemp("repo")
    env = _env(work)
    git_copy(work, PARAMS, env)
    out = sh(["dvc", "repro"], work, env)
    return work, env, out


def test_repro_runs_every_stage_and_writes_metrics(repo):
    work, env, out = repo
    for stage in ("prepare", "evaluate_base", "evolve@it1", "judge@it2", "train@it2", "report"):
        assert f"Running stage '{stage}'" in out
    metrics = json.loads(sh(["dvc", "metrics", "show", "--json"], work, env))
    data = next(iter(metrics.values()))["data"]
    for it in ("it0", "it1", "it2"):
        m = data[f"reports/iterations/{it}/metrics.json"]["data"]
        assert {"accuracy", "ttt_accuracy", "maj_accuracy"} <= set(m)
        if it != "it0":
            assert {"reward_mean", "judge_accuracy", "num_pairs"} <= set(m)


def test_noop_and_single_stage_rerun(repo):
    work, env, _ = repo
    out = sh(["dvc", "repro"], work, env)
    assert "Running stage" not in out and "up to date" in out
    plots = json.loads(sh(["dvc", "plots", "show", "--json"], work, env))
    assert {"accuracy", "judge", "reward", "pairs", "length"} <= set(plots["data"])
    for name in ("accuracy", "judge", "reward", "pairs", "length"):
        png = (work / "reports" / "figures" / f"{name}.png").read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 5000
    summary = (work / "reports" / "summary.md").read_text()
    assert "## Best and worst judged samples" in summary and "### it2" in summary
    before = (work / "data/it2/judgments.parquet").read_bytes()
    # a commit that changes only the README changes no artifact: none embeds the commit
    (work / "README.md").write_text((work / "README.md").read_text() + "\nAn edit.\n")
    sh(["git", "commit", "-qam", "README only"], work, {**env, **GIT_ENV})
    out = sh(["dvc", "repro", "-s", "-f", "judge@it2"], work, env)
    assert "Running stage 'judge@it2'" in out and out.count("Running stage") == 1
    assert (work / "data/it2/judgments.parquet").read_bytes() == before
    assert json.loads(sh(["dvc", "status", "--json", "dvc.yaml"], work, env)) == {}


def _outputs(root: Path) -> dict[str, bytes]:
    files = [p for d in ("data", "reports") for p in (root / d).rglob("*") if p.is_file()]
    return {str(p.relative_to(root)): p.read_bytes() for p in files if p.name != "README.md"}


def _touches_loop(mutate) -> bool:
    raw = tiny_full()
    mutate(raw)
    return raw.get("loop") != tiny_full()["loop"]


# DVC resolves `loop` itself (foreach) before any stage runs; every other malformed params file
# is the check_params stage's to refuse, before any stage has deleted an output. One case per
# section here, and the two whose section is not a mapping (DVC itself cannot resolve those);
# tests/test_reliability.py refuses every case of BAD_PARAMS in-process.
_THROUGH_DVC = {"judge.methd: unknown key", "sampel: unknown key", "sample.k:", "sample:", "judge:",
                "train.algorithm:", "prepare.model.hidden_size:", "task.heldout_size:", "evolve.strategy:",
                "pairs.min_margin:", "evaluate.k:", "tracking.experiment:", "security.trust_remote_code:", "seed:"}
DVC_BAD_PARAMS = [(m, needle) for m, needle in BAD_PARAMS if not _touches_loop(m) and needle in _THROUGH_DVC]
DVC_BAD_PARAMS = [c for i, c in enumerate(DVC_BAD_PARAMS) if c[1] not in {n for _, n in DVC_BAD_PARAMS[:i]}]


def test_bad_params_through_dvc_repro_lose_nothing(repo):
    """Each malformed params file: `dvc repro` exits non-zero naming the key, every output of the
    workspace keeps its bytes, and with the good file back `dvc status` is clean."""
    work, env, _ = repo
    params = work / "params.yaml"
    good = params.read_bytes()
    before = _outputs(work)
    sections = {needle.split(".")[0] for _, needle in DVC_BAD_PARAMS}
    assert {"task", "prepare", "evolve", "sample", "judge", "train"} <= sections
    try:
        for mutate, needle in DVC_BAD_PARAMS:
            raw = yaml.safe_load(good)
            mutate(raw)
            params.write_text(yaml.safe_dump(raw))
            proc = subprocess.run(["dvc", "repro"], cwd=work, env=env, capture_output=True, text=True, timeout=300)
            said = proc.stdout + proc.stderr
            assert proc.returncode != 0, needle
            # check_params refused it naming the key, or (a section that is not a mapping any more)
            # DVC itself could not resolve dvc.yaml's ${...} from it, naming that key, and ran nothing
            refused = "check_params: error: params.yaml: " in said and needle in said
            unresolved = "failed to parse" in said and f"Could not find '{needle.split(':')[0].split('.')[0]}." in said
            assert refused or unresolved, said[-2000:]
            assert "Running stage 'prepare'" not in said
            assert _outputs(work) == before, f"{needle}: the workspace changed"
    finally:
        params.write_bytes(good)
    assert json.loads(sh(["dvc", "status", "--json", "dvc.yaml"], work, env)) == {}


@pytest.mark.parametrize("task, needle", [
    ({"datasets": [{"name": "no_such_dataset"}]}, "task.datasets[0]"),
    ({"datasets": [{"name": "chain_sum", "config": {"no_such_key": 1}}]}, "task.datasets[0]"),
    ({"datasets": [{"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1,
                                                    "max_digits": 1}}], "heldout_size": 400}, "too few distinct"),
])
def test_bad_reasoning_gym_datasets_through_dvc_repro_lose_nothing(repo, task, needle):
    """reasoning-gym refuses its own bad names, keys and values, and too-small sets: check_params
    stops `dvc repro` naming the entry before any stage deletes an output."""
    pytest.importorskip("reasoning_gym")
    work, env, _ = repo
    params = work / "params.yaml"
    good = params.read_bytes()
    before = _outputs(work)
    try:
        raw = yaml.safe_load(good)
        raw["task"].update(name="reasoning_gym", **task)
        params.write_text(yaml.safe_dump(raw))
        proc = subprocess.run(["dvc", "repro"], cwd=work, env=env, capture_output=True, text=True, timeout=300)
        said = proc.stdout + proc.stderr
        assert proc.returncode != 0 and "check_params: error:" in said and needle in said, said[-2000:]
        assert "Running stage 'prepare'" not in said
        assert _outputs(work) == before
    finally:
        params.write_bytes(good)


_OPEN = re.compile(r'^\d+\s+open(?:at)?\((?:AT_FDCWD, )?"([^"]+)", ([A-Z_|]+)[^)]*\)\s+=\s+(\d+)')
# what a stage may touch without declaring it: MLflow's store and the git commit it tags a run
# with (tracking only observes: no output depends on them), Python's bytecode caches
_UNDECLARED_OK = re.compile(r"^(mlflow\.db.*|mlruns/.*|mlartifacts/.*|\.git/.*|.*__pycache__.*|.*\.pyc)$")


def _reads(trace: Path, work: Path) -> set[str]:
    """Paths under `work` opened for reading (files, and directories listed), relative to it."""
    found = set()
    for line in trace.read_text(errors="replace").splitlines():
        m = _OPEN.match(line)
        if not m or "O_WRONLY" in m.group(2) or "O_RDWR" in m.group(2) or "O_CREAT" in m.group(2):
            continue
        path = Path(m.group(1))
        path = (path if path.is_absolute() else work / path).resolve()
        if path.is_relative_to(work.resolve()):
            found.add(str(path.relative_to(work.resolve())))
    return found


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace (.ci/run installs it)")
def test_every_file_a_stage_reads_is_declared_in_dvc_yaml(repo, tmp_path):
    """Run stages under strace: every file a stage opens is one of its deps or outs (or inside
    one), or a folder above one (listing it); params.yaml is read for the keys dvc.yaml names."""
    from dvc.repo import Repo

    probe = subprocess.run(["strace", "-f", "-qq", "-e", "trace=openat", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"strace cannot trace here: {probe.stderr.strip()[:200]}")
    # on a copy: rerunning stages here must not add MLflow runs or touch the shared workspace
    work = tmp_path / "ws"
    shutil.copytree(repo[0], work, symlinks=True)
    env = {**repo[1], "MLFLOW_TRACKING_URI": f"sqlite:///{work}/mlflow.db"}
    with Repo(str(work)) as dvc_repo:
        stages = {st.name: (st.cmd, [d.def_path for d in st.deps], [o.def_path for o in st.outs])
                  for st in dvc_repo.index.stages}
    chosen = [s for s in stages if "@" not in s or s.endswith("@it2")]
    assert {"check_params", "prepare", "judge@it2", "train@it2", "report"} <= set(chosen)
    for name in chosen:
        cmd, deps, outs = stages[name]
        trace = tmp_path / f"{name}.trace"
        proc = subprocess.run(["strace", "-f", "-qq", "-e", "trace=open,openat", "-o", str(trace), "bash", "-c", cmd],
                              cwd=work, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{name}: {proc.stderr[-2000:]}"
        declared = [p.rstrip("/") for p in deps + outs]
        undeclared = set()
        for path in _reads(trace, work):
            if (path in ("params.yaml", ".") or _UNDECLARED_OK.match(path)
                    or any(path == d or path.startswith(d + "/") or d.startswith(path + "/") for d in declared)
                    or (path.endswith("__init__.py") and not defines_something(work / path))):  # docstring only
                continue
            if (work / path).is_dir() and any((work / o).parent == work / path for o in outs):
                continue  # the folder an output is written into
            if any(path.startswith(str(Path(o).parent / f".{Path(o).name}.")) for o in outs):
                continue  # an output's temporary sibling (written, then renamed into place)
            undeclared.add(path)
        assert not undeclared, f"{name} reads {sorted(undeclared)} that dvc.yaml does not declare for it"
    assert json.loads(sh(["dvc", "status", "--json", "dvc.yaml"], work, env)) == {}


def _read_model_dir(path: Path) -> None:
    """Read every file a model directory of the pipeline needs: full weights, or an adapter chain
    (chain.json and each adapter), or a base record; FileNotFoundError when one is missing."""
    from safetensors import safe_open

    if (path / "chain.json").is_file():
        for name in json.loads((path / "chain.json").read_text())["adapters"]:
            with safe_open(path / "adapters" / name / "adapter_model.safetensors", framework="pt") as f:
                f.keys()
            json.loads((path / "adapters" / name / "adapter_config.json").read_text())
    elif (path / "base.json").is_file():
        json.loads((path / "base.json").read_text())
    else:
        with safe_open(path / "model.safetensors", framework="pt") as f:
            f.keys()
        json.loads((path / "config.json").read_text())


def _complete(path: Path) -> str | None:
    """Why the output at `path` is not a complete artifact, or None when it is (or is absent)."""
    import pyarrow.parquet as pq

    try:
        if path.suffix == ".parquet":
            pq.read_table(path)
        elif path.suffix == ".json":
            json.loads(path.read_text())
        elif path.name == "model":
            _read_model_dir(path)
    except FileNotFoundError:
        # gone while being read: DVC removing a stale output (a directory file by file) before
        # it reruns the stage is a removal, not a write; a model dir that stays incomplete is
        if path.name == "model":
            time.sleep(0.2)
            if path.exists():
                try:
                    _read_model_dir(path)
                except FileNotFoundError:
                    return f"{path}: incomplete"
    except Exception as err:  # noqa: BLE001 - any failure to read is the finding
        return f"{path}: {type(err).__name__}: {err}"
    return None


def test_sigkill_anywhere_then_repro_gives_the_same_artifacts(repo, tmp_path):
    """Kill `dvc repro` (and its stage) at several points; each rerun resumes; the end result
    equals the uninterrupted run's, and no output path ever held a partial artifact. While a
    run holds the workspace, a second `dvc repro` is refused."""
    work, _, _ = repo
    baseline = _outputs(work)
    kill = tmp_path / "kill"
    env = _env(kill)
    # a clone at the copy's first commit: the tracked dvc.lock and metrics of before the loop ran
    # (a later commit in the copy, test_noop's, holds the finished loop's, which would let
    # `dvc repro` skip stages whose outputs git already has)
    subprocess.run(["git", "clone", "-q", str(work), str(kill)], check=True)
    root = subprocess.run(["git", "rev-list", "--max-parents=0", "HEAD"], cwd=kill, capture_output=True,
                          text=True, check=True).stdout.strip()
    subprocess.run(["git", "reset", "-q", "--hard", root], cwd=kill, check=True)
    outs = [kill / "data" / f"it{i}" / n for i in range(3) for n in
            ("model", "prompts.parquet", "samples.parquet", "judgments.parquet", "pairs.parquet", "sft.parquet",
             "train_metrics.json")] + [kill / "data/task/heldout.parquet", kill / "data/task/ttt.parquet"]
    findings: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            findings.extend(f for f in map(_complete, outs) if f)
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    refused = None
    for marker, delay in (("'prepare'", 2.0), ("'sample@it1'", 1.0), ("'train@it1'", 1.0), ("'evaluate@it2'", 0.5)):
        proc = subprocess.Popen(["dvc", "repro"], cwd=kill, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        seen: list[str] = []
        for line in proc.stdout:
            seen.append(line)
            if f"Running stage {marker}" in line:
                break
        else:
            pytest.fail(f"{marker} never started:\n{''.join(seen)[-3000:]}")
        time.sleep(delay)
        if refused is None:
            refused = subprocess.run(["dvc", "repro"], cwd=kill, env=env, capture_output=True, text=True)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    sh(["dvc", "repro"], kill, env)
    stop.set()
    watcher.join()
    assert refused.returncode != 0 and "lock" in (refused.stdout + refused.stderr).lower()
    assert findings == []
    after = _outputs(kill)
    assert after.keys() == baseline.keys()
    assert [k for k in after if after[k] != baseline[k]] == []
    assert not list(kill.glob("data/**/.*.tmp"))


def test_mlflow_parent_and_child_runs(repo):
    from mlflow.tracking import MlflowClient

    work, env, _ = repo
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("e2e")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert sorted(r.data.tags["iteration"] for r in children) == ["it0", "it1", "it2"]
    history = client.get_metric_history(parents[0].info.run_id, "ttt_accuracy")
    assert sorted(m.step for m in history) == [0, 1, 2]
    it2 = next(r for r in children if r.data.tags["iteration"] == "it2")
    assert {"judge_accuracy", "reward_mean", "num_pairs", "response_length"} <= set(it2.data.metrics)
    parent = parents[0]
    assert parent.data.params["judge.method"] == "co_reward" and parent.data.params["train.lora.r"] == "16"
    # the commit the loop ran on: the copy's first (a later test commits a README edit)
    sha = subprocess.run(["git", "rev-list", "--max-parents=0", "HEAD"], cwd=work, capture_output=True,
                         text=True).stdout.strip()
    assert parent.info.run_name == "loop" and parent.data.tags["git_commit"] == sha
    assert "dvc_experiment" in parent.data.tags
    for child in children:
        it = child.data.tags["iteration"]
        inputs = {(d.dataset.name, d.tags[0].value) for d in child.inputs.dataset_inputs}
        assert inputs == (set() if it == "it0" else {(f"{it}-prompts", "prompts"), (f"{it}-pairs", "pairs")})
        if it != "it0":
            assert [a.path for a in client.list_artifacts(child.info.run_id, "examples")] == \
                [f"examples/{it}_judged.json", f"examples/{it}_pairs.json"]
    top = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"summary.md", "figures", "iterations.csv", "examples"} <= top
    figures = {a.path for a in client.list_artifacts(parent.info.run_id, "figures")}
    assert figures == {f"figures/{n}" for n in ("accuracy.png", "judge.png", "reward.png",
                                                 "pairs.png", "length.png", "categories.png")}


@HEAVY
def test_experiment_with_override(repo):
    work, env, _ = repo
    sh(["dvc", "exp", "run", "-n", "k3", "-S", "sample.k=3"], work, env)
    shown = json.loads(sh(["dvc", "exp", "show", "--json"], work, env))
    names = [e.get("name") for b in shown for e in (b.get("experiments") or []) for e in e.get("revs", [])]
    assert "k3" in names, shown
    # the experiment's results are in the workspace: `dvc metrics diff` against HEAD shows them
    diff = json.loads(sh(["dvc", "metrics", "diff", "--json"], work, env))
    assert "num_samples" in diff["reports/iterations/it1/metrics.json"]  # k = 3 instead of 4


@HEAVY
def test_a_six_iteration_recipe_runs_through_dvc_and_stops_early(tmp_path):
    """`self-improve exp long`: the recipe adds it4-it6 (DVC's `++` for iterations params.yaml lacks) and
    the stop; with patience 1
    the loop stops after the first iteration that does not pass the rule, and the later ones pose no
    prompts and train nothing, each a stage of `dvc exp run` all the same."""
    work = tmp_path / "repo"
    env = _env(work)
    git_copy(work, PARAMS, env)  # it1 and it2: the recipe's own keys add it3's link too
    run = [sys.executable, "-m", "runners.console", "exp", "long", "-S", "loop.it3.prev=it2", "-S", "loop.it3.ref=it1",
           "-S", "stop.patience=1", "-n", "long"]  # `self-improve exp`: dvc exp run with the recipe's -S
    args = sh(run + ["--dry-run"], work, env).split()
    assert "++loop.it6.prev=it5" in args and "++loop.it3.prev=it2" in args
    out = sh(run, work, env)
    assert "Running stage 'evaluate@it6'" in out and "Running stage 'report'" in out
    stops = {it: json.loads((work / "data" / it / "stop.json").read_text()) for it in
             ("it1", "it2", "it3", "it4", "it5", "it6")}
    first = next(it for it, s in stops.items() if s["stopped"])  # the tiny base: it1 passes no 2-point rise
    later = [it for it in stops if int(it[2:]) >= int(first[2:])]
    assert all(stops[it]["stopped"] and stops[it]["at"] == stops[first]["at"] for it in later)
    for it in later:
        assert json.loads((work / "data" / it / "train_metrics.json").read_text())["train_examples"] == 0
    summary = (work / "reports" / "summary.md").read_text()
    assert f"**The loop stopped after {stops[first]['at']}**" in summary and "| it6 |" in summary


@HEAVY
@pytest.mark.skipif(chromium() is None, reason="headless Chromium not installed (apt-get install chromium)")
def test_mlflow_ui_compares_two_loops_in_chromium(repo):
    """The MLflow UI's run comparison of two loops (the main run and experiment k3), rendered."""
    work, env, _ = repo
    out = work / "reports" / "mlflow_compare.png"
    dom = screenshot(env["MLFLOW_TRACKING_URI"], "e2e", ["loop", "k3"], out)
    assert "Comparing 2 Runs" in dom
    assert out.read_bytes().startswith(b"\x89PNG") and out.stat().st_size > 10_000


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory):
    """A real Prefect server (its own home and database) on a free local port."""
    port = free_port()
    home = tmp_path_factory.mktemp("prefect-home")
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                               "--port", str(port)], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/api/health", server, 300)
        yield port, env
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


async def _served_deployment(client, name: str = "self-improve-loop/self-improve"):
    """The deployment `flows.serve` registers, once it is there (two minutes at most)."""
    import asyncio

    for _ in range(120):
        try:
            return await client.read_deployment_by_name(name)
        except Exception:  # noqa: BLE001 - not registered yet
            await asyncio.sleep(1)
    raise AssertionError(f"{name} was not registered within two minutes")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_served_deployment_stops_within_seconds_of_a_signal(prefect_server, tmp_path, sig):
    """`make serve` (flows.serve) registers its deployments, then a SIGTERM or a Ctrl-C stops it, and its
    deployments are paused, within seconds (no SIGKILL needed)."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    port, penv = prefect_server
    log = tmp_path / "serve.log"
    served = subprocess.Popen([sys.executable, "-m", "flows.serve"], cwd=ROOT, env=penv, stdout=log.open("w"),
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        async def registered() -> bool:
            with temporary_settings({PREFECT_API_URL: penv["PREFECT_API_URL"]}):
                async with get_client() as client:
                    for _ in range(180):
                        try:
                            await client.read_deployment_by_name("self-improve-loop/self-improve")
                            return True
                        except Exception:  # noqa: BLE001 - not registered yet
                            await asyncio.sleep(1)
            return False

        assert asyncio.run(registered()), log.read_text()[-2000:]
        for _ in range(180):  # this process serving (a deployment of an earlier one stays registered)
            if "being served" in log.read_text():
                break
            time.sleep(1)
        time.sleep(2)
        started = time.perf_counter()
        os.killpg(served.pid, sig)
        served.wait(timeout=30)
        assert time.perf_counter() - started < 10 and served.returncode == 0, log.read_text()[-2000:]
        assert "All deployments have been paused" in log.read_text()
    finally:
        if served.poll() is None:
            os.killpg(served.pid, signal.SIGKILL)


@HEAVY
def test_a_cancelled_run_ends_cancelled_and_leaves_no_stage_running(repo, prefect_server):
    """Cancel a served run while a stage runs, as the UI's Cancel does (state Cancelling): the run ends
    Cancelled within a minute, no `dvc repro` or stage process of it is left and its worktree is gone.
    The run's log ends with the flows' on_cancellation hook saying it was cancelled."""
    import asyncio

    import psutil
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.objects import StateType
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.states import State

    work, env, _ = repo
    port, penv = prefect_server
    served = subprocess.Popen([sys.executable, "-m", "flows.serve", "--repo", str(work)], cwd=ROOT,
                              env={**env, **penv}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)

    def stage_processes() -> list[str]:
        out = []
        for proc in psutil.process_iter(["cmdline", "cwd"]):
            line = " ".join(proc.info["cmdline"] or [])
            if ("dvc repro" in line or "stages." in line) and str(work) in (proc.info["cwd"] or ""):
                out.append(line)
        return out

    try:
        with temporary_settings({PREFECT_API_URL: penv["PREFECT_API_URL"]}):
            async def cancel_midway():
                async with get_client() as client:
                    dep = await _served_deployment(client)
                    run = await client.create_flow_run_from_deployment(
                        dep.id, parameters={"samples_per_prompt": 5, "experiment_name": "cancelled-k5"})
                    for _ in range(600):  # until a stage process of the run is at work
                        if stage_processes():
                            break
                        await asyncio.sleep(0.5)
                    else:
                        run = await client.read_flow_run(run.id)
                        logs = await client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])))
                        raise AssertionError(f"no stage of the run started: {run.state}\n"
                                             + "\n".join(log.message for log in logs)[-3000:])
                    running = stage_processes()
                    await client.set_flow_run_state(run.id, State(type=StateType.CANCELLING), force=True)
                    started = time.perf_counter()
                    for _ in range(120):
                        run = await client.read_flow_run(run.id)
                        if run.state and run.state.is_final():
                            break
                        await asyncio.sleep(0.5)
                    took = time.perf_counter() - started
                    for _ in range(40):  # the serving process ships the hook's line in batches
                        logs = await client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])))
                        if any(log.message.startswith("Cancelled:") for log in logs):
                            break
                        await asyncio.sleep(0.5)
                    return run, took, running, [log.message for log in logs]

            run, took, running, messages = asyncio.run(cancel_midway())
    finally:
        os.killpg(served.pid, signal.SIGTERM)
        served.wait(timeout=60)
    assert running, "no stage was running when the run was cancelled"
    assert run.state.type.value == "CANCELLED" and took < 60, (run.state, took)
    for _ in range(20):  # the stage processes go with the run's process group
        if not stage_processes():
            break
        time.sleep(0.5)
    assert not stage_processes(), stage_processes()
    flows_tmp = work / ".dvc" / "tmp" / "flows"
    assert not flows_tmp.exists() or not [p for p in flows_tmp.iterdir() if "cancelled-k5" in p.name]
    # the run's log ends saying so (flows.loop.on_cancelled); the stopped engine's own last line, before
    # it, gives the state that process had seen (Running): the serving process, not it, ends the run
    said = [i for i, m in enumerate(messages) if m.startswith("Cancelled: ")]
    assert said, messages[-5:]
    assert all(i < said[-1] for i, m in enumerate(messages) if "Finished in state" in m), messages[-5:]


@HEAVY
def test_served_deployment_triggered_with_an_override(repo, prefect_server):
    """Serve the deployment, trigger it through the API as the UI does (an override), and find
    the result as a DVC experiment and an MLflow parent run tagged with the flow run; then the
    flow run and its stage tasks in the Prefect UI, in headless Chromium."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    work, env, _ = repo
    port, penv = prefect_server
    served = subprocess.Popen([sys.executable, "-m", "flows.serve", "--repo", str(work)], cwd=ROOT,
                              env={**env, **penv}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    before = (work / "params.yaml").read_bytes()
    try:
        with temporary_settings({PREFECT_API_URL: penv["PREFECT_API_URL"]}):
            async def trigger():
                async with get_client() as client:
                    dep = await _served_deployment(client)
                    props = dep.parameter_openapi_schema["properties"]
                    assert {"judge_method", "samples_per_prompt", "experiment_name"} <= set(props)
                    # what the UI's "Run" with a custom parameter does
                    run = await client.create_flow_run_from_deployment(
                        dep.id, parameters={"samples_per_prompt": 3, "experiment_name": "served-k3"})
                    for _ in range(900):
                        run = await client.read_flow_run(run.id)
                        if run.state and run.state.is_final():
                            return run
                        await asyncio.sleep(1)
                    raise AssertionError("the flow run did not finish")

            run = asyncio.run(trigger())
        assert run.state.is_completed(), run.state
    finally:
        os.killpg(served.pid, signal.SIGTERM)
        served.wait(timeout=60)
    assert (work / "params.yaml").read_bytes() == before  # the working copy is untouched
    assert not list((work / ".dvc" / "tmp" / "flows").iterdir())  # the worktree is gone
    shown = json.loads(sh(["dvc", "exp", "show", "--json"], work, env))
    names = [e.get("name") for b in shown for e in (b.get("experiments") or []) for e in e.get("revs", [])]
    assert "served-k3" in names
    from mlflow.tracking import MlflowClient

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    runs = client.search_runs([client.get_experiment_by_name("e2e").experiment_id],
                              filter_string="tags.prefect_flow_run_id = '%s'" % run.id)
    assert {r.info.run_name for r in runs if "mlflow.parentRunId" not in r.data.tags} == {"served-k3"}

    if chromium() is None:
        pytest.skip("headless Chromium not installed (apt-get install chromium)")
    url = f"http://127.0.0.1:{port}/runs/flow-run/{run.id}"
    dom = browse(chromium(), url, "--dump-dom")
    # a stage task's name in the run's logs; which stage the logs' first rendered chunk reaches varies
    assert run.name in dom and "self-improve" in dom and re.search(r"\bit1-[a-z]+", dom), dom[-2000:]
    out = work / "reports" / "prefect_flow_run.png"
    browse(chromium(), url, f"--screenshot={out}")
    assert out.read_bytes().startswith(b"\x89PNG") and out.stat().st_size > 10_000


@pytest.fixture
def s3_endpoint():
    """moto's S3 server on a loopback port, with a bucket and credentials it accepts."""
    boto3 = pytest.importorskip("boto3")
    server_mod = pytest.importorskip("moto.server")
    port = free_port()
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    creds = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    boto3.client("s3", endpoint_url=url, aws_access_key_id="testing", aws_secret_access_key="testing",
                 region_name="us-east-1").create_bucket(Bucket="loops")
    yield url, creds
    server.stop()


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_a_team_shares_artifacts_and_experiments_through_a_dvc_remote(repo, tmp_path, kind, request):
    """Clone A (the finished loop) pushes its artifacts to a DVC remote and an experiment to a shared
    git remote; a fresh clone B pulls them: `dvc repro` in B runs nothing, its artifacts are A's
    bytes, and B lists and applies A's experiment."""
    a, b, origin = tmp_path / "a", tmp_path / "b", tmp_path / "origin.git"
    shutil.copytree(repo[0], a, symlinks=True)
    env = {**repo[1], "MLFLOW_TRACKING_URI": f"sqlite:///{a}/mlflow.db"}
    if kind == "local":
        sh(["dvc", "remote", "add", "-d", "team", str(tmp_path / "store")], a, env)
    else:
        url, creds = request.getfixturevalue("s3_endpoint")
        env.update(creds, AWS_SECRET_ACCESS_KEY=SECRET)  # moto takes any key: a sentinel, swept for below
        sh(["dvc", "remote", "add", "-d", "team", "s3://loops/cache"], a, env)
        sh(["dvc", "remote", "modify", "team", "endpointurl", url], a, env)
    git_env = {**env, **GIT_ENV}
    sh(["git", "add", "-A"], a, git_env)
    sh(["git", "commit", "-qm", "the loop's dvc.lock and metrics, and the team's remote"], a, git_env)
    sh(["git", "init", "-q", "--bare", "-b", "main", str(origin)], tmp_path, git_env)
    sh(["git", "remote", "add", "origin", str(origin)], a, git_env)
    sh(["git", "push", "-q", "origin", "main"], a, git_env)
    pushed = sh(["dvc", "push"], a, env)
    assert "pushed" in pushed
    # an experiment that reruns only the report, shared through git (its ref) and the DVC remote
    sh(["dvc", "exp", "run", "-n", "quiet-report", "-S", "tracking.enabled=false"], a, env)
    sh(["dvc", "exp", "push", "origin", "quiet-report"], a, env)

    sh(["git", "clone", "-q", str(origin), str(b)], tmp_path, git_env)
    env_b = {**env, "MLFLOW_TRACKING_URI": f"sqlite:///{b}/mlflow.db"}
    sh(["dvc", "pull"], b, env_b)
    out = sh(["dvc", "repro"], b, env_b)
    assert "Running stage" not in out and "up to date" in out, out
    assert json.loads(sh(["dvc", "status", "--json", "dvc.yaml"], b, env_b)) == {}
    mine, theirs = _outputs(b), _outputs(a)
    assert [k for k in theirs if k.startswith("data/") and mine.get(k) != theirs[k]] == []
    sh(["dvc", "exp", "pull", "origin", "quiet-report"], b, env_b)
    shown = json.loads(sh(["dvc", "exp", "show", "--json"], b, env_b))
    names = [e.get("name") for br in shown for e in (br.get("experiments") or []) for e in e.get("revs", [])]
    assert "quiet-report" in names, shown
    sh(["dvc", "exp", "apply", "quiet-report"], b, env_b)
    assert yaml.safe_load((b / "params.yaml").read_text())["tracking"]["enabled"] is False
    # the remote's secret key is in no file of either clone: dvc.lock, .dvc/config, outputs, mlflow.db
    leaked = [str(f) for root in (a, b) for f in root.rglob("*")
              if f.is_file() and not f.is_symlink() and SECRET.encode() in f.read_bytes()]
    assert not leaked, leaked


def _api(base: str, path: str, body: dict | None = None) -> dict:
    """MLflow's REST API, read over HTTP as any client would."""
    import urllib.request

    req = urllib.request.Request(base + path, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def test_the_report_logs_to_a_tracking_server_and_survives_it_being_down(repo, tmp_path):
    """With the server down the report stage still succeeds (a warning says how to re-send); once
    `mlflow server` is up, `--resend` logs the loop there: runs and artifacts read back over HTTP."""
    from mlflow.tracking import MlflowClient

    work = tmp_path / "ws"
    shutil.copytree(repo[0], work, symlinks=True)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**repo[1], "MLFLOW_TRACKING_URI": base}
    before = (work / "reports/summary.md").read_bytes()
    started = time.perf_counter()
    proc = subprocess.run(["dvc", "repro", "-f", "-s", "report"], cwd=work, env=env, capture_output=True,
                          text=True, timeout=600)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said[-3000:]
    assert f"MLflow tracking at {base} failed" in said and "make mlflow-resend" in said
    assert time.perf_counter() - started < 300  # a few retries, not MLflow's minutes of them
    assert (work / "reports/summary.md").read_bytes() == before
    assert json.loads(sh(["dvc", "status", "--json", "dvc.yaml"], work, env)) == {}

    server = subprocess.Popen(
        ["mlflow", "server", "--backend-store-uri", f"sqlite:///{tmp_path}/server.db",
         "--artifacts-destination", str(tmp_path / "artifacts"), "--serve-artifacts",
         "--host", "127.0.0.1", "--port", str(port)],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_http(f"{base}/health", server, 120)
        cmd = [sys.executable, "-m", "stages.report", "--iterations", "reports/iterations", "--summary",
               "reports/summary.md", "--figures", "reports/figures", "--table", "reports/iterations.csv", "--resend"]
        sh(cmd, work, env)
        exp = _api(base, "/api/2.0/mlflow/experiments/get-by-name?experiment_name=e2e")["experiment"]
        runs = _api(base, "/api/2.0/mlflow/runs/search", {"experiment_ids": [exp["experiment_id"]]})["runs"]
        tags = [{t["key"]: t["value"] for t in r["data"].get("tags", [])} for r in runs]
        parents = [r for r, t in zip(runs, tags) if "mlflow.parentRunId" not in t]
        assert len(parents) == 1 and len(runs) == 4
        assert sorted(t["iteration"] for t in tags if "iteration" in t) == ["it0", "it1", "it2"]
        parent_id = parents[0]["info"]["run_id"]
        # the artifacts went through the server to its artifact store, and come back the same way
        got = MlflowClient(base).download_artifacts(parent_id, "summary.md", str(tmp_path / "down"))
        assert Path(got).read_bytes() == before
        assert list((tmp_path / "artifacts").rglob("summary.md"))
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


def test_a_team_mlflow_server_lets_in_only_the_team(repo, tmp_path):
    """`python -m self_improve.team mlflow --auth` (what `make mlflow-server HOST=0.0.0.0` starts): it
    refuses to start without the admin password and the secret key; up, a request without credentials
    or with a wrong password gets 401, and the report logs the loop with the team's credentials from
    the environment; a loop without them still ends, its outputs written."""
    import base64
    import urllib.error
    import urllib.request

    work = tmp_path / "ws"
    shutil.copytree(repo[0], work, symlinks=True)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server_env = {k: v for k, v in repo[1].items() if not k.startswith("MLFLOW_")}
    cmd = [sys.executable, "-m", "self_improve.team", "mlflow", "--auth", "--port", str(port),
           "--backend", f"sqlite:///{tmp_path}/server.db", "--artifacts", str(tmp_path / "artifacts"),
           "--auth-db", f"sqlite:///{tmp_path}/auth.db"]
    for missing, env in (("MLFLOW_AUTH_ADMIN_PASSWORD", {"MLFLOW_FLASK_SERVER_SECRET_KEY": "k" * 32}),
                         ("MLFLOW_FLASK_SERVER_SECRET_KEY", {"MLFLOW_AUTH_ADMIN_PASSWORD": "Adm1n-pass-e2e"})):
        proc = subprocess.run(cmd, cwd=tmp_path, env={**server_env, **env}, capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0 and f"{missing} is not set" in proc.stderr
    proc = subprocess.run(cmd, cwd=tmp_path, env={**server_env, "MLFLOW_AUTH_ADMIN_PASSWORD": "password1234",
                                                  "MLFLOW_FLASK_SERVER_SECRET_KEY": "k" * 32},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "old default password" in proc.stderr
    server = subprocess.Popen(cmd, cwd=tmp_path, env={**server_env, "MLFLOW_AUTH_ADMIN_PASSWORD": "Adm1n-pass-e2e",
                                                      "MLFLOW_FLASK_SERVER_SECRET_KEY": "k" * 32},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def status(user: str | None, password: str | None) -> int:
        req = urllib.request.Request(f"{base}/api/2.0/mlflow/experiments/search?max_results=10")
        if user is not None:
            req.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status
        except urllib.error.HTTPError as err:
            return err.code

    try:
        wait_http(f"{base}/health", server, 180)
        assert status(None, None) == 401 and status("admin", "wrong") == 401
        assert status("admin", "Adm1n-pass-e2e") == 200
        report = [sys.executable, "-m", "stages.report", "--iterations", "reports/iterations", "--summary",
                  "reports/summary.md", "--figures", "reports/figures", "--table", "reports/iterations.csv", "--resend"]
        env = {**repo[1], "MLFLOW_TRACKING_URI": base, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
        denied = subprocess.run(report, cwd=work, env=env, capture_output=True, text=True, timeout=600)
        assert denied.returncode != 0 and "MLflow tracking at" in denied.stdout + denied.stderr
        sh(report, work, {**env, "MLFLOW_TRACKING_USERNAME": "admin", "MLFLOW_TRACKING_PASSWORD": "Adm1n-pass-e2e"})
        from mlflow.tracking import MlflowClient

        os.environ.update(MLFLOW_TRACKING_USERNAME="admin", MLFLOW_TRACKING_PASSWORD="Adm1n-pass-e2e")
        try:
            client = MlflowClient(base)
            runs = client.search_runs([client.get_experiment_by_name("e2e").experiment_id])
        finally:
            os.environ.pop("MLFLOW_TRACKING_USERNAME"), os.environ.pop("MLFLOW_TRACKING_PASSWORD")
        assert len(runs) == 4 and "Adm1n-pass-e2e" not in repr([r.data for r in runs])
        # a read-only user, as docs/scaling.md adds one: reads the experiment, cannot log to it
        from mlflow.server.auth.client import AuthServiceClient

        os.environ.update(MLFLOW_TRACKING_USERNAME="admin", MLFLOW_TRACKING_PASSWORD="Adm1n-pass-e2e")
        try:
            AuthServiceClient(base).create_user("bob", "b0b-reads-only")
        finally:
            os.environ.pop("MLFLOW_TRACKING_USERNAME"), os.environ.pop("MLFLOW_TRACKING_PASSWORD")
        assert status("bob", "b0b-reads-only") == 200
        exp_id = runs[0].info.experiment_id
        req = urllib.request.Request(f"{base}/api/2.0/mlflow/runs/create", method="POST",
                                     data=json.dumps({"experiment_id": exp_id}).encode(),
                                     headers={"Content-Type": "application/json", "Authorization": "Basic "
                                              + base64.b64encode(b"bob:b0b-reads-only").decode()})
        with pytest.raises(urllib.error.HTTPError) as denied_run:
            urllib.request.urlopen(req, timeout=30)
        assert denied_run.value.code == 403
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


def test_comas_on_a_model_without_a_chat_template_or_with_bad_agents_loses_nothing(repo, tmp_path):
    """`dvc repro comas/dvc.yaml` on the tiny default (no chat template) stops at comas_init naming
    model.base; a bad agents value stops at check_params naming it; every output keeps its bytes."""
    from runners.dag import install_comas

    work = tmp_path / "ws"  # a copy: the installed pipeline stays out of the shared workspace
    shutil.copytree(repo[0], work, symlinks=True)
    env = {**repo[1], "MLFLOW_TRACKING_URI": f"sqlite:///{work}/mlflow.db"}
    install_comas(work)
    params = work / "params.yaml"
    good = params.read_bytes()
    before = _outputs(work)
    try:
        proc = subprocess.run(["dvc", "repro", "comas/dvc.yaml"], cwd=work, env=env, capture_output=True, text=True,
                              timeout=300)
        said = proc.stdout + proc.stderr
        assert proc.returncode != 0
        assert "comas_init: error: model.base: CoMAS needs a chat model" in said, said[-2000:]
        assert "comas_discuss" not in said
        for over, needle in (({"n": 1}, "agents.n"), ({"rounds": 0}, "agents.rounds")):
            raw = yaml.safe_load(good)
            raw["agents"].update(over)
            params.write_text(yaml.safe_dump(raw))
            proc = subprocess.run(["dvc", "repro", "comas/dvc.yaml"], cwd=work, env=env, capture_output=True,
                                  text=True, timeout=300)
            said = proc.stdout + proc.stderr
            assert proc.returncode != 0 and f"check_params: error: params.yaml: {needle}" in said, said[-2000:]
        assert _outputs(work) == before
        assert not (work / "data" / "comas").exists()
    finally:
        params.write_bytes(good)
    assert json.loads(sh(["dvc", "status", "--json", "dvc.yaml"], work, env)) == {}


@HEAVY
def test_comas_runs_through_dvc_and_then_has_nothing_to_do(tmp_path, bpe_model_dir):
    """CoMAS on a chat model through `dvc repro comas/dvc.yaml`: base + 2 iterations, then a no-op;
    one stage rerun on its own gives the same adapters; each agent has its MLflow run."""
    raw = deep_merge(PARAMS, {
        "model": {"base": str(bpe_model_dir), "max_length": 160},
        "evaluate": {"max_new_tokens": 4},
        "train": {"batch_size": 8, "epochs": 1, "lora": {"r": 4, "alpha": 8}},
        "agents": {"rounds": 2, "references": 1, "problems": 2, "max_new_tokens": 6}})
    env = _env(tmp_path)
    git_copy(tmp_path, raw, env)
    sh([sys.executable, "-m", "scripts.comas_pipeline"], tmp_path, env)  # opt-in: comas/dvc.yaml installed
    out = sh(["dvc", "repro", "comas/dvc.yaml"], tmp_path, env)
    for stage in ("prepare", "evaluate_base", "comas/dvc.yaml:comas_init", "comas/dvc.yaml:comas_discuss@it2",
                  "comas/dvc.yaml:comas_train@it2", "comas/dvc.yaml:comas_report"):
        assert f"Running stage '{stage}'" in out
    assert "Running stage 'evolve@it1'" not in out  # the loop's iterations are not CoMAS's
    again = sh(["dvc", "repro", "comas/dvc.yaml"], tmp_path, env)
    assert "Running stage" not in again and "up to date" in again
    adapter = tmp_path / "data/comas/it1/agents/agent1/adapters/it1/adapter_model.safetensors"
    before = adapter.read_bytes()
    out = sh(["dvc", "repro", "-s", "-f", "comas/dvc.yaml:comas_train@it1"], tmp_path, env)
    assert out.count("Running stage") == 1 and adapter.read_bytes() == before
    assert json.loads(sh(["dvc", "status", "--json", "comas/dvc.yaml"], tmp_path, env)) == {}
    from mlflow.tracking import MlflowClient

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("e2e")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "comas_agent" in r.data.tags and "mlflow.parentRunId" not in r.data.tags]
    assert sorted(r.data.tags["comas_agent"] for r in parents) == ["agent0", "agent1"]
    for r in parents:
        assert {"accuracy", "score_parse_rate", "reward_solution"} <= set(r.data.metrics)
