"""The label-free choice of an iteration on every kept run: how close to the best held-out one?

    python -m research.choice_check --out research/results/choice_check.md

Reads every kept result (reports/<dir>/<variant>/s<seed>.json and reports/<dir>/<name>-s<seed>.json),
runs `choice.recommend` on its per-iteration metrics (label-free signals only), and sets that beside
the truth the rule never reads: the best held-out iteration, whether the recommended one is within
one standard error of it (the best's binomial s.e.), and whether it is below it0 beyond noise (its
paired 95% interval of the gain from it0 below 0, else 2 s.e. of the difference). Results kept
before evaluate recorded the signals have none: the rule keeps it0 on them, and the counts say so.
Results kept before it recorded the base support are judged on the plain agreement, as the rule does.
The same counts for other minimum agreement gains (0: any rise beyond noise) show how much the
default depends on its value. Real-model loops kept before the base support was recorded are counted
on the plain agreement; the ones replayed with it (`research.base_support`, `--replayed`) are counted
again with their replayed signals, since the supported agreement rises less there than the plain one.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from research.alarm_check import ROOT, history, runs
from self_improve.choice import MIN_AGREEMENT_GAIN, recommend, unsupported_agreement

SENSITIVITY = (0.0, 0.02, 0.03, 0.05, 0.08, 0.10, 0.15)  # minimum agreement gains the check also counts


def below_it0(rows: list[dict], it: str) -> bool:
    base, row = rows[0], next(r for r in rows if r["iteration"] == it)
    if it == base["iteration"]:
        return False
    if row.get("accuracy_gain_hi") is not None:
        return row["accuracy_gain_hi"] < 0
    return base["accuracy"] - row["accuracy"] > 2 * math.hypot(base["accuracy_se"], row["accuracy_se"])


def check(rows: list[dict], min_gain: float = MIN_AGREEMENT_GAIN) -> dict:
    rec = recommend(rows, min_gain)
    scored = [r for r in rows if r.get("accuracy") is not None]
    best = max(scored, key=lambda r: r["accuracy"])
    chosen = next(r for r in rows if r["iteration"] == rec["iteration"])
    return {"recommended": rec["iteration"], "reason": rec["reason"], "best": best["iteration"],
            "within": best["accuracy"] - chosen["accuracy"] <= best["accuracy_se"],
            "below_it0": below_it0(rows, rec["iteration"]),
            "signals": rows[0].get("lf_agreement") is not None,
            "supported": rows[0].get("lf_supported_agreement") is not None,
            "acc": (chosen["accuracy"], best["accuracy"]),
            "unsupported_it0": unsupported_agreement(rows[0]),  # not read by the rule
            "moved": moved(rows[0], chosen, rec["rows"].get(chosen["iteration"], {}).get("agreement_gain_lo"))}


def moved(base: dict, row: dict, gain_lo: float | None) -> str:
    """How the recommended iteration's label-free signals stand against it0's (empty at it0): `gain_lo`,
    the low end of the agreement gain the rule read there (`recommend`'s rows), base support and agreement
    the base never samples it0 -> there, and distinct answers and the commonest answer's share as a
    factor of it0's."""
    if row is base or gain_lo is None:
        return ""
    out = [f"low end {gain_lo:+.3f}"]
    if base.get("lf_base_support") is not None:
        out.append(f"support {base['lf_base_support']:.3f} -> {row['lf_base_support']:.3f}")
        out.append(f"never sampled {unsupported_agreement(base):.3f} -> {unsupported_agreement(row):.3f}")
    for k, what in (("lf_distinct", "distinct"), ("lf_mode_share", "commonest")):
        if base.get(k) and row.get(k) is not None:
            out.append(f"{what} x{row[k] / base[k]:.2f}")
    return "; ".join(out)


def replayed(path, kept: dict[str, list[dict]]) -> list[tuple[str, list[dict]]]:
    """The kept runs that `research.base_support` replayed with the base support (its JSON: `run`, the
    loop's directory name, which may carry a prefix such as `gpu-`, and `history`): each kept run's rows
    with the replayed label-free signals in place of the recorded ones. The kept run is the one of that
    name (prefix or not) whose iterations and held-out accuracies are the replay's; none, or more than
    one: an error naming the run."""
    try:
        replays = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise SystemExit(f"--replayed {path}: {err}") from None
    out = []
    for res in replays:
        run, new = res["run"], {r["iteration"]: r for r in res["history"]}
        same = [name for name, rows in kept.items()
                if (leaf := name.rsplit("/", 1)[-1]) and (run == leaf or run.endswith(f"-{leaf}"))
                and [r["iteration"] for r in rows] == list(new)
                and all(abs(r["accuracy"] - new[r["iteration"]]["accuracy"]) < 1e-9 for r in rows)]
        if len(same) != 1:
            raise SystemExit(f"{path}: replayed run {run!r} matches {len(same)} kept results by name and held-out "
                             f"accuracy ({', '.join(same) or 'none'}), not one")
        out.append((same[0], [{**{k: v for k, v in r.items() if not k.startswith("lf_")},
                               **{k: v for k, v in new[r["iteration"]].items() if k.startswith("lf_")}}
                              for r in kept[same[0]]]))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="research/results/choice_check.md")
    ap.add_argument("--replayed", default="research/results/base_support_smollm2.json",
                    help="research.base_support's JSON: real-model loops replayed with the base support")
    args = ap.parse_args(argv)
    lines = ["| run | signals (supported: with the base support) | recommended | held-out there | best held-out | within 1 s.e. | below it0 beyond noise | it0 agreement the base never samples | signals there against it0 |",
             "|---|---|---|---|---|---|---|---|---|"]
    done, kept, by_name = [], [], {}  # each run's check and its per-iteration rows
    for name, result in runs():
        rows = history(result)
        if len(rows) < 2 or rows[0].get("iteration") != "it0" or any(r.get("accuracy_se") is None for r in rows):
            continue
        c = check(rows)
        done.append(c)
        kept.append(rows)
        by_name[name] = rows
        lines.append(f"| {name} | {'supported' if c['supported'] else 'yes' if c['signals'] else 'no'} | {c['recommended']} | {c['acc'][0]:.3f} | "
                     f"{c['best']} ({c['acc'][1]:.3f}) | {'yes' if c['within'] else 'NO'} | "
                     f"{'YES' if c['below_it0'] else 'no'} | "
                     f"{'' if c['unsupported_it0'] is None else format(c['unsupported_it0'], '.3f')} | {c['moved']} |")

    def counts(cs: list[dict]) -> str:
        if not cs:
            return "none"
        return (f"{sum(c['within'] for c in cs)}/{len(cs)} within one s.e. of the best held-out iteration "
                f"({100 * sum(c['within'] for c in cs) / len(cs):.0f}%), {sum(c['below_it0'] for c in cs)} below "
                "it0 beyond noise")

    with_signals = [c for c in done if c["signals"]]
    supported = [c for c in done if c["supported"]]
    sensitivity = ", ".join(f"{m:.2f}: {sum(c['within'] for c in cs)} within, {sum(c['below_it0'] for c in cs)} below"
                            for m in SENSITIVITY for cs in [[check(rows, m) for rows in kept]])
    head = [f"Minimum agreement gain (95% low end) {MIN_AGREEMENT_GAIN:.2f}.",
            f"All kept runs ({len(done)}): {counts(done)}.",
            f"Runs with the label-free signals recorded ({len(with_signals)}): {counts(with_signals)}.",
            (f"Of those, runs with the base support recorded, where the rule reads the supported agreement "
             f"({len(supported)}): {counts(supported)}."),
            (f"Runs without the signals (kept before they were recorded, or a task without rewrites) "
             f"({len(done) - len(with_signals)}): the rule keeps it0 on them (no signal, do no harm)."),
            f"With other minimum agreement gains (of {len(kept)}): {sensitivity}.", ""]
    again = replayed(ROOT / args.replayed, by_name)
    replay = []
    for m in SENSITIVITY:
        cs = [(name, check(rows, m)) for name, rows in again]
        missed = [f"{name} ({c['recommended']}, best {c['best']})" for name, c in cs if not c["within"]]
        replay.append(f"{m:.2f}: {sum(c['within'] for _, c in cs)} within, {sum(c['below_it0'] for _, c in cs)} below"
                      + (f" (not within: {', '.join(missed)})" if missed else ""))
    head.insert(-1, f"The {len(again)} real-model loops kept before the base support, replayed with it ({args.replayed}, "
                    f"research.base_support), at each minimum agreement gain: {'; '.join(replay)}.")
    text = "\n".join(head + lines) + "\n"
    (ROOT / args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
