"""A variant of the loop over several seeds, as DVC experiments, reported as mean +- sd.

    python -m runners.experiments --name default --seeds 0 1 2
    python -m runners.experiments --name dpo --seeds 0 1 2 -S train.algorithm=dpo
    python -m runners.experiments --variants configs/variants.yaml --seeds 0 1 2   # every README comparison
    python -m runners.experiments --table          # only rebuild the table and plot from kept results
    python -m runners.experiments --variants configs/variants.yaml --plain /tmp/seeds --jobs 8   # without DVC
    python -m runners.experiments --recipe smollm2-gym scpo --name scpo --out DIR   # a setup and a rule

One run cannot tell two variants apart: the same seed trains a different tiny base model on another
CPU (floating point), and every later figure inherits the difference. Each (variant, seed) runs
`dvc exp run -n <name>-s<seed> -S seed=<seed> <-S ...>` (`seed` drives the base model's training,
the task's problem sets and every stage), then keeps its per-iteration metrics in
`<out>/<name>/s<seed>.json` (experiment refs and the DVC cache do not travel with a clone; these
files do). `<out>/table.md` holds, per variant, held-out and test-time accuracy at every iteration
and the gain it0 -> last as mean +- sd over the seeds that finished (with the per-seed values),
judge quality, and how many seeds raised the reward-hacking alarm; `<out>/comparison.md` the same
in one row per variant, with each variant's last held-out accuracy against the default's at the
same seeds; `<out>/accuracy.png` plots the accuracies with error bars. A finished result is not
run again unless --force.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from runners import plain
from runners import arms
from self_improve import recipes
from self_improve import artifacts as art
from self_improve.choice import SIGNALS
from runners.comparison import baseline, choices, comparison, load_results, plot, set_by, table
from self_improve.errors import ConfigError
from self_improve.recipes import flatten

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "reports" / "seeds"
KEYS = ("accuracy", "accuracy_se", "ttt_accuracy", "ttt_accuracy_se", "maj_accuracy", "sample_accuracy",
        "sample_accuracy_se", "judge_auc", "judge_auc_se", "judge_accuracy", "judge_accuracy_se",
        "label_accuracy", "reward_mean", "truncated_share", "eval_truncated_share", "extract_failure_rate",
        "num_pairs", "heldout_n", "ttt_n", "accuracy_gain", "accuracy_gain_lo", "accuracy_gain_hi", "ttt_accuracy_gain",
        "ttt_accuracy_gain_lo", "ttt_accuracy_gain_hi", "invalid_share", "invalid_share_se", "frozen_yes", "vote_share",
        "distinct_answers", "cross_view_agreement", "lf_n", "lf_distinct",
        "sample_temperature", "sft_min_reward", "bstar_balance", "bstar_seconds",  # the temperature and threshold used
        *(f"{s}{x}" for s in SIGNALS for x in ("", "_se", "_gain", "_gain_lo", "_gain_hi")))  # what the label-free choice reads


# per category (a task's levels and operations, reasoning-gym's datasets): accuracy, the gain over it0 with
# its paired interval; the shortcut floors and the gain over the best of them; the training mix; the share
# of prompts with a label (what judge.category_gate reads)
PER_CATEGORY = ("accuracy/", "ttt_accuracy/", "accuracy_gain", "ttt_accuracy_gain", "floor", art.MIX_PREFIX,
                "label_coverage")


def kept(key: str) -> bool:
    """A metric a kept result carries: KEYS, the per-category figures, the floors and the training mix."""
    return key in KEYS or key == "train_coverage" or key.startswith(PER_CATEGORY)


ANSWERS = "answers.parquet"  # a kept run's answers problem by problem (keep_answers, artifacts.KEPT_EVAL)


def iterations(root: Path = ROOT) -> list[str]:
    return ["it0"] + list(yaml.safe_load((root / "params.yaml").read_text())["loop"])


def keep_report(root: Path, dest: Path) -> None:
    """The experiment's reports/summary.md and reports/figures/ (the gap and the curves) to `dest`,
    each iteration's training metrics (data/itN/train_metrics.json: samples, steps, the loss's
    diagnostics, which the evaluated metrics do not carry) as train_metrics_itN.json, and every
    iteration's answers problem by problem as answers.parquet (`keep_answers`)."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(root / "reports" / "summary.md", dest / "summary.md")
    shutil.rmtree(dest / "figures", ignore_errors=True)
    shutil.copytree(root / "reports" / "figures", dest / "figures")
    for train in sorted((root / "data").glob("it*/train_metrics.json")):
        shutil.copy2(train, dest / f"train_metrics_{train.parent.name}.json")
    keep_answers(root, dest / ANSWERS)


