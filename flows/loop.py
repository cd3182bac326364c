"""The loop as a Prefect flow: each task runs one DVC stage (`dvc repro -s <stage>@<iteration>`).

DVC stays the only DAG and cache, so work done by `dvc repro` is not redone here and the reverse.
Run it with `python -m flows.loop` (an ephemeral Prefect server starts if none is configured), or
serve it for the Prefect UI with `python -m flows.serve`. The flow's parameters are typed, so the
UI renders a form and refuses bad values before anything runs.

A run with no overrides works in the repo itself (one flow per workspace at a time). A run with
overrides, or with an experiment name, works in a git worktree of HEAD under `.dvc/tmp/flows/`
that shares the repo's DVC cache, so stages whose inputs did not change are checked out, not
rerun, and the user's working copy is never touched; it ends as a named DVC experiment
(`dvc exp show`) and its MLflow runs go to the repo's store, tagged with the flow run.
This module imports neither stage code nor models (only the params schema). Its annotations are
real objects, not strings: a served flow is loaded from its file, and Prefect builds the
parameter model from them.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Callable, Optional

import yaml
from filelock import FileLock, Timeout
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from pydantic import Field

from self_improve import recipes
from self_improve.config import ALGORITHMS, JUDGES, EvolveStrategy, parse_params

from runners.dag import stage_order


class WorkspaceBusy(RuntimeError):
    """Another loop flow holds this workspace."""


ROOT = Path(__file__).resolve().parents[1]  # the checkout this flow's code runs from
REPOS_ENV = "SELF_IMPROVE_REPOS"  # more repos a flow may work on (os.pathsep-separated), set where it is served
# a path parameter: printable, no control characters, at most 4,096 characters
PATH_PATTERN = r"^[^\x00-\x1f\x7f]{1,4096}$"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$"  # a DVC experiment's, a flow run's worktree's


def allowed_repos() -> list[Path]:
    """The repos a flow run may work on: the checkout its code runs from, and those the serving or
    deploying side named in SELF_IMPROVE_REPOS (`flows.serve --repo`, `make worker`), never one a
    caller of the UI or the API passes alone."""
    extra = [Path(p).resolve() for p in os.environ.get(REPOS_ENV, "").split(os.pathsep) if p.strip()]
    return [ROOT, *extra]


def check_repo(repo: str) -> Path:
    """`repo` resolved, if it is one of `allowed_repos` and holds a pipeline; else a ValueError naming
    the parameter, before anything runs."""
    if not isinstance(repo, str) or not repo or len(repo) > 4096 or any(ord(c) < 32 or ord(c) == 127 for c in repo):
        raise ValueError("repo: expected a path of at most 4,096 printable characters")
    path = Path(repo).resolve()
    allowed = allowed_repos()
    if path not in allowed:
        raise ValueError(f"repo: {path} is not a repo this flow may work on ({', '.join(map(str, allowed))}; "
                         f"the serving side adds one with --repo or {REPOS_ENV})")
    if not (path / "dvc.yaml").is_file() or not (path / "params.yaml").is_file():
        raise ValueError(f"repo: {path} holds no dvc.yaml and params.yaml")
    return path


def _run_name() -> str:
    from prefect.runtime import task_run

    stage = task_run.parameters["stage"]
    name, _, it = stage.partition("@")
    return f"{it}-{name}" if it else name


@task(task_run_name=_run_name, retries=2, retry_delay_seconds=[5, 30])
def repro_stage(stage: str, repo: str, env_extra: Optional[dict[str, str]] = None) -> None:
    """`dvc repro -s` one stage, streaming its output to the Prefect logs."""
    logger = get_run_logger()
    from prefect.runtime import flow_run

    # The stages' `python` must be this interpreter, whether or not the venv is activated; the
    # report stage tags its MLflow runs with the flow run that made them.
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
           "SELF_IMPROVE_FLOW_RUN_ID": str(flow_run.id or ""), "SELF_IMPROVE_FLOW_RUN_NAME": str(flow_run.name or ""),
           **(env_extra or {})}
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


# (params.yaml key, flow parameter) for every override the form offers
OVERRIDES = {
    "judge_method": "judge.method",
    "train_algorithm": "train.algorithm",
    "evolve_strategy": "evolve.strategy",
    "samples_per_prompt": "sample.k",
    "temperature": "sample.temperature",
    "bstar": "sample.bstar.enabled",
    "epochs": "train.epochs",
    "seed": "seed",
}


def apply_overrides(raw: dict, values: dict, recipe: str | None = None,
                    overrides: dict[str, str] = OVERRIDES, root: Path = Path(".")) -> dict:
    """params.yaml with recipes (`recipe`: comma-separated names of configs/recipes/ or configs/rules/
    under `root`) and then the given overrides, validated as a whole (a bad mix is refused by key)."""
    out = recipes.apply(raw, recipes.load_all(recipes.split(recipe), root)) if recipe else raw
    out = recipes.apply(out, {overrides[param]: value.value if hasattr(value, "value") else value
                              for param, value in values.items()})
    parse_params(out, "params.yaml with the flow's overrides" + (f" and recipe {recipe}" if recipe else ""))
    return out


def _git(args: list[str], cwd: Path) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {cwd}: {proc.stderr.strip()}")
    return proc.stdout


def _dvc(args: list[str], cwd: Path) -> str:
    proc = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"dvc {' '.join(args)} failed in {cwd}: {(proc.stderr or proc.stdout).strip()}")
    return proc.stdout


def make_worktree(repo: Path, name: str, params: dict) -> Path:
    """A git worktree of HEAD that shares the repo's DVC cache, with `params` as its params.yaml."""
    work = repo / ".dvc" / "tmp" / "flows" / name
    if work.exists():
        raise WorkspaceBusy(f"{work} exists: a flow run named {name!r} is running or was killed "
                            f"(remove it with `git worktree remove --force {work}`)")
    work.parent.mkdir(parents=True, exist_ok=True)
    _git(["worktree", "add", "--quiet", "--detach", str(work), "HEAD"], repo)
    _dvc(["config", "--local", "cache.dir", str((repo / ".dvc" / "cache").resolve())], work)
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    return work


