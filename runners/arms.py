"""Kept loops read per category and against their control arms: the tables that say whether a gain
is more than a shortcut.

    python -m runners.arms research/results/smollm2_gym_arms     # writes categories.md, controls.md, bar.md there

`categories.md`: per arm (a judge or rule) and held-out category, it0 and the last iteration's
accuracy (mean +- sd over seeds), the shortcut floor (the best policy that reads only the question,
self_improve/floors.py), the gain that counts (over max(it0, floor), per seed against whichever is
higher) with the lowest low end of its per-seed paired 95% intervals, and the gain over it0.
`controls.md`: each arm against each control arm (random, format, validity_only; the one looped under the
arm's task and evolve settings, as its curriculum, where there is one), the vote
(majority_vote) and the kept rules it extends (scpo for scpo+validity_any; the untagged rule for a tagged
run such as sec-scpo) at the same seed, and each label-free arm against the oracle (verifier: how far
gold labels take the same loop), problem by problem on the held-out set at the last iteration (a paired bootstrap over the problems of each seed: the mean difference and each seed's interval).
`bar.md`: each arm against the bar a label-free gain must clear (over three seeds, above the floor and every
control arm by paired intervals, no category lost beyond noise), and how close it came: at the last iteration,
and at the iteration the label-free choice keeps (self_improve/choice.py, the product's rule, per seed), there
against the controls at that same iteration.
write_reports (runners/experiments.py) rebuilds them whenever a kept result lands.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import pandas as pd
import yaml

from self_improve import artifacts as art
from self_improve.choice import recommend
from self_improve.quality import paired_gain

CONTROLS = ("random", "format", "validity_only", "majority_vote")
ORACLE = "verifier"  # gold labels: read beside the bar, never a label-free result
BAR_SEEDS = 3
ALL = "(all)"


SAME_LOOP = "same_loop.yaml"  # seeds an arm reads from a run kept under another name (`load`)


def load(out: Path) -> dict[str, list[dict]]:
    """Kept results by arm, seeds in order, each with its answers file where one was kept.

    `out`/same_loop.yaml may name, per arm and seed, a run kept under another name that is that arm's loop
    under its settings of today (`{arm: {seed: {run: <result file stem>, why: ...}}}`: a seed cut by an
    older stop, carried on under another tag): the arm reads that run there instead (`read_for`: why)."""
    groups: dict[str, list[dict]] = {}
    stems: dict[str, dict] = {}
    for f in sorted(out.glob("*.json")) + sorted(out.glob("*/s*.json")):
        r = json.loads(f.read_text())
        name = r.get("variant") or (f"{r['tag']}-{r['judge']}" if r.get("tag") else r.get("judge")) or f.parent.name
        for answers in (out / f.stem / "answers.parquet", f.with_name(f"{f.stem}.answers.parquet")):
            if answers.is_file():
                r["answers_path"] = answers
        groups.setdefault(name, []).append(r)
        stems[f.relative_to(out).with_suffix("").as_posix()] = r
    same = out / SAME_LOOP
    for arm, seeds in ((yaml.safe_load(same.read_text()) or {}) if same.is_file() else {}).items():
        for seed, entry in (seeds or {}).items():
            run = stems.get(str((entry or {}).get("run")))
            if arm not in groups or run is None or not (entry or {}).get("why"):
                raise SystemExit(f"{same}: {arm} seed {seed}: needs a kept arm, `run` (a result file's stem in "
                                 f"{out}) and `why`; got {entry!r}")
            if run["seed"] != int(seed):
                raise SystemExit(f"{same}: {arm} seed {seed}: {entry['run']} is seed {run['seed']}")
            read = dict(run, read_for=f"s{seed} reads {entry['run']}: {' '.join(str(entry['why']).split())}")
            groups[arm] = [r for r in groups[arm] if r["seed"] != int(seed)] + [read]
    return {k: sorted(v, key=lambda r: r["seed"]) for k, v in sorted(groups.items())}


def draws(run: dict) -> tuple | None:
    """What decides the problems a kept run trains and is tested on: its `task.*` and `evolve.*` settings (the
    last value of each, as the runner applies them; a curriculum's fresh draws among them), or None for a run
    kept before results recorded their settings."""
    if not run.get("args"):
        return None
    settings = {}
    for a in run["args"]:
        key, eq, value = a.partition("=")
        if eq and key.lstrip("+").startswith(("task.", "evolve.")):  # a value read as the runner reads it, key order aside
            settings[key.lstrip("+")] = json.dumps(yaml.safe_load(value), sort_keys=True, default=str)
    return tuple(sorted(settings.items()))


def is_control(name: str, groups: dict[str, list[dict]]) -> bool:
    """A control arm, under the recipe's settings (`random`) or tagged (`mix128-random`: under other settings)."""
    return name in CONTROLS or any(r.get("judge") in CONTROLS for r in groups.get(name, []))


def controls_for(arm: str, groups: dict[str, list[dict]]) -> list[tuple[str, str, bool]]:
    """Per control arm, the kept group `arm` is read against, and whether it ran under the arm's task and evolve
    settings (the same task, curriculum and fresh draws, the judgment replaced): the one that did where it was
    looped, else the control under the recipe's own settings, flagged. A control never looped is left out."""
    mine, out = draws(groups[arm][0]), []
    for control in CONTROLS:
        kept = [g for g, runs in groups.items() if g == control or (g.endswith(f"-{control}") and runs[0].get("judge") == control)]
        same = [g for g in kept if draws(groups[g][0]) == mine]
        if same:
            out.append((control, control if control in same else same[0], True))
        elif control in groups:
            out.append((control, control, False))
    return out


def last_iteration(runs: list[dict]) -> str:
    return max((it for r in runs for it in r["metrics"]), key=lambda it: int(it[2:]))


def history(run: dict) -> list[dict]:
    """A kept run's metrics as the choice reads them: it0 first, then each iteration in order."""
    return [{"iteration": it, **m} for it, m in sorted(run["metrics"].items(), key=lambda kv: int(kv[0][2:]))]


def chosen_iteration(run: dict) -> str:
    """The iteration the label-free choice keeps for a kept run (the product's rule, as the loop's summary
    and `self_improve.models.export --iteration recommended` read it)."""
    return recommend(history(run))["iteration"]


def _mean_sd(values: list[float], signed: bool = False) -> str:
    if not values:
        return ""
    f = "{:+.3f}" if signed else "{:.3f}"
    if len(values) == 1:  # the arm's row says how many seeds it has
        return f.format(values[0])
    return f"{f.format(statistics.mean(values))} +- {statistics.stdev(values):.3f}"


def _key(metric: str, cat: str) -> str:
    return metric if cat == ALL else f"{metric}/{cat}"


def categories(runs: list[dict]) -> list[str]:
    it0 = [r["metrics"].get("it0", {}) for r in runs]
    return sorted({k.split("/", 1)[1] for m in it0 for k in m if k.startswith("accuracy/")})


def counted_gain(m0: dict, m: dict, cat: str) -> tuple[float, float] | None:
    """(gain, paired low end) over max(it0, floor) in one run: over it0 where it0 is at least the floor,
    else over the floor policy; None where the figures are missing."""
    acc0, floor = m0.get(_key("accuracy", cat)), m0.get(_key("floor", cat))
    if floor is not None and acc0 is not None and floor > acc0:
        g, lo = m.get(_key("floor_gain", cat)), m.get(_key("floor_gain_lo", cat))
    else:
        g, lo = m.get(_key("accuracy_gain", cat)), m.get(_key("accuracy_gain_lo", cat))
    return None if g is None or lo is None else (g, lo)


def category_table(groups: dict[str, list[dict]]) -> str:
    head = ["arm", "category", "it0", "last", "floor", "gain over max(it0, floor)", "lowest paired low end",
            "gain over it0"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, runs in groups.items():
        last = last_iteration(runs)
        for cat in [ALL] + categories(runs):
            m0s = [r["metrics"].get("it0", {}) for r in runs]
            ms = [r["metrics"].get(last, {}) for r in runs]
            acc0 = [m[_key("accuracy", cat)] for m in m0s if _key("accuracy", cat) in m]
            accl = [m[_key("accuracy", cat)] for m in ms if _key("accuracy", cat) in m]
            floor = [m[_key("floor", cat)] for m in m0s if _key("floor", cat) in m]
            counted = [c for m0, m in zip(m0s, ms) if (c := counted_gain(m0, m, cat)) is not None]
            over0 = [m[_key("accuracy_gain", cat)] for m in ms if _key("accuracy_gain", cat) in m]
            lows = min((lo for _, lo in counted), default=None)
            lines.append("| " + " | ".join([
                f"{arm} ({len(runs)} seed{'s' if len(runs) > 1 else ''}, {last})" if cat == ALL else "",
                cat, _mean_sd(acc0), _mean_sd(accl), _mean_sd(floor),
                _mean_sd([g for g, _ in counted], signed=True),
                "" if lows is None else f"{lows:+.3f}", _mean_sd(over0, signed=True)]) + " |")
    return "\n".join(lines) + "\n"


def heldout_correct(run: dict, it: str) -> pd.Series | None:
    path = run.get("answers_path")
    if path is None:
        return None
    a = art.read_table(path, art.KEPT_EVAL_COMMON)
    a = a[(a["iteration"] == it) & (a["set"] == "heldout")]
    return a.set_index("prompt_id")["correct"].astype(float)


def extended(arm: str, groups: dict[str, list[dict]]) -> list[str]:
    """The kept rules `arm` extends: those its name starts with, up to a `+` (scpo and scpo+validity_any
    for scpo+validity_any+category_gate), so that what each added part does is read at the same seeds.
    A tagged arm (`tag-rule`: the rule under other settings, e.g. sec-scpo for the sec curriculum)
    extends the rule under the recipe's own settings first, then what that rule extends."""
    _tag, dash, rule = arm.partition("-")
    if dash and rule in groups:
        return [r for r in (rule, *extended(rule, groups)) if r not in CONTROLS]
    parts = arm.split("+")
    return [p for p in ("+".join(parts[:i]) for i in range(1, len(parts))) if p in groups and p not in CONTROLS]


def paired_against(runs: list[dict], control_runs: list[dict], chosen: bool = False) -> list[tuple[int, dict]]:
    """Per seed both arms share, the paired gain of `runs` over `control_runs` on the held-out problems at
    each one's last iteration (`chosen`: at the iteration the label-free choice keeps for the arm's run, the
    control at that same iteration): (seed, {gain, lo, hi})."""
    last, theirs = last_iteration(runs), {r["seed"]: r for r in control_runs}
    out = []
    for r in runs:
        if r["seed"] not in theirs:
            continue
        it = chosen_iteration(r) if chosen else last
        control_it = it if chosen else last_iteration([theirs[r["seed"]]])
        mine, other = heldout_correct(r, it), heldout_correct(theirs[r["seed"]], control_it)
        if mine is None or other is None:
            continue
        both = mine.index.intersection(other.index)
        g = paired_gain(other.loc[both], mine.loc[both])
        if g is not None:
            out.append((r["seed"], g))
    return out


def control_table(groups: dict[str, list[dict]]) -> str:
    head = ["arm", "against", "seeds", "difference at the last iteration", "per-seed paired 95% intervals"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, runs in groups.items():
        if is_control(arm, groups):
            continue
        oracle = (ORACLE,) if arm != ORACLE else ()
        against = [(g, "" if same else " (other settings)") for _, g, same in controls_for(arm, groups)]
        for control, note in (*against, *((g, "") for g in (*extended(arm, groups), *oracle))):
            paired = paired_against(runs, groups.get(control, []))
            if paired:
                cis = "; ".join(f"s{s} [{g['lo']:+.3f}, {g['hi']:+.3f}]" for s, g in paired)
                lines.append(f"| {arm} | {control}{note} | {len(paired)} | "
                             f"{_mean_sd([g['gain'] for _, g in paired], signed=True)} | {cis} |")
    return "\n".join(lines) + "\n"


def bar_row(arm: str, groups: dict[str, list[dict]], chosen: bool = False) -> list[str]:
    """One arm against the bar a label-free gain must clear: over `BAR_SEEDS` seeds, above max(it0, floor)
    and above every control arm looped under its settings (`controls_for`), each by a paired 95% interval whose low end is above 0 on every seed, and
    no category below it0 beyond noise (a seed whose interval of the category's gain over it0 ends below 0).
    A control not looped at one of the arm's seeds is named with those seeds: the bar cannot be read there.
    At the last iteration, or (`chosen`) at the iteration the label-free choice keeps in each seed's run:
    where that is it0 the run kept the base model: no gain over it0 (0, its low end 0), and under the floor
    the base's own shortfall."""
    runs = groups[arm]
    last = last_iteration(runs)
    at = {r["seed"]: chosen_iteration(r) if chosen else last for r in runs}
    seeds = [r["seed"] for r in runs]
    counted = [counted_gain(r["metrics"].get("it0", {}), r["metrics"].get(at[r["seed"]], {}), ALL) for r in runs]
    counted = [(0.0, 0.0) if c is None and at[r["seed"]] == "it0" else c for r, c in zip(runs, counted)]
    floor_lo = min((c[1] for c in counted if c is not None), default=None)
    floor_ok = floor_lo is not None and floor_lo > 0 and None not in counted
    worst_control, control_lo, controls_ok, missing = "", None, True, []
    matched = {control: group for control, group, same in controls_for(arm, groups) if same}
    for control in CONTROLS:
        paired = dict(paired_against(runs, groups.get(matched.get(control, ""), []), chosen))
        if set(paired) != set(seeds):
            controls_ok = False  # a control not looped under the arm's settings at one of its seeds: the bar cannot be read
            missing.append(f"{control} ({', '.join(f's{s}' for s in sorted(set(seeds) - set(paired)))})")
        for g in paired.values():
            if control_lo is None or g["lo"] < control_lo:
                worst_control, control_lo = matched[control], g["lo"]
    controls_ok = controls_ok and control_lo is not None and control_lo > 0
    losses = sorted({f"{cat} (s{r['seed']})" for r in runs for cat in categories([r])
                     if (hi := r["metrics"].get(at[r["seed"]], {}).get(_key("accuracy_gain_hi", cat))) is not None
                     and hi < 0})
    met = len(set(seeds)) >= BAR_SEEDS and floor_ok and controls_ok and not losses
    where = last if not chosen else ", ".join(f"s{s} {it}" for s, it in at.items())
    return [arm, str(len(seeds)), where, _mean_sd([c[0] for c in counted if c is not None], signed=True),
            "" if floor_lo is None else f"{floor_lo:+.3f}",
            "" if control_lo is None else f"{control_lo:+.3f} ({worst_control})", "; ".join(missing) or "none",
            ", ".join(losses) or "none", "oracle" if arm == ORACLE else ("yes" if met else "no")]


def bar_table(groups: dict[str, list[dict]], chosen: bool = False) -> str:
    head = ["arm", "seeds", "iteration", "gain over max(it0, floor)", "lowest paired low end over it",
            "lowest paired low end over a control arm", "controls not looped under its settings at a seed",
            "categories below it0 beyond noise", "clears the bar"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(bar_row(arm, groups, chosen)) + " |" for arm in groups if not is_control(arm, groups)]
    return "\n".join(lines) + "\n"


def write(out: Path) -> None:
    groups = load(out)
    if not any("floor" in r["metrics"].get("it0", {}) or any(k.startswith("accuracy/") for k in r["metrics"].get("it0", {}))
               for runs in groups.values() for r in runs):
        return  # kept before per-category figures: nothing to write
    (out / "categories.md").write_text(
        "# Per category: it0, the last iteration, the floor and the gain that counts\n\n"
        "Mean +- sd over seeds (generated by `python -m runners.arms`). The gain that counts is, per seed, over "
        "max(it0, floor) of the category; its lowest paired low end is the smallest low end of the seeds' paired "
        "95% intervals (above 0 on every seed when it is above 0).\n\n" + category_table(groups))
    (out / "controls.md").write_text(
        "# Each arm against the control arms, problem by problem\n\n"
        "Held-out accuracy at the last iteration minus the control's (a control arm, the vote, a kept rule the arm "
        "extends, or the oracle's gold labels) at the same seed (the same held-out problems; a control marked (other "
        "settings) trained under other task or evolve settings than the arm's, as a fixed mix beside a curriculum), "
        "mean +- sd over seeds, with each seed's paired bootstrap 95% interval (generated by `python -m runners.arms`).\n\n"
        + control_table(groups))
    (out / "bar.md").write_text(
        "# The bar a label-free gain must clear\n\n"
        f"Each arm over its seeds (generated by `python -m runners.arms`). It clears the bar "
        f"when, over at least {BAR_SEEDS} seeds, it lies above max(it0, floor) and above every control arm "
        f"({', '.join(CONTROLS)}) at the same seed, each by a paired 95% interval whose low end is above 0 on every seed, "
        "and no category ends below it0 by an interval (its gain's high end under 0). The controls read here ran "
        "under the arm's task and evolve settings (its curriculum and fresh draws; controls.md marks a control under "
        "other settings, never read toward the bar). The oracle's row "
        "(gold labels) says how far the loop reaches with right labels.\n\n"
        + "".join(f"{arm}, {r['read_for']}\n\n" for arm, runs in groups.items() for r in runs if r.get("read_for"))
        + "## At the last iteration\n\n" + bar_table(groups) + "\n"
        "## At the iteration the label-free choice keeps\n\n"
        "Per seed, the iteration the product's choice (self_improve/choice.py) recommends from the run's label-free "
        "signals, the one a user exports; the controls at that same iteration. A seed kept at it0 gained nothing.\n\n"
        + bar_table(groups, chosen=True))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="a directory of kept results (research/results/smollm2_gym_arms, ...)")
    args = ap.parse_args(argv)
    write(args.out)
    for name in ("categories.md", "controls.md", "bar.md"):
        if (args.out / name).is_file():
            print((args.out / name).read_text())


if __name__ == "__main__":
    main()
