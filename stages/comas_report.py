"""Stage `comas_report` (comas/dvc.yaml): every agent's iterations at a glance (reports/comas/) and
in MLflow, one parent run per agent with its iterations as child runs.

The logic: self_improve/agents/."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from self_improve import artifacts as art
from self_improve.agents.report import summary_frame, summary_markdown
from self_improve.config import Params, flatten
from self_improve.stage import Arg, Declaration, Run, run_stage
from self_improve.tracking import IterationRecord, LoopRecord, make_tracker, run_identity

log = logging.getLogger(__name__)

# the params keys this stage reads: comas/dvc.yaml's params for it, and its provenance
PARAMS = ("seed", "model.base", "task.name", "agents", "train.algorithm", "tracking")


DECLARATION = Declaration(
    args=(
        Arg("--base-metrics", "in", "it0's metrics (evaluate_base)", required=True),
        Arg("--iterations", "in", "the directory of <it>/metrics.json", required=True),
        Arg("--summary", "out", "markdown summary", required=True, cache=False),
        Arg("--table", "out", "per agent and iteration CSV", required=True, cache=False),
    ),
    params=PARAMS,
    runs=(Run("comas_report", {
        "--base-metrics": "reports/iterations/it0/metrics.json", "--iterations": "reports/comas/iterations",
        "--summary": "reports/comas/summary.md", "--table": "reports/comas/agents.csv"}, wdir=".."),),
)


def main(argv: list[str] | None = None) -> None:
    def body(args: argparse.Namespace, params: Params) -> None:
        cfg = params.agents
        iterations = [art.read_json(Path(args.iterations) / it / "metrics.json") for it in cfg.loop]
        df = summary_frame(art.read_json(args.base_metrics), iterations, cfg.n)
        note = (f"{cfg.n} agents on {params.model.base}, task {params.task.name}, seed {params.seed}: "
                f"{cfg.rounds} rounds of discussion per problem, kappa {cfg.references}, {cfg.problems} problems "
                f"per iteration; each agent trained with REINFORCE++ advantages through the GRPO trainer.")
        with art.atomic_path(args.summary) as tmp:
            tmp.write_text(summary_markdown(df, note), encoding="utf-8")
        keep = ["agent", "iteration", "step"] + [c for c in df.columns if c not in ("agent", "iteration", "step")]
        with art.atomic_path(args.table) as tmp:
            df[keep].to_csv(tmp, index=False)
        name, tags = run_identity()
        tracker = make_tracker(params.tracking)
        for agent, rows in df.groupby("agent", sort=True):
            records = [IterationRecord(iteration=r["iteration"], step=int(r["step"]),
                                       metrics={k: float(v) for k, v in r.items()
                                                if isinstance(v, (int, float)) and v == v and k != "step"})
                       for r in rows.sort_values("step").to_dict("records")]
            run_id = tracker.log_loop(LoopRecord(f"{name}-comas-{agent}", flatten(params),
                                                 {**tags, "comas_agent": agent}, records,
                                                 [Path(args.summary), Path(args.table)]))
            if run_id:
                log.info("MLflow run %s (%s)", run_id, agent)
        print(Path(args.summary).read_text())

    run_stage("comas_report", DECLARATION.add_args, body, argv, reads=PARAMS)


if __name__ == "__main__":
    main()
