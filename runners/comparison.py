"""Variants of the loop compared over seeds, from their kept results (`<out>/<variant>/s<seed>.json`,
as runners/experiments.py keeps them): the mean +- sd table at every iteration with the per-seed values
(`table`), one row per variant against a baseline at the same seeds (`comparison`), the plot
(`plot`) and the iteration each run's label-free choice picked (`choices`).

One run cannot tell two variants apart (floating point differs between machines, and every later
figure inherits it), so every figure here is over seeds, and a difference is called only where the
paired differences' t interval excludes 0 (`beyond_noise`).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from self_improve.recipes import parse_assignment


def mean_sd(values: list[float]) -> str:
    """`0.512 +- 0.034 (0.48, 0.55, 0.50)`; one value is marked as a single run."""
    if not values:
        return ""
    if len(values) == 1:
        return f"{values[0]:.3f} (1 seed)"
    each = ", ".join(f"{v:.2f}" for v in values)
    return f"{statistics.mean(values):.3f} +- {statistics.stdev(values):.3f} ({each})"


def set_by(args: list[str]) -> dict[str, Any]:
    """{key: value} of the `-S key=value` arguments, values read as YAML."""
    return dict(parse_assignment(a) for a, prev in zip(args, [None, *args]) if prev == "-S")


def unexpected_params(result: dict) -> dict[str, Any]:
    """Params a kept result ran with other than it says: keys that differ from HEAD's beyond its own
    `-S` overrides and seed, and overrides whose recorded value is not the one asked for ({} for a
    clean run, and for results kept before the params were recorded)."""
    if "params_diff" not in result:
        return {}
    asked = set_by(result.get("args") or []) | set_by([x for o in result.get("overrides") or [] for x in ("-S", o)])
    stray = {k: v for k, v in result["params_diff"].items() if k not in asked and k != "seed"}
    ran = result.get("params_set") or {}
    stray |= {k: ran.get(k) for k, v in asked.items() if k in ran and ran[k] != v}
    return stray


def load_results(out: Path) -> dict[str, list[dict]]:
    """Kept results by variant, seeds in order: `<out>/<variant>/s<seed>.json` (or a flat
    `<out>/*.json` with a `variant` or `judge` field; a `tag` (real_loops --tag) prefixes the judge, so
    `nft` runs of a judge are a variant of their own)."""
    groups: dict[str, list[dict]] = {}
    for f in sorted(out.glob("*.json")) + sorted(out.glob("*/s*.json")):
        r = json.loads(f.read_text())
        if stray := unexpected_params(r):
            print(f"{f}: left out: it ran with params beyond its overrides {stray}", file=sys.stderr)
            continue
        judge = r.get("judge") and (f"{r['tag']}-{r['judge']}" if r.get("tag") else r["judge"])
        groups.setdefault(r.get("variant") or judge or f.parent.name, []).append(r)
    order = sorted(groups, key=lambda k: (k != "default", k))  # the baseline first
    return {k: sorted(groups[k], key=lambda r: r["seed"]) for k in order}


def series(runs: list[dict], key: str, it: str) -> list[float]:
    return [r["metrics"][it][key] for r in runs if r["metrics"].get(it, {}).get(key) is not None]


def gain(runs: list[dict], key: str, first: str, last: str) -> list[float]:
    return [r["metrics"][last][key] - r["metrics"][first][key] for r in runs
            if r["metrics"].get(last, {}).get(key) is not None and r["metrics"].get(first, {}).get(key) is not None]


def alarms(run: dict, its: list[str]) -> list[str]:
    from self_improve.quality import reward_hacking_alarm

    return reward_hacking_alarm([{"iteration": it, **run["metrics"].get(it, {})} for it in its])


def intervals(runs: list[dict], key: str, last: str) -> str:
    """Each seed's paired 95% interval of the gain it0 -> last (evaluate's `<key>_gain_lo/hi`), where
    recorded: `[-0.02, 0.08]; [0.01, 0.09]`."""
    out = []
    for r in runs:
        m = r["metrics"].get(last, {})
        if m.get(f"{key}_gain_lo") is not None:
            out.append(f"[{m[f'{key}_gain_lo']:+.3f}, {m[f'{key}_gain_hi']:+.3f}]")
    return "; ".join(out)


def table(groups: dict[str, list[dict]], its: list[str]) -> str:
    last = its[-1]
    head = (["variant", "seeds"] + [f"held-out {it}" for it in its] + [f"held-out gain {its[0]}->{last}"]
            + ["held-out gain 95% CI per seed (paired)"]
            + [f"test-time {it}" for it in its] + [f"test-time gain {its[0]}->{last}", f"judge AUC {its[1]}",
                                                    f"judge AUC {last}", "alarm fired"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for variant, runs in groups.items():
        tested = [r for r in runs if any(k.endswith("_se") for m in r["metrics"].values() for k in m)]
        fired = (f"{sum(bool(alarms(r, its)) for r in tested)} of {len(tested)}" if tested
                 else "n/a (no s.e. recorded)")
        cells = [variant, ", ".join(str(r["seed"]) for r in runs)]
        cells += [mean_sd(series(runs, "accuracy", it)) for it in its] + [mean_sd(gain(runs, "accuracy", its[0], last))]
        cells += [intervals(runs, "accuracy", last)]
        cells += [mean_sd(series(runs, "ttt_accuracy", it)) for it in its]
        cells += [mean_sd(gain(runs, "ttt_accuracy", its[0], last))]
        cells += [mean_sd(series(runs, "judge_auc", its[1])), mean_sd(series(runs, "judge_auc", last)),
                  fired]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def paired(runs: list[dict], base: list[dict], key: str, it: str) -> list[float]:
    """Per seed, the variant's value minus the baseline's at the same seed (the same base model and
    problem sets), over the seeds both have."""
    theirs = {r["seed"]: r["metrics"].get(it, {}).get(key) for r in base}
    return [r["metrics"][it][key] - theirs[r["seed"]] for r in runs
            if r["metrics"].get(it, {}).get(key) is not None and theirs.get(r["seed"]) is not None]


def beyond_noise(diffs: list[float], level: float = 0.95) -> bool:
    """A paired t-test over seeds: the `level` interval of the mean difference excludes 0 (at least
    3 seeds; with 3, the mean must exceed 4.3 standard errors)."""
    if len(diffs) < 3:
        return False
    from scipy.stats import t

    se = statistics.stdev(diffs) / len(diffs) ** 0.5
    return abs(statistics.mean(diffs)) > t.ppf(0.5 + level / 2, len(diffs) - 1) * se


def comparison(groups: dict[str, list[dict]], its: list[str], baseline: str = "default") -> str:
    """One row per variant: its overrides, the gain it0 -> last on both sets as mean +- sd over seeds,
    its last held-out accuracy against the baseline's at the same seeds (mean +- sd of the paired
    differences; **bold** where a paired t-test over at least 3 seeds puts it beyond noise), judge
    AUC at the last iteration, and how many seeds raised the alarm."""
    last = its[-1]
    head = ["variant", "overrides", "seeds", f"held-out {its[0]} -> {last}", "held-out gain",
            "test-time gain", f"held-out {last} - {baseline}'s, same seed", f"judge AUC {last}", "alarm fired"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    base = groups.get(baseline, [])
    for variant, runs in groups.items():
        first_acc, last_acc = series(runs, "accuracy", its[0]), series(runs, "accuracy", last)
        span = (f"{statistics.mean(first_acc):.3f} -> {statistics.mean(last_acc):.3f}"
                if first_acc and last_acc else "")
        diff = paired(runs, base, "accuracy", last) if variant != baseline else []
        vs = mean_sd(diff)
        if beyond_noise(diff):
            vs = f"**{vs}**"
        tested = [r for r in runs if any(k.endswith("_se") for m in r["metrics"].values() for k in m)]
        fired = f"{sum(bool(alarms(r, its)) for r in tested)} of {len(tested)}" if tested else "n/a"
        overrides = ", ".join(f"`{o}`" for o in (runs[0].get("overrides") or [])) or "(none)"
        lines.append("| " + " | ".join([
            variant, overrides, str(len(runs)), span, mean_sd(gain(runs, "accuracy", its[0], last)),
            mean_sd(gain(runs, "ttt_accuracy", its[0], last)), vs if variant != baseline else "",
            mean_sd(series(runs, "judge_auc", last)), fired]) + " |")
    return "\n".join(lines) + "\n"


def baseline(groups: dict[str, list[dict]]) -> str:
    """What each variant is set against at the same seeds: the `default` variant of a seeds table; in
    a judge table (research/results/smollm2*/) without one, the oracle `verifier`, so the column says how far
    each label-free rule ends from a judge that is always right."""
    return "default" if "default" in groups or "verifier" not in groups else "verifier"


def families(names: list[str], baseline: str = "default") -> dict[str, list[str]]:
    """Variants by the prefix of their name (`judge-`, `algo-`, ...), the baseline in each family;
    with no prefixed names, one family of all."""
    fams: dict[str, list[str]] = {}
    for name in names:
        if name != baseline and "-" in name:
            fams.setdefault(name.split("-", 1)[0], []).append(name)
    if not fams:
        return {"": list(names)}
    lone = [n for n in names if n != baseline and "-" not in n]
    return {fam: ([baseline] if baseline in names else []) + members + lone for fam, members in fams.items()}


def plot(groups: dict[str, list[dict]], its: list[str], path: Path) -> None:
    """Held-out and test-time accuracy per iteration, mean with +- sd error bars, one line per variant,
    one row of two panels per family of variants."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fams = families(list(groups))
    fig, axes = plt.subplots(len(fams), 2, figsize=(11, 3.6 * len(fams)), sharey=True, squeeze=False)
    for row, (fam, names) in zip(axes, fams.items()):
        for ax, key, title in zip(row, ("accuracy", "ttt_accuracy"), ("held-out accuracy", "test-time accuracy")):
            for variant in names:
                runs = groups[variant]
                xs, means, sds = [], [], []
                for i, it in enumerate(its):
                    vals = series(runs, key, it)
                    if vals:
                        xs.append(i)
                        means.append(statistics.mean(vals))
                        sds.append(statistics.stdev(vals) if len(vals) > 1 else 0.0)
                ax.errorbar(xs, means, yerr=sds, marker="o", capsize=3, label=f"{variant} (n={len(runs)})",
                            **({"color": "black", "linewidth": 2} if variant == "default" else {}))
            ax.set_xticks(range(len(its)), its)
            ax.set_title(f"{fam + ': ' if fam else ''}{title} (mean +- sd over seeds)", fontsize=10)
            ax.grid(alpha=0.3)
        row[0].set_ylabel("accuracy")
        row[1].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


