"""The loop's report: the summary table, the label-free choice, the best and worst judged samples, figures, and the run's MLflow identity.

reports/summary.md (a table across iterations, the change from the base, the plots, and the best
and worst judged samples of each iteration), PNG plots, and a per-iteration CSV that
`dvc plots show` renders, from the evaluate stages' reports/iterations/<it>/ (it0 and every
iteration in params.yaml's `loop`). Then one MLflow parent run for the loop (named after the DVC
experiment or the Prefect flow run) with a child run per iteration: metrics at step = iteration,
its prompts and pairs as dataset inputs, example tables, and the reports as artifacts.
"""

from __future__ import annotations

import enum
import logging
from pathlib import Path

import pandas as pd

from self_improve import artifacts as art
from self_improve.choice import recommend
from self_improve.config import Params
from self_improve.iterations import history
from self_improve.quality import JUDGE_KEYS, POLICY_KEYS, reward_hacking_alarm

log = logging.getLogger(__name__)

COLUMNS = [
    ("accuracy", "held-out acc"),
    ("maj_accuracy", "held-out maj@k"),
    ("ttt_accuracy", "test-time acc"),
    ("win_rate", "win rate"),
    ("reward_mean", "self-reward"),
    ("judge_accuracy", "judge acc"),
    ("judge_auc", "judge AUC"),
    ("label_accuracy", "label acc"),
    ("sample_accuracy", "sample acc"),
    ("judged_share", "judged"),
    ("parse_failure_rate", "parse fail"),
    ("num_pairs", "pairs"),
    ("num_sft", "best samples"),
    ("response_length", "resp. length"),
    ("train_loss", "train loss"),
]
PLOTS = {
    "accuracy.png": ("Accuracy per iteration", ["accuracy", "maj_accuracy", "ttt_accuracy"]),
    "judge.png": ("Self-judge quality (vs verifier)",
                  ["judge_accuracy", "judge_auc", "label_accuracy", "sample_accuracy"]),
    "reward.png": ("Self-reward and win rate", ["reward_mean", "win_rate"]),
    "pairs.png": ("Training data per iteration", ["num_pairs", "num_sft"]),
    "length.png": ("Mean response length (characters)", ["response_length"]),
}


def alarms(df: pd.DataFrame) -> list[str]:
    """Reward-hacking alarms: self-reward up while the policy's true quality went down, or the
    judge's quality down two iterations running, each beyond its noise (quality.py)."""
    keys = ["iteration", "reward_mean"] + [k for pair in POLICY_KEYS + JUDGE_KEYS for k in pair]
    history = [{k: (None if pd.isna(r.get(k)) else r.get(k)) for k in keys if k in r}
               for r in df.to_dict("records")]
    return reward_hacking_alarm(history)


def _fmt(v) -> str:
    if v is None or (not isinstance(v, str) and pd.isna(v)):
        return "–"
    if isinstance(v, float) and not float(v).is_integer():
        return f"{v:.3f}"
    return str(int(v)) if isinstance(v, float) else str(v)


def _cell(v) -> str:
    text = _fmt(v) if not isinstance(v, str) else repr(v)[1:-1]
    return text.replace("|", "\\|")


def examples_markdown(per_iteration: dict[str, pd.DataFrame]) -> list[str]:
    lines = ["## Best and worst judged samples", "",
             "Per iteration, the samples its self-judge scored highest and lowest (`verifier`: the "
             "ground truth, never seen by the judge).", ""]
    for it, ex in per_iteration.items():
        lines += [f"### {it}", "", "| | prompt | response | reward | label | verifier |", "|---|---|---|---|---|---|"]
        for _, r in ex.iterrows():
            lines.append("| " + " | ".join(_cell(r[k]) for k in ("rank", "prompt", "response", "reward",
                                                                   "label", "correct")) + " |")
        lines.append("")
    return lines


