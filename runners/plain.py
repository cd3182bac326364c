"""The loop's stages without DVC: every stage of dvc.yaml, in order, in one process, in a workspace of its own.

    python -m runners.plain WORKDIR     # WORKDIR holds dvc.yaml and params.yaml; every output lands there
    python -m runners.plain WORKDIR --only check_params,prepare,engine_base,evaluate_base   # some stages
    python -m runners.plain WORKDIR --cache /tmp/run-cache     # stages run before on the same inputs: restored

For a machine that has the project's Python packages but not DVC (a GPU host without a package
index, say): no lock, every stage runs once, or with `--cache DIR` (runners/run_cache.py) a stage run
before on the same inputs gets its outputs back, as DVC's run-cache gives them. The stages and their arguments are the ones
`dvc repro` runs (runners/dag.py reads them from dvc.yaml), so a result does not depend on the
runner; what it loses is DVC's versioning and cache. `research.real_loops --plain DIR` makes one such
workspace per (judge, seed) (runners/experiments.py's run_plain) and runs several at once (`--jobs`).
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from self_improve.cpu import usable_cpus

ROOT = Path(__file__).resolve().parents[1]
# what a stage reads from the tree besides its code: the pipeline, tracked inputs, recipes' configs;
# models/ is linked (the base checkpoints `make smollm2` and friends put there), and so is vLLM's
# virtualenv where `make vllm-env` made one (recipe vllm-cpu names it relative to the workspace)
COPIED = ("dvc.yaml", "data/inputs", "configs", "plugins")
LINKED = ("models", ".venv-vllm")
# stages run in a process of their own, not in the runner's: training picks oneDNN's bfloat16 kernels
# (train.bf16, self_improve/cpu.py), which only a process that has not used oneDNN yet can do
OWN_PROCESS = ("stages.train",)


def prepare_workspace(work: Path, params_text: str, root: Path = ROOT) -> Path:
    """A fresh `work`: dvc.yaml, params.yaml (`params_text`), data/inputs, configs, and a link to models/."""
    if work.resolve() == root.resolve():
        raise SystemExit(f"{work}: the workspace of a plain run cannot be the repository itself")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    for rel in COPIED:
        src = root / rel
        if src.is_dir():
            shutil.copytree(src, work / rel)
        elif src.is_file():
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, work / rel)
    for rel in LINKED:
        if (root / rel).exists():
            (work / rel).symlink_to((root / rel).resolve(), target_is_directory=True)
    (work / "params.yaml").write_text(params_text)
    return work


def threads_per_job(jobs: int) -> int:
    """The CPU threads each of `jobs` runs at once gets (at least one)."""
    return max(1, usable_cpus() // jobs)


def launch(work: Path, *, threads: int | None = None, only: tuple[str, ...] | None = None,
           env: dict[str, str] | None = None, cache: Path | None = None) -> int:
    """`python -m runners.plain WORK` (with `only`: `--only` those stages; with `cache`: `--cache` it) in a
    process of its own, the repository on its PYTHONPATH, MLflow tracking off, `threads` CPU threads, `env`
    on top; its output to `work`/run.log. Returns its exit code (`log_tail` says why it failed)."""
    run_env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                   SELF_IMPROVE_TRACKING="0")
    if threads:
        run_env |= {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    run_env |= env or {}
    argv = [sys.executable, "-m", "runners.plain", str(work), *(["--only", ",".join(only)] if only else []),
            *(["--cache", str(cache)] if cache else [])]
    with (work / "run.log").open("w") as log:
        return subprocess.run(argv, cwd=ROOT, env=run_env, stdout=log, stderr=subprocess.STDOUT, check=False).returncode


def log_tail(work: Path, lines: int = 15) -> str:
    """The last `lines` lines of a launched run's log."""
    return "\n".join((work / "run.log").read_text(errors="replace").splitlines()[-lines:])


def device() -> dict:
    """Where the stages ran: the accelerator torch sees (none: CPU)."""
    import torch

    return {"accelerator": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "torch": torch.__version__}


def run_stages(work: Path, only: tuple[str, ...] | None = None, cache: Path | None = None) -> None:
    """Every stage's main() with dvc.yaml's arguments, in DAG order, with `work` as the working directory;
    a failing stage stops the run (its exception propagates: non-zero exit). With `only`, just those
    stages (names as `dvc repro` prints them, `train@it1`), still in DAG order: the caller names every
    stage whose outputs they read. With `cache` (a folder, runners/run_cache.py): a stage whose command,
    deps and params match one stored there is restored, not run, and each stage run is stored; the
    stages restored are listed in `work`/run_cache.json."""
    from runners.dag import stage_specs
    from runners.run_cache import RunCache, machine_facts

    stages = stage_specs(work)
    if only is not None:
        unknown = sorted(set(only) - {s.name for s in stages})
        if unknown:
            raise SystemExit(f"{work / 'dvc.yaml'}: no stage named {', '.join(unknown)}")
        stages = [s for s in stages if s.name in only]
    for s in stages:
        if s.argv[:2] != ["python", "-m"]:
            raise SystemExit(f"{work / 'dvc.yaml'}: stage {s.name}: expected `python -m stages.<name> ...`, got {s.argv[:3]}")
    os.chdir(work)
    ran_on = device()
    (work / "device.json").write_text(json.dumps(ran_on) + "\n")
    store = RunCache(cache.resolve(), work, ROOT, machine_facts(ran_on)) if cache is not None else None
    params = yaml.safe_load((work / "params.yaml").read_text(encoding="utf-8")) or {}
    restored: list[str] = []
    for stage in stages:
        argv, name = stage.argv, stage.name
        started = time.perf_counter()
        key = None
        if store is not None:
            key = store.key(stage, params)  # before the stage runs: what it reads, not what it writes
            if store.restore(stage, key):
                restored.append(name)
                print(f"== {name}: restored from the run cache ({key[:12]}, {time.perf_counter() - started:.1f} s)", flush=True)
                continue
        print(f"== {name}", flush=True)
        if argv[2] in OWN_PROCESS:  # as under DVC: its CPU kernels (bfloat16's) and memory stay its own
            path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
            subprocess.run([sys.executable, *argv[1:]], check=True, env=dict(os.environ, PYTHONPATH=path))
        else:
            importlib.import_module(argv[2]).main(argv[3:])
        if store is not None:
            store.store(stage, key)
        print(f"== {name}: {time.perf_counter() - started:.1f} s", flush=True)
    if store is not None:
        (work / "run_cache.json").write_text(json.dumps({"cache": str(store.root), "restored": restored}) + "\n")


USAGE = "usage: python -m runners.plain WORKDIR [--only STAGE,STAGE,...] [--cache DIR]"


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    only = cache = None
    while len(args) >= 3 and args[-2] in ("--only", "--cache"):
        flag, value, args = args[-2], args[-1], args[:-2]
        if flag == "--only" and only is None:
            only = tuple(filter(None, value.split(",")))
            if not only:
                raise SystemExit(USAGE)
        elif flag == "--cache" and cache is None and value:
            cache = Path(value)
        else:
            raise SystemExit(USAGE)
    if len(args) != 1 or args[0].startswith("--"):
        raise SystemExit(USAGE)
    work = Path(args[0]).resolve()
    for rel in ("dvc.yaml", "params.yaml"):
        if not (work / rel).is_file():
            raise SystemExit(f"{work}: no {rel} (make the workspace with runners.plain.prepare_workspace)")
    run_stages(work, only, cache)


if __name__ == "__main__":
    main()