def choices(groups: dict[str, list[dict]], its: list[str]) -> str | None:
    """What each run's iterations sampled at and kept for RAFT (B-STaR's choice where it was on): one
    row per variant and seed, `temperature / threshold (balance)` per iteration; None when no run
    recorded a B-STaR sweep."""
    if not any(r["metrics"].get(it, {}).get("bstar_balance") is not None
               for runs in groups.values() for r in runs for it in its):
        return None
    steps = its[1:]
    lines = ["# Temperature and RAFT threshold per iteration", "",
             "`temperature / threshold (balance score)` per iteration; the balance score only where B-STaR "
             "chose (sample.bstar.enabled), with its sweep's cost in seconds.", "",
             "| variant | seed | " + " | ".join(steps) + " | sweep seconds |",
             "|---|---|" + "---|" * len(steps) + "---|"]
    for variant, runs in groups.items():
        for r in runs:
            cells, secs = [], []
            for it in steps:
                m = r["metrics"].get(it, {})
                t, h, b = m.get("sample_temperature"), m.get("sft_min_reward"), m.get("bstar_balance")
                cell = "–" if t is None else f"{t:g} / {h:g}" + (f" ({b:.3f})" if b is not None else "")
                cells.append(cell)
                if m.get("bstar_seconds") is not None:
                    secs.append(f"{m['bstar_seconds']:.1f}")
            lines.append(f"| {variant} | {r['seed']} | " + " | ".join(cells) + f" | {', '.join(secs) or '–'} |")
    return "\n".join(lines) + "\n"
