"""The base model of many seeds, made and evaluated without any loop: what its label-free signals say.

    python -m research.base_screen --seeds 14-33 --workdir /tmp/screen --jobs 2 --out research/results/base_screen.md

For each seed, a workspace `workdir`/s<seed> (runners/plain.py) with params.yaml plus `seed` and
the `-S` overrides, where only the stages that make and evaluate it0 run (runners.dag.BASE_STAGES:
nothing is trained), one process each, `--jobs` at once with the CPU threads split between them
(as `runners.experiments --plain --jobs` splits them, so a base comes out as the loop's own it0). The table
gives each base's held-out accuracy beside what the label-free choice (self_improve/choice.py) reads
of it0: cross-view agreement, supported agreement (on answers the base's own samples give), their
difference (agreement on answers the base never samples) and distinct answers. It costs a few
minutes a seed where a loop costs tens, so seeds whose base has a property (a weak or collapsed
base, say) can be found before any loop runs on them. A workspace that already holds it0's metrics
for the same params.yaml is read, not run again (`--force` reruns it).
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from runners.dag import BASE_STAGES
from runners import plain
from runners.experiments import ROOT
from self_improve import recipes
from self_improve.choice import unsupported_agreement
from self_improve.errors import ConfigError

METRICS = Path("reports") / "iterations" / "it0" / "metrics.json"


def parse_seeds(specs: list[str]) -> list[int]:
    """`3 5 10-12` -> [3, 5, 10, 11, 12] (sorted, once each)."""
    out: set[int] = set()
    for spec in specs:
        lo, sep, hi = spec.partition("-")
        try:
            out.update(range(int(lo), int(hi) + 1) if sep else [int(lo)])
        except ValueError:
            raise SystemExit(f"--seeds: {spec!r} is not a seed or a range A-B") from None
    return sorted(out)


def params_text(seed: int, overrides: list[str], root: Path = ROOT) -> str:
    """The params.yaml a seed's workspace runs: the repository's, the `key=value` overrides, then `seed`."""
    set_by = dict(recipes.parse_assignment(o) for o in overrides)
    if "seed" in set_by:
        raise SystemExit("-S seed=...: the seeds come from --seeds")
    raw = recipes.apply(yaml.safe_load((root / "params.yaml").read_text()), set_by | {"seed": seed})
    return yaml.safe_dump(raw, sort_keys=False)


def with_recipe(recipe: str | None, overrides: list[str]) -> list[str]:
    """A recipe's assignments (configs/recipes/<name>.yaml or a YAML path) followed by the `-S` ones,
    which win where both set a key; without a recipe, the `-S` ones."""
    try:
        pre = recipes.load(recipe) if recipe else {}
    except ConfigError as err:
        raise SystemExit(f"--recipe: {err}") from None
    return [f"{k}={recipes.render(v)}" for k, v in pre.items()] + overrides


def screen_one(seed: int, overrides: list[str], workdir: Path, *, force: bool = False, root: Path = ROOT,
               threads: int | None = None) -> dict:
    """One seed's base made and evaluated in `workdir`/s<seed> (or read there when done already):
    it0's metrics. A failing stage raises, naming the seed and its log."""
    work, text = workdir / f"s{seed}", params_text(seed, overrides, root)
    done = work / METRICS
    if not force and done.is_file() and (work / "params.yaml").is_file() and (work / "params.yaml").read_text() == text:
        print(f"s{seed}: done already ({done})", flush=True)
        return json.loads(done.read_text())
    plain.prepare_workspace(work, text, root)
    print(f"+ s{seed} in {work} (log: {work / 'run.log'})", flush=True)
    rc = plain.launch(work, threads=threads, only=BASE_STAGES)
    if rc != 0:
        raise RuntimeError(f"seed {seed}: the base stages failed (exit {rc}), {work / 'run.log'} ends:\n{plain.log_tail(work)}")
    return json.loads(done.read_text())


def table(results: dict[int, dict], above: float | None = None) -> str:
    """The markdown table of each seed's base (and with `above`, the seeds whose agreement on answers
    the base never samples exceeds it)."""
    def f(v):
        return "" if v is None else f"{v:.3f}"

    lines = ["| seed | held-out accuracy | cross-view agreement | supported agreement | agreement the base never samples | distinct answers |",
             "|---|---|---|---|---|---|"]
    for seed in sorted(results):
        m = results[seed]
        lines.append(f"| {seed} | {f(m.get('accuracy'))} | {f(m.get('lf_agreement'))} | {f(m.get('lf_supported_agreement'))} | "
                     f"{f(unsupported_agreement(m))} | {f(m.get('lf_distinct'))} |")
    if above is not None:
        over = [s for s in sorted(results) if (unsupported_agreement(results[s]) or 0) > above]
        listed = f"{', '.join(map(str, over)) or 'none'} ({len(over)} of {len(results)})"
        lines += ["", f"Seeds whose base agrees on answers it never samples on over {above:g} of the problems: {listed}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", nargs="+", required=True, help="seeds and ranges: 14-33 40")
    ap.add_argument("--recipe", default=None,
                    help="configs/recipes/<name>.yaml (or a YAML path) under the -S overrides: smollm2-v2 screens SmolLM2 bases")
    ap.add_argument("-S", "--set-param", action="append", default=[], dest="params",
                    help="a params override, as `dvc exp run -S` takes it (repeatable)")
    ap.add_argument("--workdir", type=Path, required=True, help="one workspace per seed: WORKDIR/s<seed>")
    ap.add_argument("--jobs", type=int, default=1, help="seeds at once (the CPU threads split between them)")
    ap.add_argument("--force", action="store_true", help="run again even where the workspace holds it0's metrics")
    ap.add_argument("--above", type=float, default=None,
                    help="also list the seeds whose base agrees on answers it never samples on more than this share")
    ap.add_argument("--out", type=Path, default=None, help="where the table goes (default: printed only)")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error("--jobs: a positive number")
    seeds = parse_seeds(args.seeds)
    overrides = with_recipe(args.recipe, args.params)
    try:
        params_text(seeds[0], overrides)  # a bad override stops here, before any workspace is made
    except ConfigError as err:
        raise SystemExit(f"-S: {err}") from None
    threads = plain.threads_per_job(args.jobs)
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {s: pool.submit(screen_one, s, overrides, args.workdir, force=args.force, threads=threads) for s in seeds}
        results, failed = {}, []
        for s, fut in futures.items():
            try:
                results[s] = fut.result()
            except RuntimeError as e:
                print(e, file=sys.stderr, flush=True)
                failed.append(s)
    text = table(results, args.above)
    if args.out is not None and results and not failed:  # a partial table is printed, never kept
        args.out.parent.mkdir(parents=True, exist_ok=True)
        cmd = " ".join(["python -m research.base_screen --workdir DIR --seeds", *args.seeds,
                        *([f"--recipe {args.recipe}"] if args.recipe else []), *(f"-S {p}" for p in args.params),
                        f"--jobs {args.jobs}", *([f"--above {args.above:g}"] if args.above is not None else [])])
        args.out.write_text(f"Each seed's base model, made and evaluated without a loop (`{cmd}`), {threads} CPU "
                            f"thread{'s' if threads > 1 else ''} a process, as `runners.experiments --plain --jobs {args.jobs}` "
                            "makes a loop's it0 on the same machine: the tiny model's figures depend on the thread count.\n\n"
                            + text)
    print(text, end="")
    if failed:
        raise SystemExit(f"base stages failed on seeds {', '.join(map(str, failed))} (their logs: {args.workdir}/s<seed>/run.log)")


if __name__ == "__main__":
    main()