def remove_worktree(root: Path, work: Path) -> None:
    subprocess.run(["git", "worktree", "remove", "--force", str(work)], cwd=root, capture_output=True)
    shutil.rmtree(work, ignore_errors=True)
    subprocess.run(["git", "worktree", "prune"], cwd=root, capture_output=True)


def on_cancelled(flow, flow_run, state) -> None:
    """The flows' `on_cancellation` hook, run by the serving process once it has stopped the cancelled
    run's process: removes a worktree the run left behind and ends the run's log saying it was
    cancelled (the stopped engine's own last line gives the state it had seen: Running)."""
    from prefect.logging.loggers import flow_run_logger

    params = flow_run.parameters or {}
    name = params.get("experiment_name") or f"flow-{flow_run.name or 'run'}"
    try:  # the parameters are the run's, as its flow validated them; checked again before removing anything
        root = check_repo(str(params.get("repo") or "."))
        work = root / ".dvc" / "tmp" / "flows" / name if re.fullmatch(NAME_PATTERN, name) else None
    except ValueError:
        work = None
    left = work is not None and work.exists()
    if left:
        remove_worktree(root, work)
    flow_run_logger(flow_run, flow).info(
        "Cancelled: %s The run's process was stopped; %s.", state.message or "the run was cancelled.",
        f"its worktree {work} was removed" if left else "it left no worktree")


def _iteration_markdown(metrics: dict) -> str:
    rows = "\n".join(f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |"
                     for k, v in sorted(metrics.items()))
    return f"# {metrics.get('iteration')}: metrics\n\n| metric | value |\n|---|---|\n{rows}\n"


def _publish(workdir: Path, stage: str, rows: list[dict]) -> None:
    """After an evaluate stage: that iteration's metrics as a markdown artifact."""
    name, _, it = stage.partition("@")
    if name not in ("evaluate", "evaluate_base"):
        return
    path = workdir / "reports" / "iterations" / (it or "it0") / "metrics.json"
    metrics = json.loads(path.read_text(encoding="utf-8"))
    rows.append(metrics)
    create_markdown_artifact(markdown=_iteration_markdown(metrics), key=f"metrics-{it or 'it0'}",
                             description=f"metrics of iteration {it or 'it0'}")


