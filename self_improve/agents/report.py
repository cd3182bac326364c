"""The CoMAS report: one row per agent and iteration, as a table and as markdown."""

from __future__ import annotations

import pandas as pd

COLUMNS = (  # (metric, heading) of the summary table
    ("accuracy", "held-out acc"), ("accuracy_gain", "gain vs it0 [95% CI]"), ("ttt_accuracy", "test-time acc"),
    ("solution_accuracy", "its solutions right (verifier)"), ("reward_solution", "solution reward"),
    ("reward_evaluation", "evaluation reward"), ("score_parse_rate", "scores parsed"),
    ("score_agreement", "scores agree with verifier"), ("mean_score", "mean score"),
    ("truncated_share", "outputs cut"), ("train_loss", "train loss"),
)


def summary_frame(base: dict, iterations: list[dict], n: int) -> pd.DataFrame:
    """One row per agent and iteration: it0 (every agent is the base model: its metrics) and each
    iteration's metrics.json."""
    rows = [{"agent": f"agent{k}", "iteration": "it0", "step": 0,
             **{c: base.get(c) for c in ("accuracy", "ttt_accuracy")}} for k in range(n)]
    for it in iterations:
        for agent, m in it["agents"].items():
            rows.append({"agent": agent, "iteration": it["iteration"], "step": it["step"], **m})
    return pd.DataFrame(rows)


def _f(v) -> str:
    return "–" if v is None or (isinstance(v, float) and v != v) else f"{v:.3f}" if isinstance(v, float) else str(v)


def summary_markdown(df: pd.DataFrame, params_note: str) -> str:
    lines = ["# CoMAS: agents that solve, evaluate and score each other", "", params_note, "",
             "| agent | iteration | " + " | ".join(h for _, h in COLUMNS) + " |",
             "|---|---|" + "---|" * len(COLUMNS)]
    for row in df.sort_values(["agent", "step"]).to_dict("records"):
        cells = []
        for c, _ in COLUMNS:
            v = row.get(c)
            if c == "accuracy_gain" and v is not None and v == v:
                cells.append(f"{v:+.3f} [{row['accuracy_gain_lo']:+.3f}, {row['accuracy_gain_hi']:+.3f}]")
            else:
                cells.append(_f(v))
        lines.append(f"| {row['agent']} | {row['iteration']} | " + " | ".join(cells) + " |")
    lines += ["", ("Solutions are checked by the verifier only to measure them: no reward reads a gold answer. "
                   "A score of 2 or 3 says the answer stands; agreement compares that with the verifier.")]
    return "\n".join(lines) + "\n"
