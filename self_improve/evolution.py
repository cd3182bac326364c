"""The next iteration's prompts: the curriculum's state and the current model as a writer of new problems.

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
informative ones that the current model writes from self_improve/templates/rewrite_prompt.txt, filtered
(empty, too long, near-duplicates of any prompt, held-out ones included). With co_reward the
current model also paraphrases every problem (self_improve/templates/paraphrase_prompt.txt); how many
paraphrases were kept is in the output's provenance and in evaluate's `rewrites_per_problem`.
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from self_improve import templates
from self_improve.config import EvolveConfig, Params
from self_improve.curriculum import BanditState, category_rewards, update
from self_improve.tasks.base import Writer
from self_improve.tasks.rewrites import render_rewrite_prompt

WRITE_TOKENS = 160  # new tokens a model-written question may take



def next_curriculum(state: BanditState, cfg: EvolveConfig, prev_judgments: pd.DataFrame) -> BanditState:
    """The bandit after last iteration's samples: TD(0) toward each category's mean |advantage|."""
    state = dataclasses.replace(state, alpha=cfg.sec_alpha, temperature=cfg.sec_temperature)
    if prev_judgments.empty:
        return state
    return update(state, category_rewards(prev_judgments))


def model_writer(model_dir: str, params: Params, seed: int, base: str | None = None) -> Writer:
    """The current model as a writer: `n` texts per prompt from one of the repo's templates."""
    from self_improve.engines.hf import SamplingSpec, generate
    from self_improve.models.loading import load_model, set_threads

    loaded: list = []

    def write(template_name: str, prompts: list[str], n: int) -> list[list[str]]:
        if not loaded:  # only when there is something to write
            set_threads()
            loaded.extend(load_model(model_dir, security=params.security, base=base, model_cfg=params.model))
        model, tok = loaded
        template = templates.read(template_name)
        spec = SamplingSpec(n=n, temperature=params.sample.temperature, top_p=params.sample.top_p,
                            max_new_tokens=WRITE_TOKENS, batch_size=params.sample.batch_size)
        outs = generate(model, tok, [render_rewrite_prompt(template, p) for p in prompts], spec, seed,
                        desc=template_name.split("_")[0])
        return [list(o) for o in outs]

    return write
