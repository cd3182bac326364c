"""Stage `report`: the loop at a glance, and its record in MLflow.

The logic: self_improve/reporting.py."""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path

import pandas as pd

from self_improve import artifacts as art
from self_improve.choice import recommend
from self_improve.config import ConfigError, Params, flatten
from self_improve.errors import PipelineError
from self_improve.iterations import history, load_iterations
from self_improve.reporting import COLUMNS, alarms, plot, summary_markdown
from self_improve.stage import Arg, Declaration, Run, note_timing, run_stage
from self_improve.tracking import IterationRecord, LoopRecord, NoOpTracker, loop_key, make_tracker, numeric, run_identity

log = logging.getLogger(__name__)

# the params keys this stage reads: dvc.yaml's params for it, and its provenance
PARAMS = ("seed", "loop", "tracking", "judge", "train.algorithm", "sample.k", "stop")  # judge: the summary names the rule


DECLARATION = Declaration(
    args=(
        Arg("--iterations", "in", "the directory of <it>/metrics.json (it0 and each loop iteration) and "
            "<it>/examples.json", required=True),
        Arg("--summary", "out", "markdown summary", required=True, cache=False),
        Arg("--figures", "out", "directory of PNG plots", required=True, cache=False),
        Arg("--table", "plot", "per-iteration CSV for `dvc plots show`", required=True, cache=False),
        Arg("--resend", "switch", "only log the loop to MLflow again, from the outputs already written (after a "
            "tracking failure); nothing is rewritten"),
    ),
    params=PARAMS,
    param_notes={"judge": "the summary names the rule: every judge key", "stop": "the summary says where the loop stopped"},
    runs=(Run("report", {
        "--iterations": "reports/iterations", "--summary": "reports/summary.md", "--figures": "reports/figures",
        "--table": "reports/iterations.csv"},
        note="every iteration's metrics and examples sit in reports/iterations/<it>/ (the evaluate stages' "
             "outputs): one dependency, and the report reads it0 and the iterations params.yaml's loop names"),),
)


def _write(args: argparse.Namespace, params: Params, df: pd.DataFrame, shown: dict, alarm: list[str]) -> None:
    """The figures, the summary and the per-iteration table, each whole or not at all."""
    figures = Path(args.figures)
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


def _tags(df: pd.DataFrame, alarm: list[str]) -> dict[str, str]:
    """The loop's MLflow tags from its results: the alarm, the recommended iteration, where it stopped."""
    tags = {"reward_hacking_alarm": "; ".join(alarm) if alarm else "quiet",
            "recommended_iteration": recommend(history(df))["iteration"]}
    stopped = [r for r in history(df) if r.get("stopped")]
    if stopped:
        tags["stopped_after"] = str(stopped[0].get("stop_at"))
    return tags


def _records(df: pd.DataFrame, examples: dict, shown: dict, alarm: list[str]) -> list[IterationRecord]:
    """One MLflow child run per iteration: its metrics, whether the alarm names it, its datasets and examples."""
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
            metrics={**numeric(row), "reward_hacking_alarm": float(it in fired)},
            datasets=[(kind, ex["datasets"][kind]) for kind in ("prompts", "pairs") if kind in ex.get("datasets", {})],
            tables=tables,
        ))
    return records


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
            _write(args, params, df, shown, alarm)
        started = time.perf_counter()
        name, tags = run_identity()
        record = LoopRecord(name, flatten(params), tags | _tags(df, alarm), _records(df, examples, shown, alarm),
                            [Path(args.summary), figures, Path(args.table)])
        tracker = make_tracker(params.tracking)
        if args.resend and isinstance(tracker, NoOpTracker):
            raise ConfigError("report --resend: tracking is off (params tracking.enabled, or SELF_IMPROVE_TRACKING=0)")
        run_id = tracker.log_loop(record, "" if args.resend else loop_key(args.params))
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

    run_stage("report", DECLARATION.add_args, body, argv, reads=PARAMS)


if __name__ == "__main__":
    main()
