"""Judges: who labels a sample without gold answers, one module per family.

- `base`: what every judge takes and returns (Verdicts, JudgeContext, ModelHandle).
- `votes`: majority_vote, co_reward, vote_share and the label-free rules they take.
- `model`: the model as its own judge (llm_judge, self_certainty, implicit_reward).
- `validity`: the check that needs no gold; `rubric`: the 5-point rubric's template and parser.
- `controls`: the control arms (random, format, validity_only); `inverse`: inverse problems.
- `registry`: `judge_samples` (the configured judge of the judge table, self_improve/config/judges.py)
  and judge quality against the oracle `verifier`.
"""

from self_improve.judges.base import JudgeContext, ModelHandle, Verdicts, template_path
from self_improve.judges.registry import context, frozen_context, judge_quality, judge_samples, needs
from self_improve.judges.votes import vote_label

__all__ = ["JudgeContext", "context", "frozen_context", "needs", "ModelHandle", "Verdicts", "judge_quality", "judge_samples",
           "template_path", "vote_label"]
