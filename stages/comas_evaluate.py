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
from self_improve.stage import derive_seed, run_stage, stage_provenance
from self_improve.config import Params
from self_improve.engines.sampler import open_sampler
from self_improve.evaluation import gains, model_metrics
from self_improve.models.loading import set_threads
from self_improve.tasks import task_for

# the params keys this stage reads: comas/dvc.yaml's params for it, and its provenance
PARAMS = ("seed", "model", "task", "evaluate", "agents.n", "agents.loop", "sample.batch_size", "sample.backend",
          "sample.gpu_memory_utilization", "sample.vllm", "sample.ct2", "security")

# each agent's greedy answers: the loop's EVAL rows with the agent's number
EVAL = pa.schema([*art.EVAL, ("agent", pa.int64())])


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--iteration", required=True)
    p.add_argument("--agents", required=True, help="in: this iteration's agents")
    p.add_argument("--base", required=True, help="in: the base model (it0) that adapter chains apply to")
    p.add_argument("--heldout", required=True)
    p.add_argument("--ttt", required=True)
    p.add_argument("--base-eval", required=True, help="in: it0's answers to the same problems (evaluate_base)")
    p.add_argument("--discussion", required=True, help="in: the discussion's metrics (json)")
    p.add_argument("--train-metrics", required=True, help="in: the training metrics (json)")
    p.add_argument("--eval-out", required=True, help="out: each agent's greedy answers (parquet)")
    p.add_argument("--out", required=True, help="out: the iteration's metrics per agent (json)")


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

    run_stage("comas_evaluate", _args, body, argv, reads=PARAMS)


if __name__ == "__main__":
    main()
