"""The control arms of a label-free rule (Spurious Rewards, arXiv 2506.10947; One-shot RLVR,
2504.20571): rewards that know nothing of the answer's truth, looped exactly as a rule is, so that
what a rule gains beyond them can be read.

- ``random``: a seeded uniform reward in [0, 1] per sample (the same sample id at the same judge seed
  gets the same reward); `pairs.max_pairs` holds it to the pair budget of the rule it controls.
- ``format``: 1 for a response that is not cut, is short (at most `judge.format_max_chars`
  characters) and ends with an extractable answer (its last number is the answer read from it);
  0 otherwise. What a model gains from learning to answer in form.
- ``validity_only``: the validity check's verdict alone (self_improve/judges/validity.py, with
  `judge.restates`): 1 for a valid response with an answer, 0 for an invalid one or none; no vote.
  What a rule's gain owes to the check's knowledge of the task family.
"""

from __future__ import annotations

import hashlib
import random
from typing import Optional

import pandas as pd

from self_improve.config import JudgeConfig
from self_improve.judges.base import JudgeContext, Verdicts
from self_improve.judges.validity import invalid_reason, numbers


def _text(x) -> str:
    return x if isinstance(x, str) else ""


def _answer(x) -> Optional[str]:
    return x if isinstance(x, str) else None


def random_reward(samples: pd.DataFrame, cfg: JudgeConfig, ctx: JudgeContext) -> Verdicts:
    def draw(sample_id: str) -> float:
        digest = hashlib.sha256(f"{ctx.seed}/{sample_id}".encode()).digest()
        return random.Random(digest).random()

    return Verdicts([draw(str(s)) for s in samples["sample_id"]])


def well_formed(response: str, pred: Optional[str], truncated: bool, max_chars: int) -> bool:
    """Not cut, at most `max_chars` characters, and its last number is the answer read from it."""
    if truncated or pred is None or len(response) > max_chars:
        return False
    found = numbers(response)
    return bool(found) and found[-1] == pred


def format_reward(samples: pd.DataFrame, cfg: JudgeConfig, ctx: JudgeContext) -> Verdicts:
    return Verdicts([float(well_formed(_text(r), _answer(p), bool(t), cfg.format_max_chars))
                     for r, p, t in zip(samples["response"], samples["pred"], samples["truncated"])])


def validity_reward(samples: pd.DataFrame, cfg: JudgeConfig, ctx: JudgeContext) -> Verdicts:
    return Verdicts([float(_answer(p) is not None and
                           invalid_reason(ctx.question(q), _text(r), _answer(p), cfg.restates.value,
                                          ctx.ruled_out(q) if cfg.shortcut else ()) is None)
                     for q, r, p in zip(samples["prompt"], samples["response"], samples["pred"])])
