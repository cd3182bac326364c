"""The judge table: every `judge.method`, once, with everything about it.

An entry says what the judge needs (the policy, the reference model, a rubric template, the
prompts' equivalent rewrites), whether it takes the vote options (validity, frozen, inverse, the
min_share gate, low_consensus), whether its rewards are verdicts in [0, 1] or a ranking, and where
its verdict function lives: `"module:function"`, imported only when the judge runs (so reading the
table, as config validation does, loads no model code), or the function itself. Config validation,
the judge stage, the evaluate stage's frozen judge and the diagnosis all read this one table.

A verdict function is TRL's reward-function contract with the samples as a table:
`fn(samples, cfg, ctx) -> Verdicts`, a reward (float or None: no verdict) per row of `samples`
(columns prompt_id, group_id, prompt, response, pred, category; `answer` only for a judge that
`uses_ground_truth`), `cfg` the JudgeConfig, `ctx` the JudgeContext (models, template, seed).

Adding a judge is one module holding its function and one `register` call (docs/extending.md):

    register("length", Judge("my_judges:length", "shorter is better", verdict=False))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Union

from self_improve.config.tables import Table, resolve


@dataclass(frozen=True)
class Judge:
    fn: Union[str, Callable[..., Any]]  # "module:function", or the function: (samples, cfg, ctx) -> Verdicts
    about: str = ""  # one line: what the reward is, and the paper it comes from
    needs_policy: bool = False  # scores with the model that sampled
    needs_reference: bool = False  # scores with the model before it (implicit reward)
    needs_template: bool = False  # renders judge.template (or correct_template in yes_logprob mode)
    needs_rewrites: bool = False  # the prompts come with equivalent rewrites (evolve writes them)
    votes: bool = False  # a vote judge: takes judge.validity's votes, frozen, inverse, low_consensus
    uses_ground_truth: bool = False  # sees the gold answer: an oracle, not label-free
    verdict: bool = True  # rewards are verdicts in [0, 1] (>= 0.5: judged right); else a ranking score

    @property
    def runs_model(self) -> bool:
        """The judge scores with a model, not from the answers alone."""
        return self.needs_policy or self.needs_reference

    def function(self) -> Callable[..., Any]:
        return resolve(self.fn)


JUDGES: Table[Judge] = Table("judge", {
    "majority_vote": Judge("self_improve.judges.votes:majority_vote", votes=True,
                           about="TTRL: per prompt, the plurality answer of its k samples is the label"),
    "co_reward": Judge("self_improve.judges.votes:co_reward", votes=True, needs_rewrites=True,
                       about="Co-Reward: the plurality answer pooled over a problem's equivalent rewrites"),
    "vote_share": Judge("self_improve.judges.votes:vote_share", votes=True,
                        about="ScPO: a sample's reward is the share of the prompt's votes its answer got"),
    "llm_judge": Judge("self_improve.judges.model:llm_judge", needs_policy=True, needs_template=True,
                       about="Self-Rewarding LMs: the model scores each response (rubric, G-Eval or P(Yes))"),
    "self_certainty": Judge("self_improve.judges.model:self_certainty", needs_policy=True, verdict=False,
                            about="mean KL(Uniform || p) over the response tokens under the policy"),
    "implicit_reward": Judge("self_improve.judges.model:implicit_reward", needs_policy=True, needs_reference=True,
                             verdict=False, about="CREAM / DPO: log pi_current(y|x) - log pi_reference(y|x)"),
    "verifier": Judge("self_improve.judges.registry:verifier", uses_ground_truth=True,
                      about="ground truth: the oracle baseline and the yardstick of judge quality"),
    # control arms (Spurious Rewards, 2506.10947): what a loop gains from a reward that knows nothing
    "random": Judge("self_improve.judges.controls:random_reward",
                    about="control arm: a seeded uniform reward in [0, 1] per sample"),
    "format": Judge("self_improve.judges.controls:format_reward",
                    about="control arm: 1 for an uncut, short response ending in an extractable answer"),
    "validity_only": Judge("self_improve.judges.controls:validity_reward",
                           about="control arm: the validity check's verdict alone (1 valid, 0 not), no vote"),
})


register = JUDGES.register  # a new judge.method: register("name", Judge(...))
unregister = JUDGES.unregister
judge_of = JUDGES.of  # the entry of a judge.method; an unknown one refused with the table's names