def choice_markdown(df: pd.DataFrame) -> list[str]:
    """The iteration recommended without labels (choice.py), its signals per iteration, and held-out
    accuracy beside it (the truth the rule never reads)."""
    rows = history(df)
    rec = recommend(rows)

    def gain(r: dict, name: str) -> str:
        if r.get(f"{name}_gain") is None:
            return _fmt(r.get(name))
        return f"{_fmt(r.get(name))} ({r[f'{name}_gain']:+.3f} [{r[f'{name}_gain_lo']:+.3f}, {r[f'{name}_gain_hi']:+.3f}])"

    best = max((r for r in rows if r.get("accuracy") is not None), key=lambda r: r["accuracy"], default=None)
    lines = ["## Choosing the iteration without labels", "",
             f"**Recommended: {rec['iteration']}** ({rec['reason']}). `python -m self_improve.models.export --iteration "
             "recommended --out DIR` exports it. Signals on the test-time prompts, never their answers: "
             "cross-view agreement of the model's greedy answers (posed wording and a rewrite), and agreement on "
             "answers the base model also gives when sampled (supported: what the rule reads where recorded), the share "
             "the validity check rejects, the share that restate one of the question's numbers, distinct answers per problem, "
             "the share given the commonest answer, the share among the base model's own sampled answers (base support), "
             "the frozen judge's P(Yes); each with its paired gain from it0 [95%].", "",
             "| iteration | agreement | supported agreement | invalid share | restates the question | distinct | "
             "commonest answer | base support | frozen P(Yes) | candidate | vetoes | held-out acc |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        it = r["iteration"]
        row = rec["rows"].get(it, {})
        lines.append(f"| {it} | {gain(r, 'lf_agreement')} | {gain(r, 'lf_supported_agreement')} | "
                     f"{gain(r, 'lf_invalid_share')} | "
                     f"{gain(r, 'lf_restate_share')} | {_fmt(r.get('lf_distinct'))} | {gain(r, 'lf_mode_share')} | "
                     f"{gain(r, 'lf_base_support')} | {gain(r, 'lf_frozen_yes')} | {'yes' if row.get('candidate') else ''} | "
                     f"{'; '.join(row.get('vetoes', []))} | {_fmt(r.get('accuracy'))} |")
    if best is not None:
        lines += ["", f"Best held-out iteration (the truth, not read by the rule): {best['iteration']} "
                      f"({best['accuracy']:.3f})."]
    stopped = [r for r in rows if r.get("stopped")]
    if stopped:
        lines += ["", f"**The loop stopped after {stopped[0].get('stop_at')}** (`stop`): {stopped[0].get('stop_reason')}. "
                      f"{', '.join(r['iteration'] for r in stopped)} posed no prompts and trained nothing: "
                      "each passed its starting model on."]
    went_on = [r for r in rows if not r.get("stopped") and r.get("stop_reason")]
    if went_on:
        lines += ["", "**The loop went on where the stop was due** (`stop.while_rising`): " + "; ".join(
            f"before {r['iteration']}, {r['stop_reason']}" for r in went_on) + "."]
    return lines + [""]


def category_markdown(df: pd.DataFrame) -> list[str]:
    """Held-out accuracy per category at every iteration, the last one's gain over it0 with its paired
    95% interval, and the shortcut floor (the best policy that reads only the question) beside it:
    a shortcut shows as one category rising while the others fall."""
    cats = sorted({k.split("/", 1)[1] for k in df.columns if k.startswith("accuracy/")})
    if not cats:
        return []
    first, last = df.iloc[0], df.iloc[-1]
    floor = "floor" in df.columns and pd.notna(first.get("floor"))
    lines = ["## Per category (held-out)", ""]
    if floor:
        lines += [f"Shortcut floor (the best policy that reads only the question, `floor/<policy>`): "
                  f"{first['floor']:.3f}; {last['iteration']}'s paired gain over it: "
                  f"{_gain(last, 'floor_gain', '')}.", ""]
    its = list(df["iteration"])
    head = ["category", *its, f"gain {its[0]} -> {its[-1]} [95% CI]"] + (["floor", f"{its[-1]} - floor"] if floor else [])
    lines += ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for c in cats:
        cells = [c, *(_fmt(r.get(f"accuracy/{c}")) for _, r in df.iterrows()), _gain(last, "accuracy_gain", f"/{c}")]
        if floor:
            f = first.get(f"floor/{c}")
            cells += ["–" if f is None or pd.isna(f) else f"{f:.3f}", _gain(last, "floor_gain", f"/{c}")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def _gain(row, name: str, tail: str) -> str:
    g, lo, hi = (row.get(f"{name}{x}{tail}") for x in ("", "_lo", "_hi"))
    if g is None or pd.isna(g):
        return "–"
    return f"{g:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def judge_name(judge) -> str:
    """The judge as a rule name: its method and each judge key set away from its default, a bool by
    its name (``co_reward+validity+restates=any`` for configs/rules/co_reward+validity_any.yaml), so
    that two rules with one method read apart in the summary."""
    parts = [judge.method]
    for key, field in judge.__class__.model_fields.items():  # __class__: a stage's Declared view is its config's
        value = getattr(judge, key)
        if key == "method" or value == field.default:
            continue
        if isinstance(value, enum.Enum):
            value = value.value
        parts.append(key if value is True else f"{key}={value}")
    return "+".join(parts)


def summary_markdown(df: pd.DataFrame, params: Params, figures: list[str],
                     per_iteration: dict[str, pd.DataFrame] | None = None,
                     alarm: list[str] | None = None) -> str:
    cols = [(k, label) for k, label in COLUMNS if k in df.columns]
    lines = [
        "# Self-improvement loop: summary",
        "",
        f"Judge `{judge_name(params.judge)}`, training `{params.train.algorithm}`, "
        f"{params.sample.k} samples per prompt, seed {params.seed}.",
        "",
        "- **held-out acc / maj@k**: greedy and majority-of-k accuracy on problems disjoint from every "
        "training prompt (generalisation).",
        "- **test-time acc**: greedy accuracy on the test-time problems; the loop trains on their "
        "prompts, never their answers (TTRL's protocol).",
        "- **judge acc**: agreement of the self-judge's verdicts with the verifier on the iteration's "
        "samples; **label acc**: share of its pseudo-labels that are right; **sample acc**: share of "
        "the policy's own samples that are right (the gap the judge must beat); **judge AUC**: ROC AUC "
        "of the self-reward against correctness; **judged**: share of samples with a verdict; **parse "
        "fail**: share of llm_judge outputs without a well-formed score (those samples are dropped).",
        "",
        "**Reward-hacking alarm: " + ("FIRED**" if alarm else "quiet**") + " (tests: self-reward up while "
        "sample or held-out accuracy fell by more than 2 standard errors of the difference; judge AUC or "
        "accuracy down two iterations running, by more than 2 s.e. over the two, unless the policy "
        "improved meanwhile: sample accuracy up and held-out accuracy not down, each beyond its noise; "
        "a problem with its samples is the unit of the standard errors).",
        *[f"- {a}" for a in alarm or []],
        "",
        "| iteration | " + " | ".join(label for _, label in cols) + " |",
        "|---" * (len(cols) + 1) + "|",
    ]
    for _, row in df.iterrows():
        lines.append(f"| {row['iteration']} | " + " | ".join(_fmt(row.get(k)) for k, _ in cols) + " |")
    first, last = df.iloc[0], df.iloc[-1]
    lines += ["", f"From {first['iteration']} to {last['iteration']}:"]
    for key, label in COLUMNS[:3]:
        if key in df.columns and pd.notna(first.get(key)) and pd.notna(last.get(key)):
            lines.append(f"- {label}: {first[key]:.3f} -> {last[key]:.3f} "
                         f"({100 * (last[key] - first[key]):+.1f} points)")
    if "win_judged" in df.columns:
        wins = ", ".join(f"{r['iteration']} {_fmt(r.get('win_rate'))} ({_fmt(r.get('win_judged'))})"
                         for _, r in df.iloc[1:].iterrows())
        lines.append("- win rate against the previous model, judged by the new one (prompts with both "
                     f"answers scored): {wins}")
    lines += [""] + category_markdown(df) + choice_markdown(df) + [f"![{f}]({f})" for f in figures] + [""]
    if per_iteration:
        lines += examples_markdown(per_iteration)
    return "\n".join(lines)


def plot(df: pd.DataFrame, out_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names: list[str] = []
    mix = sorted(k for k in df.columns if k.startswith(art.MIX_PREFIX))
    if mix:
        fig, ax = plt.subplots(figsize=(6, 3.6), dpi=100)
        bottom = pd.Series(0.0, index=df.index)
        for k in mix:
            values = df[k].fillna(0.0)
            ax.bar(df["iteration"], values, bottom=bottom, label=k.removeprefix(art.MIX_PREFIX))
            bottom = bottom + values
        ax.set_title("Category mix of the prompts")
        ax.set_ylabel("share")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / "categories.png", metadata={"Software": None})
        plt.close(fig)
        names.append("categories.png")
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
