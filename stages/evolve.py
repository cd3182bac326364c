"""Stage `evolve`: the prompts of one iteration, proposed by the task (self_improve/tasks/).

The logic: self_improve/evolution.py."""

from __future__ import annotations

import argparse
from pathlib import Path

from self_improve import artifacts as art
from self_improve.stage import derive_seed, run_stage, stage_provenance
from self_improve.config import EvolveStrategy, Params
from self_improve.curriculum import BanditState
from self_improve.evolution import model_writer, next_curriculum
from self_improve.stopping import decide
from self_improve.tasks import ProposeInput, task_for

# the params keys this stage reads: dvc.yaml's params for it, and its provenance
PARAMS = (
    "seed", "model", "task", "evolve", "judge.method", "train.algorithm", "sample.temperature",
    "sample.top_p", "sample.batch_size", "security", "stop",
)


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--iteration", required=True)
    p.add_argument("--ttt", required=True, help="in: test-time problems")
    p.add_argument("--heldout", required=True, help="in: held-out problems (never posed)")
    p.add_argument("--prev-judgments", required=True, help="in: previous iteration's judgments")
    p.add_argument("--seed-data", required=True, help="in: the base model's SFT data (SPIN's references)")
    p.add_argument("--prev-curriculum", required=True,
                   help="in: the bandit state after the previous iteration")
    p.add_argument("--model", required=True,
                   help="in: the iteration's starting model (it rewrites prompts of a prompt file)")
    p.add_argument("--base", help="in: the base model (it0) that adapter chains apply to")
    p.add_argument("--out", required=True, help="out: this iteration's prompts")
    p.add_argument("--curriculum", required=True, help="out: the bandit state of this iteration (json)")
    p.add_argument("--history", help="in: the metrics of it0 .. the previous iteration (evaluate's history.json)")
    p.add_argument("--stop", help="out: whether the loop has stopped before this iteration, and why (json)")


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

    run_stage("evolve", _args, body, argv, reads=PARAMS)


if __name__ == "__main__":
    main()
