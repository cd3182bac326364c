"""Stage `report`: the loop at a glance, and its record in MLflow.

reports/summary.md (a table across iterations, the change from the base, the plots),
PNG plots, and a per-iteration CSV that `dvc plots show` renders. Then one MLflow parent run
for the loop with a child run per iteration (metrics at step = iteration).
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path

import pandas as pd

from .lib import artifacts as art
from .lib.cli import note_timing, run_stage
from .lib.config import ConfigError, Params, flatten
from .lib.tracking import make_tracker

log = logging.getLogger(__name__)

COLUMNS = [
    ("accuracy", "held-out acc"),
    ("maj_accuracy", "held-out maj@k"),
    ("ttt_accuracy", "test-time acc"),
    ("reward_mean", "self-reward"),
    ("judge_accuracy", "judge acc"),
    ("label_accuracy", "label acc"),
    ("sample_accuracy", "sample acc"),
    ("num_pairs", "pairs"),
    ("num_sft", "best samples"),
    ("train_loss", "train loss"),
]
PLOTS = {
    "accuracy.png": ("Accuracy per iteration", ["accuracy", "maj_accuracy", "ttt_accuracy"]),
    "judge.png": ("Self-judge quality (vs verifier)", ["judge_accuracy", "label_accuracy", "sample_accuracy"]),
    "reward.png": ("Self-reward and training data", ["reward_mean"]),
}


def load_metrics(paths: list[str], params: Params) -> pd.DataFrame:
    rows = [art.read_json(p) for p in paths]
    have = [r.get("iteration") for r in rows]
    want = ["it0", *params.loop]
    missing = [it for it in want if it not in have]
    if missing:
        raise ConfigError(f"report: no metrics given for {missing}; add reports/<it>/metrics.json to "
                          "the report stage's deps and cmd in dvc.yaml")
    return pd.DataFrame(rows).sort_values("step").reset_index(drop=True)


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and pd.isna(v)):
        return "–"
    if isinstance(v, float) and not float(v).is_integer():
        return f"{v:.3f}"
    return str(int(v)) if isinstance(v, float) else str(v)


def summary_markdown(df: pd.DataFrame, params: Params, figures: list[str]) -> str:
    cols = [(k, label) for k, label in COLUMNS if k in df.columns]
    lines = [
        "# Self-improvement loop: summary",
        "",
        f"Judge `{params.judge.method.value}`, training `{params.train.algorithm.value}`, "
        f"{params.sample.k} samples per prompt, seed {params.seed}.",
        "",
        "- **held-out acc / maj@k**: greedy and majority-of-k accuracy on problems disjoint from every "
        "training prompt (generalisation).",
        "- **test-time acc**: greedy accuracy on the test-time problems; the loop trains on their "
        "prompts, never their answers (TTRL's protocol).",
        "- **judge acc**: agreement of the self-judge's verdicts with the verifier on the iteration's "
        "samples; **label acc**: share of its pseudo-labels that are right; **sample acc**: share of "
        "the policy's own samples that are right (the gap the judge must beat).",
        "",
        "| iteration | " + " | ".join(label for _, label in cols) + " |",
        "|---" * (len(cols) + 1) + "|",
    ]
    for _, row in df.iterrows():
        lines.append(f"| {row['iteration']} | " + " | ".join(_fmt(row.get(k)) for k, _ in cols) + " |")
    first, last = df.iloc[0], df.iloc[-1]
    lines += ["", f"From {first['iteration']} to {last['iteration']}:"]
    for key, label in COLUMNS[:3]:
        lines.append(f"- {label}: {first[key]:.3f} -> {last[key]:.3f} ({100 * (last[key] - first[key]):+.1f} points)")
    lines += [""] + [f"![{f}]({f})" for f in figures] + [""]
    return "\n".join(lines)


def plot(df: pd.DataFrame, out_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    for fname, (title, keys) in PLOTS.items():
        keys = [k for k in keys if k in df.columns and df[k].notna().any()]
        fig, ax = plt.subplots(figsize=(6, 3.6), dpi=100)
        for k in keys:
            ax.plot(df["step"], df[k], marker="o", label=k)
        ax.set_title(title)
        ax.set_xlabel("iteration")
        ax.set_xticks(df["step"], df["iteration"])
        ax.grid(alpha=0.3)
        if keys:
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / fname, metadata={"Software": None})
        plt.close(fig)
        names.append(fname)
    return names


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metrics", nargs="+", required=True, help="in: reports/<it>/metrics.json, it0 first")
    p.add_argument("--summary", required=True, help="out: markdown summary")
    p.add_argument("--figures", required=True, help="out: directory of PNG plots")
    p.add_argument("--table", required=True, help="out: per-iteration CSV for `dvc plots show`")


def main(argv: list[str] | None = None) -> None:
    def body(args: argparse.Namespace, params: Params) -> None:
        df = load_metrics(args.metrics, params)
        figures = Path(args.figures)
        with art.atomic_path(figures, is_dir=True) as tmp:
            tmp.mkdir(parents=True, exist_ok=True)
            names = plot(df, tmp)
        rel = [os.path.relpath(figures / n, Path(args.summary).parent) for n in names]
        with art.atomic_path(args.summary) as tmp:
            tmp.write_text(summary_markdown(df, params, rel), encoding="utf-8")
        keep = ["iteration", "step"] + [k for k, _ in COLUMNS if k in df.columns]
        with art.atomic_path(args.table) as tmp:
            df[keep].to_csv(tmp, index=False)
        started = time.perf_counter()
        tracker = make_tracker(params.tracking)
        name = os.environ.get("DVC_EXP_NAME") or "loop"
        tags = {"git_commit": art.git_sha() or "", "dvc_experiment": os.environ.get("DVC_EXP_NAME", "")}
        run_id = tracker.log_loop(name, flatten(params), df.to_dict("records"),
                                  [Path(args.summary), figures, Path(args.table)], tags)
        note_timing("tracking_seconds", time.perf_counter() - started)
        if run_id:
            log.info("MLflow parent run %s (%s)", run_id, name)
        print(Path(args.summary).read_text())

    run_stage("report", _args, body, argv)


if __name__ == "__main__":
    main()