def keep_answers(root: Path, dest: Path) -> Path | None:
    """Every iteration's evaluated answers (data/itN/eval.parquet) in one file, without the response
    texts: per problem and wording its answer, whether it was right, cut, valid and a restated number.
    Two runs at one seed answer the same problems, so a kept run can be set against another problem
    by problem (`python -m research.paired_runs`), and the label-free signals recomputed from it
    (self_improve.choice.signals reads these columns). None where no iteration was evaluated."""
    paths = [root / "data" / it / "eval.parquet" for it in iterations(root)]
    frames = [art.read_table(p, art.EVAL) for p in paths if p.is_file()]
    if not frames:
        return None
    art.write_table(pd.concat(frames, ignore_index=True), dest, art.KEPT_EVAL)
    return dest


def committed_params(root: Path = ROOT) -> str:
    """params.yaml as HEAD has it: every experiment is HEAD's params plus its own `-S` overrides."""
    return subprocess.run(["git", "show", "HEAD:params.yaml"], cwd=root, capture_output=True, text=True,
                          check=True).stdout


_LOCKS: dict[Path, Any] = {}


def hold_runner_lock(root: Path = ROOT):
    """An exclusive lock on `<root>/.dvc/tmp/seeds.lock` for this process's lifetime: a second runner
    in the same workspace would rewrite params.yaml under the first one's stages (each stage reads it
    when it starts), so it is refused."""
    import fcntl

    root = root.resolve()
    if root in _LOCKS:
        return _LOCKS[root]
    path = root / ".dvc" / "tmp" / "seeds.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    f = path.open("a")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise SystemExit(f"{root}: another seeds / real-loops runner holds {path}: one runner per workspace "
                         "(use a second clone to run two at once)") from None
    _LOCKS[root] = f
    return f


def check_clean_params(root: Path = ROOT) -> None:
    """Refuse to start while params.yaml differs from HEAD's: `dvc exp run -S` applies its overrides
    to the workspace's params.yaml, so an uncommitted change (or the params a previous experiment
    left there) would silently join every variant."""
    if (root / "params.yaml").read_text() != committed_params(root):
        raise SystemExit(f"{root / 'params.yaml'} differs from HEAD's (`git diff params.yaml`): every variant "
                         "is HEAD's params plus its own overrides; commit the change, pass it as -S KEY=VALUE, "
                         "or `git checkout params.yaml` if it is what an earlier experiment left there")


def params_diff(text: str, base: str) -> dict[str, Any]:
    """The params keys whose values differ from `base` (both params.yaml texts), flattened."""
    new, old = flatten(yaml.safe_load(text)), flatten(yaml.safe_load(base))
    return {k: new.get(k) for k in sorted(set(new) | set(old)) if new.get(k) != old.get(k)}


def with_timings(env: dict[str, str], timings: Path | None) -> dict[str, str]:
    """`env` with the stages' timings going to a fresh `timings` file (SELF_IMPROVE_TIMINGS, an
    absolute path: the stages run in another directory); unchanged when `timings` is None."""
    if timings is None:
        return env
    timings.parent.mkdir(parents=True, exist_ok=True)
    timings.unlink(missing_ok=True)
    return env | {"SELF_IMPROVE_TIMINGS": str(timings.resolve())}


def run_experiment(name: str, args: list[str], dest: Path, *, force: bool = False, root: Path = ROOT,
                   extra: dict | None = None, timings: Path | None = None,
                   report_dir: Path | None = None) -> Path | None:
    """`dvc exp run -n name args` in `root`; its per-iteration metrics to `dest`, and with
    `report_dir` its summary and figures there (None: it failed).

    The workspace's params.yaml must be HEAD's (check_clean_params) and is put back to HEAD's after
    the run: `dvc exp run` leaves the experiment's params there, and the next experiment would
    otherwise inherit them. The result records which params differed from HEAD's."""
    if dest.exists() and not force:
        print(f"{name}: done already ({dest})", flush=True)
        return dest
    hold_runner_lock(root)
    check_clean_params(root)
    base = committed_params(root)
    staged = subprocess.run(["git", "diff", "--cached", "--quiet", "HEAD", "--", "params.yaml"], cwd=root).returncode
    env = with_timings(dict(os.environ), timings)
    cmd = ["dvc", "exp", "run", "-n", name, *args]
    print("+", shlex.join(cmd), flush=True)
    t0 = time.perf_counter()
    try:
        rc = subprocess.run(cmd, cwd=root, env=env, check=False).returncode
        wall = time.perf_counter() - t0
        ran = (root / "params.yaml").read_text()
    finally:
        (root / "params.yaml").write_text(base)
        if staged == 0:  # dvc exp run stages the params it ran; unstage them again
            subprocess.run(["git", "reset", "-q", "HEAD", "--", "params.yaml"], cwd=root, check=False)
    if rc != 0:
        print(f"{name}: failed (exit {rc})", file=sys.stderr)
        return None
    return keep_result(name, args, dest, root, ran=ran, base=base, wall=wall, extra=extra, report_dir=report_dir)


