"""Stage `comas_evaluate@itN` (comas/dvc.yaml): every agent's greedy accuracy on the held-out and
test-time problems, its gain over it0 on the same problems with a paired bootstrap 95% interval,
beside the iteration's discussion and training metrics (one metrics.json per iteration).

The logic: self_improve/evaluation.py."""

from __future__ import annotations

import argparse

import pandas as pd
import pyarrow as pa

from self_improve import artifacts as art
from self_improve.agents.roster import agent_model
from self_improve.config import Params
from self_improve.engines.sampler import open_sampler
from self_improve.evaluation import gains, model_metrics
from self_improve.models.loading import set_threads
from self_improve.stage import ITERATION, Arg, Declaration, Run, derive_seed, run_stage, stage_provenance
from self_improve.tasks import task_for

# the params keys this stage reads: comas/dvc.yaml's params for it, and its provenance
PARAMS = ("seed", "model", "task", "evaluate", "agents.n", "agents.loop", "sample.batch_size", "sample.backend",
          "sample.gpu_memory_utilization", "sample.vllm", "sample.ct2", "security")

# each agent's greedy answers: the loop's EVAL rows with the agent's number
EVAL = pa.schema([*art.EVAL, ("agent", pa.int64())])


DECLARATION = Declaration(
    args=(
        ITERATION,
        Arg("--agents", "in", "this iteration's agents", required=True),
        Arg("--base", "in", "the base model (it0) that adapter chains apply to", required=True),
        Arg("--heldout", "in", "held-out problems", required=True),
        Arg("--ttt", "in", "test-time problems", required=True),
        Arg("--base-eval", "in", "it0's answers to the same problems (evaluate_base)", required=True),
        Arg("--discussion", "in", "the discussion's metrics (json)", required=True),
        Arg("--train-metrics", "in", "the training metrics (json)", required=True),
        Arg("--eval-out", "out", "each agent's greedy answers (parquet)", required=True),
        Arg("--out", "out", "the iteration's metrics per agent (json)", required=True, cache=False),
    ),
    params=PARAMS,
    runs=(Run("comas_evaluate", {
        "--iteration": "${key}", "--agents": "data/comas/${key}/agents", "--base": "data/it0/model",
        "--heldout": "data/task/heldout.parquet", "--ttt": "data/task/ttt.parquet",
        "--base-eval": "data/it0/eval.parquet", "--discussion": "data/comas/${key}/discussion.json",
        "--train-metrics": "data/comas/${key}/train.json", "--eval-out": "data/comas/${key}/eval.parquet",
        "--out": "reports/comas/iterations/${key}/metrics.json"}, foreach="${agents.loop}", wdir="..",
        deps=("models",)),),
)


def main(argv: list[str] | None = None) -> None:
    def body(args: argparse.Namespace, params: Params) -> None:
        step = params.agents.index(args.iteration)
        set_threads()
        task = task_for(params.task)
        heldout, ttt = art.read_table(args.heldout, art.PROMPTS), art.read_table(args.ttt, art.PROMPTS)
        base_eval = art.read_table(args.base_eval, art.EVAL)
        discussion, trained = art.read_json(args.discussion), art.read_json(args.train_metrics)
        per_agent, frames = {}, []
        for k in range(params.agents.n):
            sampler = open_sampler(agent_model(args.agents, k, args.base), params.sample, params.security, args.base,
                                   params.model)
            answers: list[dict] = []
            m = model_metrics(sampler, heldout, ttt, params.evaluate, derive_seed(params.seed, "evaluate"), task,
                              answers=answers)
            df = pd.DataFrame(answers, columns=[f.name for f in art.EVAL if f.name != "iteration"])
            df.insert(0, "iteration", args.iteration)
            m.update(gains(base_eval, df))
            frames.append(df.assign(agent=k))
            name = f"agent{k}"
            per_agent[name] = {**m, **discussion["agents"].get(name, {}), **trained["agents"].get(name, {})}
            del sampler
        answers_df = pd.concat(frames, ignore_index=True)
        art.write_table(answers_df, args.eval_out, EVAL,
                        stage_provenance("comas_evaluate", args.iteration, params, PARAMS, [args.eval_out]))
        art.write_json({"iteration": args.iteration, "step": step, "problems": discussion["problems"],
                        "agents": {k: {n: v for n, v in m.items() if v is not None} for k, m in per_agent.items()}},
                       args.out)

    run_stage("comas_evaluate", DECLARATION.add_args, body, argv, reads=PARAMS)


if __name__ == "__main__":
    main()
