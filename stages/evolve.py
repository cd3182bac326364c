"""Stage `evolve`: the prompts of one iteration, proposed by the task (stages/lib/tasks/).

For a procedural task (arithmetic, word_math): the test-time problems (their prompts, never their
answers, reach the self-judge), fresh procedural problems, and by `evolve.strategy`:
- `fixed`: the same fresh problems every iteration;
- `eva`: new fresh problems, plus mutations of the previous iteration's most informative
  problems: those whose self-judged rewards spread the most across their samples;
- `sec` (Self-Evolving Curriculum): the fresh problems are drawn per category (carry
  structure) from a softmax over the categories' values, a non-stationary bandit whose reward is
  the mean |advantage| of the category's samples last iteration, updated by TD(0).
The bandit's state is an artifact of each iteration (`--curriculum`), updated under every
strategy, so a rerun is deterministic and the values can be compared. Every problem comes with
equivalent rewrites (same answer) so that rewrite-agreement judges can work. For SPIN, prompts of
the seed data (the base model's SFT set, with its reference answers) are added as posed.

With the user's file (`math_file`, `instructions`) the prompts are the file's training rows; `sec`
draws `evolve.fresh` of them by category from the bandit, and `eva` adds new problems like the most
informative ones that the current model writes from stages/templates/rewrite_prompt.txt, filtered
(empty, too long, near-duplicates of any prompt, held-out ones included). With co_reward the
current model also paraphrases every problem (stages/templates/paraphrase_prompt.txt); how many
paraphrases were kept is in the output's provenance and in evaluate's `rewrites_per_problem`.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pandas as pd

from .lib import artifacts as art
from .lib.cli import derive_seed, run_stage, stage_provenance
from .lib.config import EvolveConfig, EvolveStrategy, Params
from .lib.curriculum import BanditState, category_rewards, update
from .lib.judges import REGISTRY
from .lib.prompt_files import render_rewrite_prompt
from .lib.tasks import ProposeInput, task_for
from .lib.tasks.base import Writer
from .lib.tasks.files import TEMPLATES

WRITE_TOKENS = 160  # new tokens a model-written question may take



def next_curriculum(state: BanditState, cfg: EvolveConfig, prev_judgments: pd.DataFrame) -> BanditState:
    """The bandit after last iteration's samples: TD(0) toward each category's mean |advantage|."""
    state = dataclasses.replace(state, alpha=cfg.sec_alpha, temperature=cfg.sec_temperature)
    if prev_judgments.empty:
        return state
    return update(state, category_rewards(prev_judgments))


def model_writer(model_dir: str, params: Params, seed: int, base: str | None = None) -> Writer:
    """The current model as a writer: `n` texts per prompt from one of the repo's templates."""
    from .lib.generation import SamplingSpec, generate
    from .lib.models import load_model, set_threads

    loaded: list = []

    def write(template_name: str, prompts: list[str], n: int) -> list[list[str]]:
        if not loaded:  # only when there is something to write
            set_threads()
            loaded.extend(load_model(model_dir, security=params.security, base=base, model_cfg=params.model))
        model, tok = loaded
        template = (TEMPLATES / template_name).read_text(encoding="utf-8")
        spec = SamplingSpec(n=n, temperature=params.sample.temperature, top_p=params.sample.top_p,
                            max_new_tokens=WRITE_TOKENS, batch_size=params.sample.batch_size)
        outs = generate(model, tok, [render_rewrite_prompt(template, p) for p in prompts], spec, seed,
                        desc=template_name.split("_")[0])
        return [list(o) for o in outs]

    return write


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
        inp = ProposeInput(
            cfg=params.evolve, iteration=args.iteration, seed=seed,
            ttt=art.read_table(args.ttt, art.PROMPTS), heldout=art.read_table(args.heldout, art.PROMPTS),
            prev_judgments=prev, curriculum=state,
            seed_data=art.read_table(args.seed_data, art.SFT) if n_seed else None, seed_prompts=n_seed,
            rewrites=REGISTRY[params.judge.method].needs_rewrites,
            writer=model_writer(writer_model, params, seed, args.base),
        )
        df = task.propose(inp)
        prov = stage_provenance("evolve", args.iteration, params, ("seed", "task", "evolve"), [args.out])
        # what the judge changes here is only whether rewrites are written: record that, not its
        # name, so judges that need none share this output byte for byte (and DVC's cache with it)
        prov.update({"seed_prompts": n_seed, "rewrites_for_judge": inp.rewrites, **inp.stats})
        art.write_table(df, args.out, art.PROMPTS, prov)
        with art.atomic_path(args.curriculum) as tmp:
            tmp.write_text(state.to_json(), encoding="utf-8")

    run_stage("evolve", _args, body, argv)


if __name__ == "__main__":
    main()