@flow(name="self-improve-loop", log_prints=True, validate_parameters=True, on_cancellation=[on_cancelled])
def self_improve_loop(
    repo: Annotated[str, Field(pattern=PATH_PATTERN, description="the repo the run works on: the one the flow "
                                                                 "was served or deployed with")] = ".",
    recipe: Optional[Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,62}(,[A-Za-z0-9][A-Za-z0-9_.+-]{0,62}){0,3}$",
                                          description="recipes of configs/recipes/ or configs/rules/, comma-"
                                                      "separated, applied first: smollm2-gym,scpo")]] = None,
    judge_method: Optional[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,62}$",
                                                description="judge.method: " + ", ".join(JUDGES))]] = None,
    train_algorithm: Optional[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,62}$",
                                                   description="train.algorithm: " + ", ".join(ALGORITHMS))]] = None,
    evolve_strategy: Optional[EvolveStrategy] = None,
    samples_per_prompt: Optional[Annotated[int, Field(ge=1, le=64, description="sample.k")]] = None,
    temperature: Optional[Annotated[float, Field(gt=0, le=2, description="sample.temperature")]] = None,
    bstar: Optional[Annotated[bool, Field(description="sample.bstar.enabled: B-STaR chooses the temperature "
                                                      "and RAFT threshold each iteration")]] = None,
    epochs: Optional[Annotated[int, Field(ge=1, le=100, description="train.epochs")]] = None,
    seed: Optional[Annotated[int, Field(ge=0, description="seed")]] = None,
    experiment_name: Optional[Annotated[str, Field(pattern=NAME_PATTERN,
                                                   description="DVC experiment name")]] = None,
) -> list[str]:
    """Run every stage of the loop in dependency order; returns the stage names.

    Leave every override empty to run on the repo's own params.yaml, in the repo.
    """
    given = {k: v for k, v in locals().items() if k in OVERRIDES and v is not None}
    return run_flow(repo, recipe, given, experiment_name, stage_order, OVERRIDES)


def run_flow(repo: str, recipe: str | None, given: dict, experiment_name: str | None,
             order: Callable[[Path], list[str]], overrides: dict[str, str],
             setup: Callable[[Path], object] | None = None, include: tuple[str, ...] = ()) -> list[str]:
    """The stages `order` names, each by `dvc repro -s`: in the repo itself when nothing is
    overridden, else in a worktree ending as a DVC experiment (with the untracked paths `include`
    names). `setup` runs on the workspace first. Returns the stage names."""
    from prefect.runtime import flow_run

    root = check_repo(repo)
    isolated = bool(given) or recipe is not None or experiment_name is not None
    raw = yaml.safe_load((root / "params.yaml").read_text(encoding="utf-8"))
    params = apply_overrides(raw, given, recipe, overrides, root)  # refused here
    if not isolated:
        try:
            with workspace_lock(root):
                if setup:
                    setup(root)
                return _run_stages(root, {}, [], order)
        except Timeout:
            raise WorkspaceBusy(f"another self-improve flow is running on {root}; "
                                "wait for it, or give it overrides or an experiment name to run it "
                                "in its own worktree") from None
    name = experiment_name or f"flow-{flow_run.name or 'run'}"
    logger = get_run_logger()
    if name in _dvc(["exp", "list", "--name-only"], root).split():
        raise ValueError(f"experiment_name: a DVC experiment {name!r} exists already; "
                         f"pick another name or remove it (`dvc exp remove {name}`)")
    work = make_worktree(root, name, params)
    logger.info("running in worktree %s as experiment %s with %s", work, name, given)
    try:
        if setup:
            setup(work)
        env = {"SELF_IMPROVE_EXPERIMENT": name,
               "MLFLOW_TRACKING_URI": os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{root / 'mlflow.db'}"}
        stages = _run_stages(work, env, [], order)
        extra = [a for path in include for a in ("-I", path)]
        _dvc(["exp", "save", "--name", name, *extra, *stages], work)  # these stages' outputs (not another pipeline's)
        logger.info("saved as DVC experiment %s: see `dvc exp show`", name)
        return stages
    finally:  # the experiment and the DVC cache keep the results; the worktree goes
        remove_worktree(root, work)


def _run_stages(workdir: Path, env: dict[str, str], rows: list[dict],
                order: Callable[[Path], list[str]] = stage_order) -> list[str]:
    stages = order(workdir)
    for stage in stages:
        repro_stage(stage, str(workdir), env)
        _publish(workdir, stage, rows)
    if rows:
        keys = ["iteration", "accuracy", "maj_accuracy", "ttt_accuracy", "reward_mean", "judge_accuracy",
                "label_accuracy", "num_pairs"]
        create_table_artifact(table=[{k: r.get(k) for k in keys} for r in rows], key="iterations",
                              description="the loop's metrics across iterations")
    return stages


if __name__ == "__main__":
    self_improve_loop(sys.argv[1] if len(sys.argv) > 1 else ".")
