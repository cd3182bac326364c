"""How often a run's greedy answers are one of the question's own numbers, per iteration.

    python -m research.restated DIR          # DIR: a workspace after a loop (data/itN/eval.parquet)

For each iteration's evaluated answers (held-out and test-time, answered ones): the share that is
one of the question's numbers, the share that is its first number, and the share that is right and
one of its numbers; then, on the test-time problems, the paired gain of the share from it0
with its bootstrap 95% interval (what `lf_restate_share` records for runs made since it existed).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from self_improve.judges.validity import numbers
from self_improve.quality import paired_gain


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path)
    args = ap.parse_args(argv)
    task = pd.concat([pd.read_parquet(args.root / f"data/task/{s}.parquet") for s in ("heldout", "ttt")])
    question = dict(zip(task["prompt_id"], task["prompt"]))
    its = sorted((p.parent.name for p in args.root.glob("data/it*/eval.parquet")), key=lambda s: int(s[2:]))
    base = None
    for it in its:
        e = pd.read_parquet(args.root / f"data/{it}/eval.parquet")
        e = e[e["set"].isin(["heldout", "ttt"]) & e["pred"].notna()]
        nums = [numbers(question[p]) for p in e["prompt_id"]]
        restates = pd.Series([p in n for p, n in zip(e["pred"], nums)], index=e.index)
        first = [bool(n) and p == n[0] for p, n in zip(e["pred"], nums)]
        ttt = pd.Series(restates[e["set"] == "ttt"].astype(float).to_numpy(), index=e.loc[e["set"] == "ttt", "prompt_id"])
        line = (f"{it}: {len(e)} answers, a number of the question {restates.mean():.3f}, its first number "
                f"{sum(first) / len(e):.3f}, right and a number of the question "
                f"{(restates & (e['correct'] == 1)).mean():.3f}; test-time {ttt.mean():.3f}")
        if base is not None:
            both = base.index.intersection(ttt.index)
            g = paired_gain(base.loc[both], ttt.loc[both])
            line += f" ({g['gain']:+.2f} [{g['lo']:+.2f}, {g['hi']:+.2f}] from it0)"
        base = ttt if base is None else base
        print(line)


if __name__ == "__main__":
    main()
