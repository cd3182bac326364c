"""Stage `comas_discuss@itN` (comas/dvc.yaml): the agents of the previous iteration discuss this
iteration's problems: solutions, evaluations and scores, with every reward allocated.

The logic: self_improve/agents/."""

from __future__ import annotations

import argparse

from self_improve import artifacts as art
from self_improve.agents.discussion import TRANSCRIPTS, Problem, agent_metrics, discuss
from self_improve.agents.roster import agent_model, problems
from self_improve.stage import derive_seed, run_stage, stage_provenance
from self_improve.config import Params
from self_improve.engines.hf import SamplingSpec
from self_improve.engines.sampler import open_sampler
from self_improve.models.loading import set_threads
from self_improve.tasks import task_for

# the params keys this stage reads: comas/dvc.yaml's params for it, and its provenance
PARAMS = ("seed", "model", "task", "evolve", "agents", "sample.top_p", "sample.batch_size", "sample.backend",
          "sample.gpu_memory_utilization", "sample.vllm", "sample.ct2", "security")


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--iteration", required=True)
    p.add_argument("--agents", required=True, help="in: the previous iteration's agents")
    p.add_argument("--base", required=True, help="in: the base model (it0) that adapter chains apply to")
    p.add_argument("--heldout", required=True, help="in: held-out problems (never discussed)")
    p.add_argument("--ttt", required=True, help="in: test-time problems")
    p.add_argument("--out", required=True, help="out: the transcripts (parquet)")
    p.add_argument("--metrics", required=True, help="out: the discussion's metrics per agent (json)")


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

    run_stage("comas_discuss", _args, body, argv, reads=PARAMS)


if __name__ == "__main__":
    main()
