"""A finished plain loop carried on for more iterations, without re-running the ones it has.

    python -m research.extend_loop /tmp/loops/smol-fast-sec-co_reward-validity_any-s0 \\
        --finished research/results/smollm2_v3_fast/fast-sec-co_reward-validity_any-s0.json \\
        --recipe smollm2-v3 long --judge co_reward+validity_any -S evolve.strategy=sec --seed 0 \\
        --tag long-sec --out research/results/smollm2_v3_long

A six-iteration loop is the three-iteration one plus three more: the recipe `long` adds it4-it6 and
the stop, and changes no key that it0-it3 read. So instead of running it0-it3 again (about 45 minutes
each on two cores), this copies a finished workspace of `research.real_loops --plain` (its data/ as
hard links), writes params.yaml as `research.real_loops` would for the longer run (today's
params.yaml, the recipes, the judge, the `-S` overrides, the seed), checks that the finished
iterations' params are the ones they ran with (every key the two params.yaml differ in must be one the
finished stages do not read: `loop`, `stop`; or a key params.yaml gained since, at its default; or
one named with `--switch`, an arm switched on from the first new iteration), writes each finished iteration's `history.json` (the
metrics evaluate kept, as today's evaluate would have written them) and runs only the new
iterations' stages and the report (runners/plain.py `--only`). The result is kept as real_loops keeps
it, with `extended_from` and the finished run's wall time beside the new one.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from runners import plain
from runners.dag import stage_order
from runners.comparison import set_by
from runners.experiments import ROOT, keep_result, params_diff, write_reports
from research.real_loops import judge_overrides
from self_improve import recipes
from self_improve.recipes import flatten
from self_improve.stopping import STOPPED

LATER_KEYS = ("loop", "stop")  # what a longer run may change: read only by later iterations' stages


def new_params(old: str, recipe_names: list[str], judge: str, sets: list[str], seed: int,
               switched: tuple[str, ...] = ()) -> tuple[str, list[str]]:
    """The longer run's params.yaml text and `-S` args, as research.real_loops builds them; refuses when a
    key outside LATER_KEYS and `switched` (keys that change from the first new iteration on) differs
    from the finished run's."""
    args = (recipes.set_args(recipes.load_all(recipe_names, ROOT))
            + judge_overrides(judge) + [a for kv in sets for a in ("-S", kv)] + ["-S", f"seed={seed}"])
    ran = yaml.safe_dump(recipes.apply(yaml.safe_load((ROOT / "params.yaml").read_text()), set_by(args)),
                         sort_keys=False)
    later = tuple(f"{p}." for p in LATER_KEYS)
    before, default = flatten(yaml.safe_load(old)), flatten(yaml.safe_load((ROOT / "params.yaml").read_text()))
    # a key added to params.yaml since the finished run, at its default there, is what that run did
    added = {k for k, v in flatten(yaml.safe_load(ran)).items() if k not in before and default.get(k) == v}
    changed = sorted(k for k in params_diff(ran, old) if not k.startswith(later) and k not in switched
                     and k not in added)
    changed += sorted(k for k in params_diff(old, ran) if not k.startswith(later) and k not in switched
                      and k not in changed and k not in added)
    if changed:
        raise SystemExit(f"extend_loop: the finished run ran with other values of {', '.join(changed)}: "
                         "not the same loop")
    return ran, args


def histories(work: Path, finished: list[str]) -> None:
    """data/itN/history.json of each finished iteration: it0 .. itN's metrics, as evaluate writes them."""
    kept: list[dict] = []
    for it in finished:
        metrics = json.loads((work / "reports" / "iterations" / it / "metrics.json").read_text())
        if it != "it0":
            metrics.setdefault(STOPPED, 0.0)  # the finished iterations all trained
        kept.append(metrics)
        (work / "data" / it / "history.json").write_text(json.dumps(kept, indent=2) + "\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path, help="a finished workspace of research.real_loops --plain")
    ap.add_argument("--recipe", nargs="+", required=True, help="the longer run's recipes (e.g. smollm2-v3 long)")
    ap.add_argument("--judge", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("-S", "--set-param", dest="sets", action="append", default=[])
    ap.add_argument("--finished", type=Path, required=True, help="the finished run's kept result (its .json)")
    ap.add_argument("--switch", nargs="*", default=[], metavar="KEY",
                    help="params keys that change from the first new iteration on (an arm switched on midway, "
                         "e.g. judge.shortcut); the result records them")
    ap.add_argument("--tag", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/loops"))
    args = ap.parse_args(argv)
    src = args.src.resolve()
    old = (src / "params.yaml").read_text()
    finished = ["it0", *yaml.safe_load(old)["loop"]]
    ran, set_args = new_params(old, args.recipe, args.judge, args.sets, args.seed, tuple(args.switch))
    stem = f"{args.tag}-{args.judge.replace(':', '-').replace('+', '-')}-s{args.seed}"
    name = f"smol-{stem}"
    work = plain.prepare_workspace(args.workdir.resolve() / name, ran)
    shutil.rmtree(work / "data" / "inputs")
    for rel in ("data", "reports"):
        subprocess.run(["cp", "-a" + ("l" if rel == "data" else ""), str(src / rel), str(work)], check=True)
    histories(work, finished)
    later = [s for s in stage_order(work) if "@" in s and s.split("@")[1] not in finished]
    print(f"+ {name}: {len(later)} stages after {finished[-1]} in {work} (log: {work / 'run.log'})", flush=True)
    t0 = time.perf_counter()
    rc = plain.launch(work, only=(*later, "report"))
    wall = time.perf_counter() - t0
    if rc != 0:
        sys.exit(f"{name}: failed (exit {rc}), {work / 'run.log'} ends:\n" + plain.log_tail(work))
    runner = {"runner": "plain"} | json.loads((work / "device.json").read_text())
    base_wall = json.loads(args.finished.read_text())["wall_seconds"]
    keep_result(name, set_args, args.out.resolve() / f"{stem}.json", work, ran=ran,
                base=(ROOT / "params.yaml").read_text(), wall=wall,
                extra={"judge": args.judge, "seed": args.seed, "tag": args.tag, "extended_from": str(args.finished),
                       "extended_after": finished[-1], "finished_wall_seconds": base_wall,
                       "switched_after": {k: flatten(yaml.safe_load(ran)).get(k) for k in args.switch}},
                report_dir=args.out.resolve() / stem, runner=runner)
    print(write_reports(args.out.resolve()))


if __name__ == "__main__":
    main()
