"""Two kept runs set against each other problem by problem: the accuracy of each at every
iteration both evaluated, and the difference with a paired bootstrap 95% interval.

    python -m research.paired_runs research/results/smollm2_v2/<run A> research/results/smollm2_v2/<run B>
    python -m research.paired_runs A B --set ttt --iteration it3 --out reports/some_comparison.md

A and B are report directories of kept runs (`runners.experiments.keep_report` writes answers.parquet
there; runs kept before it have none and are refused as not found). Runs of one seed answer the same held-out and test-time problems, so what the two share (a
problem's difficulty) cancels and the interval is far narrower than two runs' separate ones. Runs
whose problems differ (another seed, another recipe) are refused, naming the first problem that
differs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from runners.experiments import ANSWERS
from self_improve import artifacts as art
from self_improve.quality import paired_gain

SETS = ("heldout", "ttt", "ttt_view")  # the greedy answers; it0's sampled ones (ttt_sample) are not a model's answer


class RunsDiffer(ValueError):
    """The two runs did not answer the same problems."""


def load(run: Path) -> pd.DataFrame:
    path = run / ANSWERS if run.is_dir() else run
    return art.read_table(path, art.KEPT_EVAL_COMMON)


def compare(a: pd.DataFrame, b: pd.DataFrame, *, which: str = "heldout", iterations: list[str] | None = None,
            names: tuple[str, str] = ("A", "B")) -> pd.DataFrame:
    """Per iteration evaluated in both (or those of `iterations`): each run's accuracy on set `which`
    (`a`, `b`) and b - a (`difference`, `lo`, `hi`: paired bootstrap 95% over the problems, `n`).
    `names` only name the runs in errors."""
    rows = []
    a, b = a[a["set"] == which], b[b["set"] == which]
    its = iterations or [it for it in a["iteration"].drop_duplicates() if it in set(b["iteration"])]
    for it in its:
        x = a[a["iteration"] == it].drop_duplicates("prompt_id").set_index("prompt_id")
        y = b[b["iteration"] == it].drop_duplicates("prompt_id").set_index("prompt_id")
        if x.empty or y.empty:
            missing = names[0] if x.empty else names[1]
            raise RunsDiffer(f"{missing} has no {which} answers at {it}")
        if set(x.index) != set(y.index):
            pid = min(set(x.index) ^ set(y.index))
            raise RunsDiffer(f"{which} problems differ at {it}: {pid} is answered by "
                             f"{names[0] if pid in x.index else names[1]} only (another seed or recipe?)")
        y = y.loc[x.index]
        gold = x["answer"].fillna("") != y["answer"].fillna("")
        if gold.any():
            pid = x.index[gold.to_numpy()][0]
            raise RunsDiffer(f"{which} problem {pid} has gold {x.loc[pid, 'answer']!r} in {names[0]} and "
                             f"{y.loc[pid, 'answer']!r} in {names[1]}: not the same problems")
        g = paired_gain(x["correct"], y["correct"])
        rows.append({"iteration": it, "n": g["n"], "a": float(x["correct"].mean()), "b": float(y["correct"].mean()),
                     "difference": g["gain"], "lo": g["lo"], "hi": g["hi"]})
    return pd.DataFrame(rows)


def markdown(table: pd.DataFrame, names: tuple[str, str], which: str) -> str:
    lines = [(f"{which} accuracy, {names[1]} against {names[0]} on the same problems "
              "(paired bootstrap 95%, `python -m research.paired_runs`):"), "",
             f"| iteration | problems | {names[0]} | {names[1]} | difference [95%] |", "|---|---|---|---|---|"]
    for r in table.itertuples(index=False):
        lines.append(f"| {r.iteration} | {r.n} | {r.a:.3f} | {r.b:.3f} | "
                     f"{r.difference:+.3f} [{r.lo:+.3f}, {r.hi:+.3f}] |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", type=Path, help="a kept run's report directory (or its answers.parquet)")
    ap.add_argument("b", type=Path, help="the other; the difference is B - A")
    ap.add_argument("--set", dest="which", choices=SETS, default="heldout")
    ap.add_argument("--iteration", action="append", default=None, help="only these (repeatable; default: all in both)")
    ap.add_argument("--out", type=Path, default=None, help="also write the table there (markdown)")
    args = ap.parse_args(argv)
    names = (args.a.name if args.a.is_dir() else args.a.parent.name,
             args.b.name if args.b.is_dir() else args.b.parent.name)
    if names[0] == names[1]:
        names = (str(args.a), str(args.b))
    try:
        table = compare(load(args.a), load(args.b), which=args.which, iterations=args.iteration, names=names)
    except (art.ArtifactError, RunsDiffer) as err:
        sys.exit(f"paired_runs: {err}")
    text = markdown(table, names, args.which)
    if args.out:
        with art.atomic_path(args.out) as tmp:
            tmp.write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
