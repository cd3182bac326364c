"""Stage `evolve`: the prompts of one iteration, proposed by the task (self_improve/tasks/).

The logic: self_improve/evolution.py."""

from __future__ import annotations

import argparse
from pathlib import Path

from self_improve import artifacts as art
from self_improve.config import EvolveStrategy, Params
from self_improve.curriculum import BanditState
from self_improve.evolution import model_writer, next_curriculum
from self_improve.stage import BASE, ITERATION, Arg, Declaration, Run, derive_seed, run_stage, stage_provenance
from self_improve.stopping import decide
from self_improve.tasks import ProposeInput, task_for

# the params keys this stage reads: dvc.yaml's params for it, and its provenance
PARAMS = (
    "seed", "model", "task", "evolve", "judge.method", "train.algorithm", "sample.temperature",
    "sample.top_p", "sample.batch_size", "security", "stop",
)


DECLARATION = Declaration(
    args=(
        ITERATION,
        Arg("--ttt", "in", "test-time problems", required=True),
        Arg("--heldout", "in", "held-out problems (never posed)", required=True),
        Arg("--prev-judgments", "in", "previous iteration's judgments", required=True),
        Arg("--seed-data", "in", "the base model's SFT data (SPIN's references)", required=True),
        Arg("--prev-curriculum", "in", "the bandit state after the previous iteration", required=True),
        Arg("--model", "in", "the iteration's starting model (it rewrites prompts of a prompt file)", required=True),
        BASE,
        Arg("--out", "out", "this iteration's prompts", required=True),
        Arg("--curriculum", "out", "the bandit state of this iteration (json)", required=True),
        Arg("--history", "in", "the metrics of it0 .. the previous iteration (evaluate's history.json)",
            note="the metrics so far: whether the loop stops here"),
        Arg("--stop", "out", "whether the loop has stopped before this iteration, and why (json)"),
    ),
    params=PARAMS,
    runs=(Run("evolve", {
        "--iteration": "${key}", "--ttt": "data/task/ttt.parquet", "--heldout": "data/task/heldout.parquet",
        "--prev-judgments": "data/${item.prev}/judgments.parquet", "--seed-data": "data/task/seed.parquet",
        "--prev-curriculum": "data/${item.prev}/curriculum.json", "--model": "data/${item.prev}/model",
        "--base": "data/it0/model", "--history": "data/${item.prev}/history.json",
        "--stop": "data/${key}/stop.json", "--out": "data/${key}/prompts.parquet",
        "--curriculum": "data/${key}/curriculum.json"},
        foreach="${loop}",
        deps=("self_improve/templates/rewrite_prompt.txt", "self_improve/templates/paraphrase_prompt.txt")),),
)


def main(argv: list[str] | None = None) -> None:
    def body(args: argparse.Namespace, params: Params) -> None:
        params.iteration_index(args.iteration)
        prev = art.read_table(args.prev_judgments, art.JUDGMENTS)
        try:
            text = Path(args.prev_curriculum).read_text(encoding="utf-8")
        except OSError as err:
            raise art.ArtifactError(f"{args.prev_curriculum}: cannot read ({err.strerror})") from None
        state = BanditState.from_json(text, args.prev_curriculum)
        state = next_curriculum(state, params.evolve, prev)
        n_seed = params.seed_prompts()
        fixed = params.evolve.strategy == EvolveStrategy.fixed
        # `fixed`: one seed for every iteration and the base model as the writer of any rewrite,
        # so every iteration poses the same prompt set, byte for byte (its `iteration` column aside)
        seed = derive_seed(params.seed, "evolve", "fixed" if fixed else args.iteration)
        writer_model = args.base if fixed and args.base else args.model
        task = task_for(params.task)
        stop = decide(art.read_json(args.history) if args.history else [], params.stop)
        if args.stop:
            art.write_json(stop.to_dict(), args.stop)
        with art.atomic_path(args.curriculum) as tmp:
            tmp.write_text(state.to_json(), encoding="utf-8")
        if stop.stopped:  # no prompts: nothing is sampled, judged or trained, the model is passed on
            prov = stage_provenance("evolve", args.iteration, params, PARAMS, [args.out]) | {"stopped": stop.reason}
            art.write_table(art.empty_table(art.PROMPTS), args.out, art.PROMPTS, prov)
            return
        inp = ProposeInput(
            cfg=params.evolve, iteration=args.iteration, seed=seed,
            ttt=art.read_table(args.ttt, art.PROMPTS), heldout=art.read_table(args.heldout, art.PROMPTS),
            prev_judgments=prev, curriculum=state,
            seed_data=art.read_table(args.seed_data, art.SFT) if n_seed else None, seed_prompts=n_seed,
            rewrites=params.judge.entry.needs_rewrites,
            writer=model_writer(writer_model, params, seed, args.base),
        )
        df = task.propose(inp)
        prov = stage_provenance("evolve", args.iteration, params, PARAMS, [args.out])
        # what the judge changes here is only whether rewrites are written: record that, not its
        # name, so judges that need none share this output byte for byte (and DVC's cache with it)
        prov.update({"seed_prompts": n_seed, "rewrites_for_judge": inp.rewrites, **inp.stats})
        art.write_table(df, args.out, art.PROMPTS, prov)

    run_stage("evolve", DECLARATION.add_args, body, argv, reads=PARAMS)


if __name__ == "__main__":
    main()
