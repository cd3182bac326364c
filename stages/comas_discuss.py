"""Stage `comas_discuss@itN` (comas/dvc.yaml): the agents of the previous iteration discuss this
iteration's problems: solutions, evaluations and scores, with every reward allocated.

The logic: self_improve/agents/."""

from __future__ import annotations

import argparse

from self_improve import artifacts as art
from self_improve.agents.discussion import TRANSCRIPTS, Problem, agent_metrics, discuss
from self_improve.agents.roster import agent_model, problems
from self_improve.config import Params
from self_improve.engines.hf import SamplingSpec
from self_improve.engines.sampler import open_sampler
from self_improve.models.loading import set_threads
from self_improve.stage import ITERATION, Arg, Declaration, Run, derive_seed, run_stage, stage_provenance
from self_improve.tasks import task_for

# the params keys this stage reads: comas/dvc.yaml's params for it, and its provenance
PARAMS = ("seed", "model", "task", "evolve", "agents", "sample.top_p", "sample.batch_size", "sample.backend",
          "sample.gpu_memory_utilization", "sample.vllm", "sample.ct2", "security")


DECLARATION = Declaration(
    args=(
        ITERATION,
        Arg("--agents", "in", "the previous iteration's agents", required=True),
        Arg("--base", "in", "the base model (it0) that adapter chains apply to", required=True),
        Arg("--heldout", "in", "held-out problems (never discussed)", required=True),
        Arg("--ttt", "in", "test-time problems", required=True),
        Arg("--out", "out", "the transcripts (parquet)", required=True),
        Arg("--metrics", "out", "the discussion's metrics per agent (json)", required=True),
    ),
    params=PARAMS,
    runs=(Run("comas_discuss", {
        "--iteration": "${key}", "--agents": "data/comas/${item.prev}/agents", "--base": "data/it0/model",
        "--heldout": "data/task/heldout.parquet", "--ttt": "data/task/ttt.parquet",
        "--out": "data/comas/${key}/transcripts.parquet", "--metrics": "data/comas/${key}/discussion.json"},
        foreach="${agents.loop}", wdir="..", deps=("models  # local base models live here (make smollm2)",)),),
)


def main(argv: list[str] | None = None) -> None:
    def body(args: argparse.Namespace, params: Params) -> None:
        cfg = params.agents
        step = cfg.index(args.iteration)
        set_threads()
        task = task_for(params.task)
        todo = problems(task, cfg, params.evolve, args.iteration, derive_seed(params.seed, "comas", args.iteration),
                        art.read_table(args.ttt, art.PROMPTS), art.read_table(args.heldout, art.PROMPTS))
        spec = SamplingSpec(n=1, temperature=cfg.temperature, top_p=params.sample.top_p,
                            max_new_tokens=cfg.max_new_tokens, batch_size=params.sample.batch_size)
        samplers = [open_sampler(agent_model(args.agents, k, args.base), params.sample, params.security, args.base,
                                 params.model) for k in range(cfg.n)]

        def generate(agent: int, prompts: list[str], seed: int):
            return samplers[agent].generate(prompts, spec, seed, desc=f"agent{agent}")

        def verify(pred: str | None, p: Problem) -> float | None:
            return None if p.answer is None else float(task.verify(pred, p.answer, p.category))

        df = discuss(todo, cfg, generate, derive_seed(params.seed, "comas-discuss", args.iteration), args.iteration,
                     lambda text: task.extract(text).answer, verify)
        prov = stage_provenance("comas_discuss", args.iteration, params, PARAMS, [args.out])
        prov["backend"] = samplers[0].backend
        art.write_table(df, args.out, TRANSCRIPTS, prov)
        art.write_json({"iteration": args.iteration, "step": step, "problems": len(todo),
                        "agents": agent_metrics(df, cfg.n)}, args.metrics)

    run_stage("comas_discuss", DECLARATION.add_args, body, argv, reads=PARAMS)


if __name__ == "__main__":
    main()
