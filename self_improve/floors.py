"""Shortcut floors: what a policy that reads only the question scores, so that a gain is counted over
the best trivial policy and not over the base model alone.

A policy answers every held-out problem without solving it: `sum`, `first` and `last` of the numbers
the question states, and `mode`, the most frequent gold answer of the test-time set (one constant
answer). Each ignores what tells the categories apart (the operation), so a loop that learns one of
them shows as one category rising while the others fall. The best policy over the whole held-out set
is the floor; its per-category accuracy is the floor of each category, and the model's gain over it
is paired problem by problem (`floor_gain`, with its bootstrap interval).

A task whose answer is one of these policies (the tiny default's addition: the sum is the task) has
no floor: `Task.floors` False, or a policy that is right on every held-out problem.
"""

from __future__ import annotations

import re
from collections import Counter
from fractions import Fraction

import pandas as pd

from self_improve.judges.validity import numbers
from self_improve.quality import paired_gain

POLICIES = ("sum", "first", "last", "mode")


def metric_name(category: str) -> str:
    """A category as a metric key's last part (MLflow's characters)."""
    return re.sub(r"[^A-Za-z0-9_. -]", "_", category)


def _number(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else str(float(x))


def _sum(values: list[str]) -> str | None:
    try:
        return _number(sum((Fraction(v) for v in values), Fraction(0))) if values else None
    except (ValueError, ZeroDivisionError):
        return None


def policy_answers(questions: list[str], ttt_answers: list[str]) -> dict[str, list[str | None]]:
    """Each policy's answer to each question (None: it has none, e.g. a question without numbers)."""
    found = [numbers(q) for q in questions]
    golds = Counter(a for a in ttt_answers if isinstance(a, str))
    mode = min(golds.items(), key=lambda kv: (-kv[1], kv[0]))[0] if golds else None  # ties: the first in order
    return {"sum": [_sum(ns) for ns in found],
            "first": [ns[0] if ns else None for ns in found],
            "last": [ns[-1] if ns else None for ns in found],
            "mode": [mode] * len(questions)}


def floor_table(task, heldout: pd.DataFrame, ttt: pd.DataFrame) -> pd.DataFrame:
    """One row per held-out problem with an answer: `prompt_id`, `category` and each policy's 1/0;
    empty for an open task or a task without floors."""
    heldout = heldout[heldout["answer"].notna()]
    if heldout.empty or task.open_ended or not getattr(task, "floors", True):
        return pd.DataFrame(columns=["prompt_id", "category", *POLICIES])
    question = getattr(task, "question", lambda prompt: prompt)
    cats = [c if isinstance(c, str) else None for c in heldout["category"]]
    answers = policy_answers([question(p) for p in heldout["prompt"]], list(ttt["answer"]) if len(ttt) else [])
    out = pd.DataFrame({"prompt_id": list(heldout["prompt_id"]), "category": [c or "(none)" for c in cats]})
    for name, given in answers.items():
        out[name] = [float(task.verify(a, g, c) or 0.0) for a, g, c in zip(given, heldout["answer"], cats)]
    return out


def floor_metrics(table: pd.DataFrame, answers: pd.DataFrame | None = None) -> dict[str, float]:
    """`floor/<policy>` and `floor/<policy>/<category>` for each policy, `floor` (the best policy's
    held-out accuracy) and `floor/<category>` (that policy's per category); with the model's held-out
    `answers` (EVAL rows), its paired gain over the floor policy, overall and per category:
    `floor_gain`, `floor_gain_lo`, `floor_gain_hi` (and `/<category>`). {} where there is no floor."""
    if table.empty:
        return {}
    acc = {p: float(table[p].mean()) for p in POLICIES}
    if max(acc.values()) >= 1.0:  # the task is one of the policies: nothing to floor
        return {}
    best = min(POLICIES, key=lambda p: (-acc[p], POLICIES.index(p)))
    cats = sorted(table["category"].unique())
    out: dict[str, float] = {"floor": acc[best]}
    for p in POLICIES:
        out[f"floor/{p}"] = acc[p]
        if len(cats) > 1:
            for c in cats:
                out[f"floor/{p}/{metric_name(c)}"] = float(table.loc[table["category"] == c, p].mean())
    if len(cats) > 1:
        for c in cats:
            out[f"floor/{metric_name(c)}"] = float(table.loc[table["category"] == c, best].mean())
    if answers is None:
        return out
    model = answers[answers["set"] == "heldout"].set_index("prompt_id")["correct"]
    rows = table[table["prompt_id"].isin(model.index)]
    for c in [None] + (cats if len(cats) > 1 else []):
        part = rows if c is None else rows[rows["category"] == c]
        g = paired_gain(list(part[best]), list(model.loc[part["prompt_id"]])) if len(part) else None
        if g is not None:
            tail = "" if c is None else f"/{metric_name(c)}"
            out |= {f"floor_gain{tail}": g["gain"], f"floor_gain_lo{tail}": g["lo"], f"floor_gain_hi{tail}": g["hi"]}
    return out
