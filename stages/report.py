"""Stage `report`: the loop at a glance, and its record in MLflow.

reports/summary.md (a table across iterations, the change from the base, the plots, and the best
and worst judged samples of each iteration), PNG plots, and a per-iteration CSV that
`dvc plots show` renders, from the evaluate stages' reports/iterations/<it>/ (it0 and every
iteration in params.yaml's `loop`). Then one MLflow parent run for the loop (named after the DVC
experiment or the Prefect flow run) with a child run per iteration: metrics at step = iteration,
its prompts and pairs as dataset inputs, example tables, and the reports as artifacts.
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
from .lib.errors import PipelineError
from .lib.choice import recommend
from .lib.quality import JUDGE_KEYS, POLICY_KEYS, reward_hacking_alarm
from .lib.tracking import IterationRecord, LoopRecord, NoOpTracker, make_tracker

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


def load_iterations(directory: str | Path, params: Params) -> tuple[pd.DataFrame, dict[str, dict]]:
    """Metrics of it0 and of every iteration in `loop`, and the loop iterations' examples, from
    <directory>/<it>/metrics.json and examples.json (the evaluate stages' outputs)."""
    directory = Path(directory)
    rows, examples = [], {}
    for it in ["it0", *params.loop]:
        path = directory / it / "metrics.json"
        if not path.is_file():
            raise ConfigError(f"report: {path} is missing; the evaluate stage of {it} writes it "
                              f"(params.yaml loop has {list(params.loop)})")
        row = art.read_json(path)
        if row.get("iteration") != it:
            raise ConfigError(f"report: {path} holds iteration {row.get('iteration')!r}, not {it!r}")
        rows.append(row)
        if it != "it0":
            examples[it] = art.read_json(directory / it / "examples.json")
    return pd.DataFrame(rows).sort_values("step").reset_index(drop=True), examples


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


def history(df: pd.DataFrame) -> list[dict]:
    """The per-iteration metrics as dicts, missing values as None."""
    return [{k: (None if pd.isna(v) else v) for k, v in r.items()} for r in df.to_dict("records")]


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
             f"**Recommended: {rec['iteration']}** ({rec['reason']}). `python -m stages.export --iteration "
             "recommended --out DIR` exports it. Signals on the test-time prompts, never their answers: "
             "cross-view agreement of the model's greedy answers (posed wording and a rewrite), the share "
             "the validity check rejects, the share that restate one of the question's numbers, distinct answers per problem, the frozen judge's P(Yes); each "
             "with its paired gain from it0 [95%].", "",
             "| iteration | agreement | invalid share | restates the question | distinct | frozen P(Yes) | candidate | "
             "vetoes | held-out acc |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        it = r["iteration"]
        row = rec["rows"].get(it, {})
        lines.append(f"| {it} | {gain(r, 'lf_agreement')} | {gain(r, 'lf_invalid_share')} | "
                     f"{gain(r, 'lf_restate_share')} | {_fmt(r.get('lf_distinct'))} | "
                     f"{gain(r, 'lf_frozen_yes')} | {'yes' if row.get('candidate') else ''} | "
                     f"{'; '.join(row.get('vetoes', []))} | {_fmt(r.get('accuracy'))} |")
    if best is not None:
        lines += ["", f"Best held-out iteration (the truth, not read by the rule): {best['iteration']} "
                      f"({best['accuracy']:.3f})."]
    return lines + [""]


def summary_markdown(df: pd.DataFrame, params: Params, figures: list[str],
                     per_iteration: dict[str, pd.DataFrame] | None = None,
                     alarm: list[str] | None = None) -> str:
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
    lines += [""] + choice_markdown(df) + [f"![{f}]({f})" for f in figures] + [""]
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


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--iterations", required=True,
                   help="in: the directory of <it>/metrics.json (it0 and each loop iteration) and <it>/examples.json")
    p.add_argument("--summary", required=True, help="out: markdown summary")
    p.add_argument("--figures", required=True, help="out: directory of PNG plots")
    p.add_argument("--table", required=True, help="out: per-iteration CSV for `dvc plots show`")
    p.add_argument("--resend", action="store_true",
                   help="only log the loop to MLflow again, from the outputs already written (after a "
                        "tracking failure); nothing is rewritten")