def keep_result(name: str, args: list[str], dest: Path, work: Path, *, ran: str, base: str, wall: float,
                extra: dict | None = None, report_dir: Path | None = None, runner: dict | None = None) -> Path:
    """A finished run's per-iteration metrics (`work`/reports/iterations) to `dest`, with the params it
    ran (`ran`, a params.yaml text) against `base`, and its summary and figures to `report_dir`; without
    `report_dir`, its answers problem by problem beside `dest` (`<stem>.answers.parquet`)."""
    metrics = {it: json.loads((work / "reports" / "iterations" / it / "metrics.json").read_text())
               for it in iterations(work)}
    result = {"experiment": name, "args": args, "wall_seconds": round(wall, 1), **(extra or {}),
              "params_diff": params_diff(ran, base), "machine": machine() | (runner or {}),
              "params_set": {k: flatten(yaml.safe_load(ran)).get(k) for k in set_by(args)},
              "metrics": {it: {k: m[k] for k in m if kept(k)} for it, m in metrics.items()}}
    with art.atomic_path(dest) as tmp:  # the metrics land last, once the rest is kept (none if it fails)
        tmp.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        if report_dir is not None:
            keep_report(work, report_dir)
        else:  # the answers still, beside the metrics: <out>/<variant>/s<seed>.answers.parquet
            keep_answers(work, dest.with_name(f"{dest.stem}.{ANSWERS}"))
    print(f"{name}: {wall / 60:.1f} min -> {dest}", flush=True)
    return dest


def run_plain(name: str, args: list[str], dest: Path, *, workdir: Path, force: bool = False, root: Path = ROOT,
              extra: dict | None = None, timings: Path | None = None, report_dir: Path | None = None,
              threads: int | None = None, cache: Path | None = None) -> Path | None:
    """The same run as run_experiment without DVC (runners/plain.py): `workdir`/`name` made fresh with
    the workspace's params.yaml plus the `-S` overrides of `args`, every stage run there in one
    process, the result kept the same way and marked `runner: plain`. For a machine without DVC;
    several may run at once (each in its own workspace, `threads` CPU threads each). With `cache`: stages
    run before on the same inputs are restored from that run cache (runners/run_cache.py), and the
    result's machine names them (`restored`)."""
    from self_improve import recipes

    if dest.exists() and not force:
        print(f"{name}: done already ({dest})", flush=True)
        return dest
    unknown = [a for a, prev in zip(args, [None, *args]) if a != "-S" and prev != "-S"]
    if unknown:
        raise SystemExit(f"{name}: a plain run takes only -S KEY=VALUE overrides, got {unknown}")
    base = (root / "params.yaml").read_text()
    ran = yaml.safe_dump(recipes.apply(yaml.safe_load(base), set_by(args)), sort_keys=False)
    work = plain.prepare_workspace(workdir / name, ran, root)
    print(f"+ plain {name} in {work} (log: {work / 'run.log'})", flush=True)
    t0 = time.perf_counter()
    rc = plain.launch(work, threads=threads, env=with_timings({}, timings), cache=cache)
    wall = time.perf_counter() - t0
    if rc != 0:
        print(f"{name}: failed (exit {rc}), {work / 'run.log'} ends:\n" + plain.log_tail(work), file=sys.stderr, flush=True)
        return None
    runner = {"runner": "plain"} | json.loads((work / "device.json").read_text())
    if (work / "run_cache.json").is_file():  # the stages it did not run: its wall time is the rest's
        runner["restored"] = json.loads((work / "run_cache.json").read_text())["restored"]
    return keep_result(name, args, dest, work, ran=ran, base=base, wall=wall, extra=extra, report_dir=report_dir,
                       runner=runner)


def machine() -> dict[str, Any]:
    """Where a result ran: the CPU's vector extensions and the kernel pins in force (stages/__init__.py),
    since unpinned AVX2 and AVX-512 kernels train different tiny base models from one seed."""
    import platform

    from self_improve.cpu import cpu_flags, pin_cpu_kernels

    flags = cpu_flags()
    return {"processor": platform.processor() or platform.machine(),
            "isa": " ".join(f for f in ("avx2", "avx512f") if f in flags), "pins": pin_cpu_kernels()}


