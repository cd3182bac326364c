"""The reward-hacking alarm on every kept run: does it fire where held-out accuracy was lost?

    python -m research.alarm_check --out research/results/alarm_check.md

Reads every kept result (`runs`: research/results/ and reports/, <dir>/<variant>/s<seed>.json and <dir>/<name>-s<seed>.json),
runs `quality.reward_hacking_alarm` on its per-iteration metrics, and sets that beside the truth:
whether some iteration's held-out accuracy fell below it0's by more than 2 standard errors of the
difference (binomial s.e. of each, as the alarm reads them). Older results without `accuracy_se`
get it from their held-out size (`heldout_n`, else the run's `task.heldout_size` override). Writes
one row per run and the counts: lost runs the alarm missed, oracle runs it fired on.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

from self_improve.quality import binomial_se, reward_hacking_alarm

ROOT = Path(__file__).resolve().parents[1]


def heldout_size(result: dict) -> int | None:
    args = result.get("args") or []
    for a in args:
        if isinstance(a, str) and a.startswith("task.heldout_size="):
            return int(a.split("=", 1)[1])
    return None


def history(result: dict) -> list[dict]:
    rows = []
    n_default = heldout_size(result)
    for it, m in sorted(result["metrics"].items(), key=lambda kv: int(kv[0][2:])):
        row = {"iteration": it, **m}
        n = m.get("heldout_n") or n_default
        if row.get("accuracy_se") is None and row.get("accuracy") is not None and n:
            row["accuracy_se"] = binomial_se(row["accuracy"], n)
        rows.append(row)
    return rows


def lost(rows: list[dict], z: float = 2.0) -> str | None:
    """The first iteration whose held-out accuracy is below it0's beyond z s.e. of the difference."""
    base = rows[0]
    for row in rows[1:]:
        if None in (row.get("accuracy"), row.get("accuracy_se"), base.get("accuracy_se")):
            continue
        if base["accuracy"] - row["accuracy"] > z * math.hypot(base["accuracy_se"], row["accuracy_se"]):
            return row["iteration"]
    return None


KEPT = ("research/results", "reports")  # where kept results live (reports/: the tiny seeds the pipeline's docs cite)


def runs(root: Path = ROOT) -> list[tuple[str, dict]]:
    """Every kept result under research/results/ and reports/: `<dir>/<variant>/s<seed>.json`
    (runners/experiments.py: seeds, bstar, scaling) and `<dir>/<name>-s<seed>.json` (research/real_loops.py:
    smollm2*, engine_loop); those without per-iteration metrics are left out."""
    found = []
    for top in KEPT:
        for d in sorted(p for p in (root / top).iterdir() if p.is_dir()):
            found += [(f"{d.name}/{p.parent.name}/{p.stem}", p) for p in sorted(d.glob("*/s*.json"))
                      if re.fullmatch(r"s\d+", p.stem)]
            found += [(f"{d.name}/{p.stem}", p) for p in sorted(d.glob("*-s*.json")) if re.search(r"-s\d+$", p.stem)]
    out = []
    for name, p in found:
        result = json.loads(p.read_text())
        if isinstance(result, dict) and isinstance(result.get("metrics"), dict):
            out.append((name, result))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="research/results/alarm_check.md")
    args = ap.parse_args(argv)
    lines = ["| run | held-out it0 -> last | lost beyond 2 s.e. at | alarm | first alarm |", "|---|---|---|---|---|"]
    missed, false_oracle, n_lost, n_oracle = [], [], 0, 0
    for name, result in runs():
        rows = history(result)
        if len(rows) < 2 or rows[0].get("iteration") != "it0":
            continue
        alarms = reward_hacking_alarm(rows)
        where = lost(rows)
        oracle = "verifier" in name
        n_lost += where is not None
        n_oracle += oracle
        if where and not alarms:
            missed.append(name)
        if oracle and alarms:
            false_oracle.append(name)
        acc = f"{rows[0].get('accuracy', float('nan')):.3f} -> {rows[-1].get('accuracy', float('nan')):.3f}"
        lines.append(f"| {name} | {acc} | {where or ''} | {'FIRED' if alarms else 'quiet'} | "
                     f"{alarms[0] if alarms else ''} |")
    head = [f"Kept runs that lost held-out accuracy beyond 2 s.e.: {n_lost}; the alarm missed {len(missed)}"
            f"{' (' + ', '.join(missed) + ')' if missed else ''}. Oracle (verifier) runs: {n_oracle}; the alarm "
            f"fired on {len(false_oracle)}{' (' + ', '.join(false_oracle) + ')' if false_oracle else ''}.", ""]
    text = "\n".join(head + lines) + "\n"
    out = ROOT / args.out
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