def run_identity() -> tuple[str, dict[str, str]]:
    """The parent run's name and tags: the DVC experiment, else the Prefect flow run, else `loop`."""
    # DVC names `dvc exp run` experiments; a Prefect flow run in its own worktree names its own
    exp = os.environ.get("DVC_EXP_NAME") or os.environ.get("SELF_IMPROVE_EXPERIMENT", "")
    flow_run = os.environ.get("SELF_IMPROVE_FLOW_RUN_ID", "")
    flow_name = os.environ.get("SELF_IMPROVE_FLOW_RUN_NAME", "")
    name = exp or (f"prefect-{flow_name}" if flow_name else "") or "loop"
    tags = {"git_commit": art.git_sha() or "", "dvc_experiment": exp}
    if flow_run:
        tags.update(prefect_flow_run_id=flow_run, prefect_flow_run_name=flow_name)
    return name, tags


def main(argv: list[str] | None = None) -> None:
    def body(args: argparse.Namespace, params: Params) -> None:
        df, examples = load_iterations(args.iterations, params)
        alarm = alarms(df)
        for a in alarm:
            log.warning("REWARD-HACKING ALARM %s", a)
        shown = {it: pd.DataFrame(ex["judged"], columns=art.JUDGED_EXAMPLE_COLUMNS) for it, ex in examples.items()}
        figures = Path(args.figures)
        if args.resend:
            missing = [str(p) for p in (Path(args.summary), figures, Path(args.table)) if not p.exists()]
            if missing:
                raise ConfigError(f"report --resend: {missing} missing; run the report first (dvc repro)")
        else:
            with art.atomic_path(figures, is_dir=True) as tmp:
                tmp.mkdir(parents=True, exist_ok=True)
                names = plot(df, tmp)
            rel = [os.path.relpath(figures / n, Path(args.summary).parent) for n in names]
            with art.atomic_path(args.summary) as tmp:
                tmp.write_text(summary_markdown(df, params, rel, shown, alarm), encoding="utf-8")
            keep = ["iteration", "step"] + [k for k, _ in COLUMNS if k in df.columns]
            keep += sorted(k for k in df.columns if k.startswith(art.MIX_PREFIX))
            with art.atomic_path(args.table) as tmp:
                df[keep].to_csv(tmp, index=False)

        started = time.perf_counter()
        name, tags = run_identity()
        tags["reward_hacking_alarm"] = "; ".join(alarm) if alarm else "quiet"
        tags["recommended_iteration"] = recommend(history(df))["iteration"]
        fired = {a.split(":", 1)[0] for a in alarm}
        records = []
        for row in df.to_dict("records"):
            it = row["iteration"]
            ex = examples.get(it, {})
            tables = {f"examples/{it}_judged.json": shown[it]} if it in shown else {}
            if "pairs" in ex:
                tables[f"examples/{it}_pairs.json"] = pd.DataFrame(ex["pairs"], columns=art.PAIR_EXAMPLE_COLUMNS)
            records.append(IterationRecord(
                iteration=it, step=int(row["step"]),
                metrics={**{k: float(v) for k, v in row.items()
                            if isinstance(v, (int, float)) and v == v and k != "step"},
                         "reward_hacking_alarm": float(it in fired)},
                datasets=[(kind, ex["datasets"][kind]) for kind in ("prompts", "pairs")
                          if kind in ex.get("datasets", {})],
                tables=tables,
            ))
        record = LoopRecord(name, flatten(params), tags, records,
                            [Path(args.summary), figures, Path(args.table)])
        tracker = make_tracker(params.tracking)
        if args.resend and isinstance(tracker, NoOpTracker):
            raise ConfigError("report --resend: tracking is off (params tracking.enabled, or SELF_IMPROVE_TRACKING=0)")
        run_id = tracker.log_loop(record)
        note_timing("tracking_seconds", time.perf_counter() - started)
        if run_id:
            log.info("MLflow parent run %s (%s)", run_id, name)
        if args.resend:
            if not run_id:
                raise PipelineError("report --resend: MLflow tracking failed again (see above)")
            return
        print(Path(args.summary).read_text())
        if alarm:  # last, so it is what `dvc repro` ends on
            print("REWARD-HACKING ALARM:\n" + "\n".join(f"  {a}" for a in alarm))

    run_stage("report", _args, body, argv)


if __name__ == "__main__":
    main()
