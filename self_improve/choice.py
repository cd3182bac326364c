"""Choosing an iteration without labels: what each model's own greedy answers to the unlabeled
test-time prompts say, and the rule that recommends an iteration from that alone.

The evaluate stage of every iteration, it0 included, answers the same test-time problems, each
in its posed wording and in one equivalent rewrite (the same rewrite every iteration), and records
per problem (EVAL rows, sets `ttt` and `ttt_view`):

- `lf_agreement`: the share of problems whose two wordings get one and the same answer, the
  cross-view consistency of Co-Reward and Self-Harmony read off the model itself. Right answers
  agree across wordings; wrong ones mostly scatter.
- `lf_invalid_share`: the share of problems whose answer the validity check rejects (it restates
  the question's first quantity, copies a sentence of it, or writes a false calculation) or that
  give no answer: a policy that learned to agree on restated numbers raises it.
- `lf_restate_share`: the share of answers that are one of the question's own numbers (over the
  answered problems): a policy that learns to restate an operand raises it, whichever operand it
  is (the validity check looks at the first quantity only). Right answers do so at a base rate
  (a - b = b), the same at every iteration, so only its rise from it0 counts.
- `lf_distinct`: distinct answers over problems; a policy collapsing onto a few answers halves it.
- `lf_mode_share`: the share of problems given the model's commonest answer. A constant answer is
  perfectly self-consistent (SRT, arXiv 2505.21444): a policy that collapses onto one answer for
  many problems raises cross-view agreement with it, while the distinct answers may fall by less
  than half.
- `lf_frozen_yes`: with judge.frozen, the frozen base model's mean P(Yes) for the answers.
- `lf_base_support`: the share of problems whose greedy answer is one the base model itself gives
  when sampled: it0's evaluate draws `evaluate.support_k` samples at `evaluate.temperature` for each problem
  in both wordings (EVAL rows of set `ttt_sample`), and every iteration's answers are looked up among
  them. The base's own votes anchor the answers without being trained along with the policy (a
  frozen judge, read off cached samples): a policy that learns answers the base never gives
  to a problem, right or wrong, lowers it. Right answers the base reached sometimes stay inside it,
  so an improving run keeps most of it; a run that drifted onto answers of its own, wrong the same
  way in both wordings (and so agreeing), loses most of it.
- `lf_supported_agreement`: the share of problems whose two wordings get one and the same answer
  and that answer is among the base model's sampled ones: cross-view agreement anchored on the
  frozen base. A policy that comes to agree with itself on answers the base never gives (wrong the
  same way in both wordings) raises `lf_agreement` but not this; one that comes to agree on answers
  the base gives too raises both.

- `lf_shortcut_share` and `lf_clean_agreement`, where the task names the answers a right response cannot
  give (judge.shortcut; on word problems the sum of the question's numbers where a step is not an
  addition): the share of answers so ruled out, and the supported agreement on answers that are not.
  A sum is the same in every wording, so a policy collapsing onto it raises the agreement; the clean
  agreement falls instead (six-iteration V3 loops: research/results/smollm2_v3_long/choice_shortcut.md).

Each has its paired gain from it0 (`<name>_gain`, `_lo`, `_hi`: bootstrap 95% over the same
problems). No gold answer is read by any of them.

The rule (`recommend`, its settings a `Rule`): itN is a candidate when no veto holds and its
agreement rose from it0's with the 95% interval's low end above `Rule.min_agreement_gain`. The
agreement read is the supported agreement where the base support was recorded (with `Rule.shortcut`,
the clean agreement where the task rules answers out), the plain one on results kept before it was. A task without rewrites has no agreement: there itN is a candidate when
its base support's gain has its low end above `Rule.min_support_gain` (None: no candidate, it0). The
vetoes: the invalid share rose beyond noise (`Rule.invalid_veto`), the answers restating the
question's numbers rose beyond noise (with `Rule.restate_veto` "over_signal", only by at least the
signal's own gain), the distinct answers fell under half of it0's, the commonest
answer's share more than doubled beyond noise, the base support fell under half of it0's beyond
noise, or the frozen judge's P(Yes) fell beyond noise. An iteration whose agreement fell cannot pass,
so neither can one whose self-reward rose while its scores fell. Of the candidates the rule takes the
latest whose signal is within one standard error of the highest candidate's (`Rule.pick` "near_best":
the one trained longest, unless its signal has fallen beyond noise since), the latest ("latest") or
the one with the highest signal ("highest"; ties: the earliest); with none, it0 (do no harm). The settings in `RULE`
were fitted over every kept run on the test-time problems' accuracy, never on held-out, and scored
on held-out with one recipe left out at a time (research/choice_check.py,
research/results/choice_check.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import pandas as pd

from self_improve.quality import binomial_se, paired_gain

VIEW_SET = "ttt_view"  # EVAL rows of the test-time problems' rewrites
SAMPLE_SET = "ttt_sample"  # EVAL rows of the base model's sampled answers to them (both wordings; it0 only)
SIGNALS = ("lf_agreement", "lf_supported_agreement", "lf_invalid_share", "lf_restate_share", "lf_mode_share",
           "lf_base_support", "lf_frozen_yes", "lf_clean_agreement", "lf_shortcut_share")  # per problem, paired gains
MODE_FACTOR = 2.0  # the commonest answer's share may not grow beyond this factor (and beyond noise)
SUPPORT_FACTOR = 2.0  # the base support may not fall under it0's divided by this (and beyond noise)
PICKS = ("near_best", "latest", "highest")  # the grid's order: a tie goes to the first
RESTATE_VETOES = ("rise", "over_signal")  # cautious first


@dataclass(frozen=True)
class Rule:
    """The settings of `recommend` (module doc)."""

    min_agreement_gain: float = 0.05  # a candidate's (supported) agreement gain has its 95% low end above this
    min_support_gain: Optional[float] = None  # without rewrites: the base support gain's 95% low end above this
    pick: str = "highest"  # of the candidates: the latest near the highest signal, the latest, or the highest
    invalid_veto: bool = True  # the invalid share's rise beyond noise vetoes
    shortcut: bool = False  # read the clean agreement (answers the task rules out left out) where recorded
    # when the restated share's rise beyond noise vetoes: always ("rise"), or only where it rose at least as
    # much as the signal read ("over_signal": the restatements could make up the whole agreement gain)
    restate_veto: str = "rise"

    def __post_init__(self):
        if self.pick not in PICKS:
            raise ValueError(f"choice.Rule.pick: one of {', '.join(PICKS)} (got {self.pick!r})")
        if self.restate_veto not in RESTATE_VETOES:
            raise ValueError(f"choice.Rule.restate_veto: one of {', '.join(RESTATE_VETOES)} "
                             f"(got {self.restate_veto!r})")


# fitted on the kept runs' test-time accuracy with no pick below it0 there (research/results/choice_check.md):
# any agreement rise of 2 points beyond noise; without rewrites, a base support that held (fell by at most
# 10 points at the low end); the latest such iteration; the invalid share's rise vetoes nothing (on the
# reasoning-gym recipe it rose with every gain, and the restatement veto covers what it guarded against)
RULE = Rule(min_agreement_gain=0.02, min_support_gain=-0.10, pick="latest", invalid_veto=False)


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA


def base_samples(answers: pd.DataFrame) -> dict[str, set]:
    """Each test-time problem's answers among the base model's samples (EVAL rows of `SAMPLE_SET`,
    both wordings pooled; a sample without an answer adds none): prompt_id -> set of answers."""
    rows = answers[answers["set"] == SAMPLE_SET]
    out: dict[str, set] = {pid: set() for pid in rows["prompt_id"]}
    for pid, pred in zip(rows["prompt_id"], rows["pred"]):
        if not _missing(pred):
            out[pid].add(pred)
    return out


def per_problem(answers: pd.DataFrame, support: dict[str, set] | None = None,
                ruled_out: dict[str, frozenset] | None = None) -> pd.DataFrame:
    """One row per test-time problem (index prompt_id): `lf_agreement` (1/0; NaN without a rewrite
    answered), `lf_invalid_share` (1: rejected by the validity check or no answer; NaN where the
    check was not run), `lf_restate_share` (1: the answer is one of the question's numbers; NaN
    without an answer), `lf_mode_share` (1: the answer is the commonest answer of this model over all
    the problems; 0 without an answer), `lf_base_support` (1: the answer is among `support`'s, the
    base model's sampled answers to the problem (`base_samples`); 0 without an answer; NaN where the
    base has no samples of it), `lf_supported_agreement` (1: the wordings agree on an answer among
    `support`'s; NaN where either is NaN), `lf_frozen_yes` (NaN where not judged) and `pred`. With
    `ruled_out` (prompt_id -> the answers the task rules out, judge.shortcut's), `lf_shortcut_share` (1: the
    answer is ruled out; NaN without an answer) and `lf_clean_agreement` (the supported agreement on an
    answer not ruled out); NaN columns without it."""
    ttt = answers[answers["set"] == "ttt"].drop_duplicates("prompt_id").set_index("prompt_id")
    preds = [None if _missing(p) else p for p in ttt["pred"]]
    view = answers[answers["set"] == VIEW_SET].drop_duplicates("prompt_id").set_index("prompt_id")["pred"]
    agree = [np.nan if pid not in view.index else float(p is not None and not _missing(view.loc[pid])
                                                         and p == view.loc[pid])
             for pid, p in zip(ttt.index, preds)]
    if "valid" in ttt and ttt["valid"].notna().any():
        invalid = [1.0 if p is None else np.nan if _missing(v) else float(not bool(v))
                   for p, v in zip(preds, ttt["valid"])]
    else:
        invalid = [np.nan] * len(ttt)
    frozen = ttt["frozen_yes"] if "frozen_yes" in ttt else [None] * len(ttt)
    restated = ttt["restates"] if "restates" in ttt else [None] * len(ttt)
    answered = pd.Series([p for p in preds if p is not None], dtype=object)
    mode = answered.value_counts().index[0] if len(answered) else None
    support = support or {}
    supported = [np.nan if pid not in support else float(p is not None and p in support[pid])
                 for pid, p in zip(ttt.index, preds)]
    return pd.DataFrame({"pred": pd.Series(preds, index=ttt.index, dtype=object), "lf_agreement": agree,
                         "lf_invalid_share": invalid,
                         "lf_restate_share": [np.nan if _missing(v) else float(bool(v)) for v in restated],
                         "lf_mode_share": [float(p is not None and p == mode) for p in preds],
                         "lf_supported_agreement": [a * b for a, b in zip(agree, supported)],
                         "lf_base_support": supported,
                         "lf_frozen_yes": [np.nan if _missing(v) else float(v) for v in frozen],
                         **_shortcut_columns(ttt.index, preds, supported, agree, ruled_out)}, index=ttt.index)


def _shortcut_columns(ids, preds: list, supported: list, agree: list,
                      ruled_out: dict[str, frozenset] | None) -> dict[str, list]:
    """`lf_shortcut_share` and `lf_clean_agreement` per problem (per_problem's doc); NaN without `ruled_out`."""
    if ruled_out is None:
        return {"lf_clean_agreement": [np.nan] * len(preds), "lf_shortcut_share": [np.nan] * len(preds)}
    short = [np.nan if p is None else float(p in ruled_out.get(pid, frozenset())) for pid, p in zip(ids, preds)]
    clean = [a * b * (1.0 if math.isnan(c) else 1.0 - c) for a, b, c in zip(agree, supported, short)]
    return {"lf_clean_agreement": clean, "lf_shortcut_share": short}


def signals(answers: pd.DataFrame, base: Optional[pd.DataFrame] = None,
            ruled_out: dict[str, frozenset] | None = None) -> dict[str, float]:
    """The label-free metrics of one model's EVAL rows (see the module doc), and with `base` (it0's
    EVAL rows) each one's paired gain from it0 with its 95% interval. The base support looks the
    answers up among `base`'s sampled answers, or without `base` (it0 itself) among `answers`' own.
    `ruled_out`: each test-time problem's answers the task rules out (the shortcut signals)."""
    support = base_samples(base if base is not None else answers)
    now = per_problem(answers, support, ruled_out)
    if now.empty:
        return {}
    out: dict[str, float] = {}
    for name in SIGNALS:
        v = now[name].dropna()
        if len(v):
            out[name] = float(v.mean())
            out[f"{name}_se"] = (binomial_se(out[name], len(v)) if name != "lf_frozen_yes"
                                 else float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else 0.0)
    preds = [p for p in now["pred"] if not _missing(p)]
    out["lf_distinct"] = len(set(preds)) / len(now)
    out["lf_n"] = len(now)
    if base is not None:
        before = per_problem(base, support, ruled_out)
        for name in SIGNALS:
            b, a = before[name].dropna(), now[name].dropna()
            both = b.index.intersection(a.index)
            g = paired_gain(b.loc[both], a.loc[both]) if len(both) else None
            if g is not None:
                out.update({f"{name}_gain": g["gain"], f"{name}_gain_lo": g["lo"], f"{name}_gain_hi": g["hi"]})
    return out


def unsupported_agreement(metrics: dict) -> float | None:
    """A model's cross-view agreement on answers the base's samples never give: plain minus supported
    agreement (None where either was not recorded). Not read by the rule: on it0 it says how far the
    base's own agreement escapes its anchor (research/choice_check.py, research/base_screen.py)."""
    if metrics.get("lf_agreement") is None or metrics.get("lf_supported_agreement") is None:
        return None
    return metrics["lf_agreement"] - metrics["lf_supported_agreement"]


def vetoes(row: dict, base: dict, invalid: bool = True, restate: str = "rise", key: str | None = None) -> list[str]:
    """Why an iteration may not be recommended whatever its agreement (empty: none); `invalid`: the
    invalid share's rise is one of them; `restate` (`Rule.restate_veto`): "over_signal" lets the restated
    share's rise pass where the signal `key` rose by more (right answers that restate an operand, 8 - 4 = 4,
    rise with the skill; a policy drifting onto restatements raises them faster than its agreement)."""
    out = []
    if invalid and (row.get("lf_invalid_share_gain_lo") or 0) > 0:
        out.append(f"invalid share up {base.get('lf_invalid_share', float('nan')):.3f} -> "
                   f"{row.get('lf_invalid_share', float('nan')):.3f} (95% low end "
                   f"{row['lf_invalid_share_gain_lo']:+.3f})")
    restated = row.get("lf_restate_share_gain")
    outpaced = (restate == "over_signal" and key is not None and restated is not None
                and row.get(f"{key}_gain") is not None and restated < row[f"{key}_gain"])
    if (row.get("lf_restate_share_gain_lo") or 0) > 0 and not outpaced:
        out.append(f"answers restating the question's numbers up {base.get('lf_restate_share', float('nan')):.3f} -> "
                   f"{row.get('lf_restate_share', float('nan')):.3f} (95% low end {row['lf_restate_share_gain_lo']:+.3f})")
    if base.get("lf_distinct") and row.get("lf_distinct") is not None and row["lf_distinct"] < base["lf_distinct"] / 2:
        out.append(f"distinct answers halved {base['lf_distinct']:.3f} -> {row['lf_distinct']:.3f}")
    mode, mode0 = row.get("lf_mode_share"), base.get("lf_mode_share")
    if mode is not None and mode0 is not None and mode > MODE_FACTOR * mode0 and (row.get("lf_mode_share_gain_lo") or 0) > 0:
        out.append(f"commonest answer's share up {mode0:.3f} -> {mode:.3f} (over {MODE_FACTOR:g}x, 95% low end "
                   f"{row['lf_mode_share_gain_lo']:+.3f})")
    sup, sup0, sup_hi = row.get("lf_base_support"), base.get("lf_base_support"), row.get("lf_base_support_gain_hi")
    if sup is not None and sup0 is not None and sup < sup0 / SUPPORT_FACTOR and sup_hi is not None and sup_hi < 0:
        out.append(f"base support down {sup0:.3f} -> {sup:.3f} (under 1/{SUPPORT_FACTOR:g}, 95% high end {sup_hi:+.3f})")
    hi = row.get("lf_frozen_yes_gain_hi")
    if hi is not None and hi < 0:
        out.append(f"frozen judge's P(Yes) down {base.get('lf_frozen_yes', float('nan')):.3f} -> "
                   f"{row.get('lf_frozen_yes', float('nan')):.3f} (95% high end {hi:+.3f})")
    return out


def signal_of(base: dict, shortcut: bool = False) -> tuple[str | None, str]:
    """The signal a candidate must raise, read off it0's metrics, and its words; `shortcut`: the clean
    agreement where it was recorded."""
    if shortcut and base.get("lf_clean_agreement") is not None:
        return "lf_clean_agreement", "supported agreement on answers the task does not rule out"
    if base.get("lf_supported_agreement") is not None:
        return "lf_supported_agreement", "supported agreement"
    if base.get("lf_agreement") is not None:
        return "lf_agreement", "cross-view agreement"
    if base.get("lf_base_support") is not None:
        return "lf_base_support", "base support (no rewrites, so no agreement)"
    return None, ""


def _pick(picked: list[dict], key: str, what: str, pick: str) -> tuple[dict, str]:
    """The candidate `Rule.pick` takes, and its words: `near_best` the latest whose agreement is within one
    standard error of the highest candidate's (the latest where it never fell beyond noise; on the base
    support, a guard that held rather than a gain, the latest), `latest` the latest, `highest` the
    highest (ties: the earliest)."""
    name = what.split(" (")[0]
    if pick == "latest" or (pick == "near_best" and key == "lf_base_support"):  # a guard that held, not a gain
        return picked[-1], f"the latest of {len(picked)} candidate(s)"
    if pick == "latest":
        return picked[-1], f"the latest of {len(picked)} candidate(s)"
    top = max(picked, key=lambda r: r[key])
    if pick == "highest":
        return top, f"the highest {name} of {len(picked)} candidate(s)"
    se = top.get(f"{key}_se") or 0.0
    near = [r for r in picked if r[key] >= top[key] - se]
    return near[-1], (f"the latest of {len(picked)} candidate(s) within one s.e. of the highest {name} "
                      f"({top[key]:.3f} at {top['iteration']}, s.e. {se:.3f})")


def recommend(history: list[dict], rule: Rule = RULE) -> dict:
    """The iteration to keep, chosen from label-free signals only (module doc), from the metrics of
    it0 and each iteration in order. Returns `iteration`, `reason` and per iteration `rows`:
    `candidate`, `vetoes`, `agreement` (the signal read) and `agreement_gain_lo`. Without the signals
    (results from before they were recorded): it0."""
    if not history:
        raise ValueError("recommend: no iterations")
    base = history[0]
    key, what = signal_of(base, rule.shortcut)
    floor = rule.min_support_gain if key == "lf_base_support" else rule.min_agreement_gain
    rows, picked = {}, []
    for row in history[1:]:
        it = row.get("iteration")
        lo = row.get(f"{key}_gain_lo") if key else None
        v = vetoes(row, base, rule.invalid_veto, rule.restate_veto, key)
        candidate = lo is not None and floor is not None and lo > floor and not v
        rows[it] = {"candidate": candidate, "vetoes": v, "agreement": row.get(key) if key else None,
                    "agreement_gain_lo": lo}
        if candidate:
            picked.append(row)
    it0 = base.get("iteration", "it0")
    if key is None:
        return {"iteration": it0, "rows": rows,
                "reason": "no label-free signals recorded (lf_agreement, lf_base_support): the base model, do no harm"}
    if floor is None:
        return {"iteration": it0, "rows": rows,
                "reason": f"the rule reads no {what.split(' (')[0]} (choice.Rule.min_support_gain None): the base model"}
    if not picked:
        return {"iteration": it0, "rows": rows,
                "reason": f"no iteration's {what} gain had its 95% low end above {floor:+.2f} without a veto: "
                          "the base model"}
    best, which = _pick(picked, key, what, rule.pick)
    return {"iteration": best["iteration"], "rows": rows,
            "reason": f"{which}: {what} {best[key]:.3f} (it0 {base[key]:.3f}, gain 95% low end "
                      f"{best[f'{key}_gain_lo']:+.3f} over {floor:+.2f}), no veto"}