def result_iterations(groups: dict[str, list[dict]], root: Path = ROOT) -> list[str]:
    """The iterations the kept results reach (six for a long recipe), in loop order; without
    results, those of `root`'s params.yaml."""
    found = {it for runs in groups.values() for r in runs for it in r.get("metrics", {})}
    number = lambda it: int(m.group()) if (m := re.search(r"\d+", it)) else -1  # noqa: E731
    return sorted(found, key=lambda it: (number(it), it)) if found else iterations(root)


def write_reports(out: Path, root: Path = ROOT) -> str:
    groups = load_results(out)
    its = result_iterations(groups, root)
    text = table(groups, its)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(text)
    if groups:
        (out / "comparison.md").write_text(comparison(groups, its, baseline(groups)))
        plot(groups, its, out / "accuracy.png")
        if (picked := choices(groups, its)) is not None:
            (out / "choices.md").write_text(picked)
        arms.write(out)  # per category and against the control arms, where the results carry them
    return text


def load_variants(path: Path) -> dict[str, list[str]]:
    """{name: [`key=value` override, ...]} from a YAML file; a malformed entry is refused by name."""
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict):
        raise SystemExit(f"{path}: expected a mapping of variant name -> list of overrides")
    for name, overrides in raw.items():
        if not isinstance(overrides, list) or not all(isinstance(o, str) and "=" in o for o in overrides):
            raise SystemExit(f"{path}: variant {name!r}: expected a list of key=value overrides, got {overrides!r}")
    return {str(k): v for k, v in raw.items()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", help="the variant's name (experiments are <name>-s<seed>)")
    ap.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    ap.add_argument("-S", "--set-param", dest="params", action="append", default=[],
                    help="a params override, as `dvc exp run -S` takes it (repeatable)")
    ap.add_argument("--recipe", nargs="+", default=[], metavar="NAME",
                    help="recipes of configs/recipes/ and configs/rules/ applied under every variant's own overrides "
                         "(a setup and a rule: smollm2-gym scpo)")
    ap.add_argument("--variants", type=Path,
                    help="a YAML file of {name: [override, ...]}: run each (a first seed of every variant "
                         "before a second of any)")
    ap.add_argument("--out", type=Path, default=OUT, help=f"where results are kept (default {OUT.relative_to(ROOT)})")
    ap.add_argument("--force", action="store_true", help="run again even if a result exists")
    ap.add_argument("--table", action="store_true", help="only rebuild the table and the plot")
    ap.add_argument("--plain", type=Path, default=None, metavar="DIR",
                    help="run the stages without DVC, each run in DIR/<name>-s<seed> (runners/plain.py): a "
                         "machine without DVC")
    ap.add_argument("--jobs", type=int, default=1,
                    help="with --plain: runs at once (one process each, the CPU threads split between them)")
    ap.add_argument("--run-cache", type=Path, default=None, metavar="DIR",
                    help="with --plain: restore stages run before on the same inputs from DIR and store each "
                         "stage run there (runners/run_cache.py; DVC's run-cache does this for DVC runs)")
    args = ap.parse_args(argv)
    if args.jobs < 1 or (args.jobs > 1 and args.plain is None):
        ap.error("--jobs: a positive number, above 1 only with --plain (one DVC experiment at a time per workspace)")
    if args.run_cache is not None and args.plain is None:
        ap.error("--run-cache: only with --plain (DVC keeps its own run-cache)")
    if not args.table:
        if args.variants:
            variants = load_variants(args.variants)
        elif args.name:
            variants = {args.name: args.params}
        else:
            ap.error("--name (or --variants) is needed to run a variant")
        try:
            base = [f"{k}={recipes.render(v)}" for k, v in recipes.load_all(args.recipe, ROOT).items()]
        except ConfigError as err:
            ap.error(str(err))
        runs = [(name, base + params, seed) for seed in args.seeds for name, params in variants.items()]
        threads = plain.threads_per_job(args.jobs)
        lock = threading.Lock()

        def one(run: tuple[str, list[str], int]) -> None:
            name, params, seed = run
            overrides = [x for p in params for x in ("-S", p)] + ["-S", f"seed={seed}"]
            dest, extra = args.out / name / f"s{seed}.json", {"variant": name, "seed": seed, "overrides": params}
            if args.plain is not None:
                run_plain(f"{name}-s{seed}", overrides, dest, workdir=args.plain.resolve(), force=args.force,
                          extra=extra, threads=threads, cache=args.run_cache.resolve() if args.run_cache else None)
            else:
                run_experiment(f"{name}-s{seed}", overrides, dest, force=args.force, extra=extra)
            with lock:
                write_reports(args.out)

        with ThreadPoolExecutor(max_workers=args.jobs) as pool:  # a first seed of every variant before a second
            list(pool.map(one, runs))
    print(write_reports(args.out))


if __name__ == "__main__":
    main()
