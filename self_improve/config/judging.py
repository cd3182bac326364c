"""params.yaml `judge` and `pairs`: how samples are labelled without gold, and which become training data."""

from __future__ import annotations

import enum
from typing import Annotated, Optional

from pydantic import AfterValidator, Field, model_validator

from self_improve.config.base import _Section
from self_improve.config.judges import JUDGES, judge_of
from self_improve.config.tables import named_in


class CrossView(str, enum.Enum):
    pooled = "pooled"  # Co-Reward: the plurality of all wordings' votes pooled
    harmonic = "harmonic"  # Self-Harmony: the answer maximising the harmonic mean of its two views' shares


class RestateRule(str, enum.Enum):
    first = "first"  # the question's first quantity (where the story starts)
    any = "any"  # any number of the question


class LowConsensus(str, enum.Enum):
    skip = "skip"  # no verdict, no pair (ScPO's and RESTRAIN's gate)
    penalise = "penalise"  # RESTRAIN: every sample wrong (reward 0), a negative advantage for grpo / nft


class FrozenJudge(str, enum.Enum):
    none = "none"  # not "off": YAML 1.1 reads an unquoted off as false, and dvc exp run -S rewrites params.yaml unquoted
    yes_logprob = "yes_logprob"  # it0 (adapters off) weighs each answer's votes by its mean P(Yes)


class JudgeMode(str, enum.Enum):
    generate = "generate"  # the judge writes a justification and "Score: N", which is parsed
    score_logprob = "score_logprob"  # G-Eval: expected score over the tokens 1..5 after "Score: "
    yes_logprob = "yes_logprob"  # P(Yes) for "is the proposed answer correct?" (`correct_template`)


class JudgeConfig(_Section):
    method: Annotated[str, AfterValidator(named_in(JUDGES))] = Field(
        "co_reward", description="the judge: an entry of the judge table (self_improve/config/judges.py), "
        "built in or added with `register` (docs/extending.md)",
    )
    mode: JudgeMode = Field(
        JudgeMode.generate, description="llm_judge: generate and parse a score, or read it from the "
        "next-token distribution (one forward pass per judgment, never fails to parse)",
    )
    correct_template: str = Field(
        "self_improve/templates/judge_correct.txt", min_length=1,
        description="llm_judge mode yes_logprob: the question asked about each response",
    )
    min_share: float = Field(
        0.2, ge=0, le=1, description="a vote label needs at least this share of the votes, else null "
        "(RESTRAIN and ScPO's gate: 0.5 skips prompts without a majority)",
    )
    min_share_step: float = Field(
        0.0, ge=0, le=1, description="the gate rises by this every iteration: min(1, min_share + (N - 1) x step) "
        "at itN (a gate that may rise as the policy grows more certain)",
    )
    category_gate: float = Field(
        0.0, ge=0, le=1, description="vote judges: a category (task's operation, dataset) whose share of prompts "
        "with a label is under this gives no labels at all this iteration (0: off); the labels of a category "
        "where the vote is rarely certain are the ones most often wrong (CuMa's masking of prompts without a "
        "clear majority, per category; a category joins once the policy agrees with itself on enough of it)",
    )
    low_consensus: LowConsensus = Field(
        LowConsensus.skip, description="vote judges, prompts with no label (under the gate, a tie, no answer): "
        "skip (no verdict) or penalise (RESTRAIN: reward 0 for every sample, kept as `penalised`; grpo gives "
        "them advantage -pairs.penalty, nft trains them as wrong; no DPO pair)",
    )
    cross_view: CrossView = Field(
        CrossView.pooled, description="co_reward: how the original wording's votes and its rewrites' make "
        "the label: pooled (Co-Reward) or harmonic (Self-Harmony: max 2 p0 p1 / (p0 + p1))",
    )
    min_harmony: float = Field(
        0.0, ge=0, le=1, description="co_reward cross_view harmonic: a label needs at least this score",
    )
    validity: bool = Field(
        False, description="vote judges: responses that restate the question, copy its sentence or write a "
        "false calculation do not vote, get the lowest reward and are preferred as rejected",
    )
    restates: RestateRule = Field(
        RestateRule.first, description="judge.validity: an answer that is the question's first number (first) "
        "or any of its numbers (any), with no calculation arriving at it, is a restatement")
    shortcut: bool = Field(
        False, description="judge.validity: an answer the task rules out from the question alone is invalid "
        "(word_math: the sum of the question's numbers where a step is not an addition)")
    frozen: FrozenJudge = Field(
        FrozenJudge.none, description="vote judges: the base model, frozen, weighs each answer's vote share by "
        "its mean P(Yes) for `correct_template` (label score = vote share x frozen P(Yes))",
    )
    frozen_mix: float = Field(
        0.0, ge=0, le=1, description="judge.frozen: the judge's weights are (1 - mix) x it0 + mix x the model "
        "that sampled (0: it0 frozen; between: a slowly moving judge that follows the policy part way)",
    )
    inverse: bool = Field(
        False, description="vote judges: self-verification by inverse problems; the policy solves each proposed "
        "answer's problem backwards (the answer given, a number of the question hidden) and an answer that does "
        "not come back to the hidden number has its votes weighed by inverse_weight (tasks with inverse problems: "
        "word_math, reasoning_gym's two-number expressions)",
    )
    inverse_weight: float = Field(
        0.25, ge=0, le=1, description="judge.inverse: the weight of the votes of an answer whose inverse fails",
    )
    format_max_chars: int = Field(
        200, ge=1, description="format: the longest response (characters) the format reward calls short",
    )
    template: str = Field(
        "self_improve/templates/judge_rubric.txt", min_length=1, description="llm_judge: the rubric prompt"
    )
    judgments: int = Field(3, ge=1, description="llm_judge: judgments per response, averaged")
    temperature: float = Field(0.7, gt=0, description="llm_judge: sampling temperature of the judge")
    max_new_tokens: int = Field(48, ge=1, description="llm_judge: length of the judge's answer; inverse: of the "
                                "policy's answer to an inverse problem")
    max_prompts: Optional[int] = Field(
        32, ge=1, description="llm_judge mode generate: prompts judged per iteration (seeded choice; None: all)"
    )

    @property
    def entry(self):
        """This method's entry of the judge table (self_improve/config/judges.py)."""
        return judge_of(self.method)

    @model_validator(mode="after")
    def _vote_options(self) -> "JudgeConfig":
        votes = ", ".join(name for name, j in JUDGES.items() if j.votes)
        if self.inverse and not self.entry.votes:
            raise ValueError(f"inverse: weighs the votes of a vote judge ({votes}), not {self.method}")
        if self.frozen != FrozenJudge.none and not self.entry.votes:
            raise ValueError(f"frozen: weighs the votes of a vote judge ({votes}), not {self.method}")
        if self.frozen_mix > 0 and self.frozen == FrozenJudge.none:
            raise ValueError("frozen_mix: mixes the frozen judge's weights; set frozen (yes_logprob) too")
        if self.shortcut and not self.validity:
            raise ValueError("shortcut: a reason of the validity check; set judge.validity too")
        if self.category_gate > 0 and not self.entry.votes:
            raise ValueError(f"category_gate: gates the labels of a vote judge ({votes}), not {self.method}")
        if self.low_consensus != LowConsensus.skip and not self.entry.votes:
            raise ValueError(f"low_consensus: penalises the prompts without a vote label, which "
                             f"{self.method} does not give")
        if self.cross_view != CrossView.pooled and not self.entry.needs_rewrites:
            raise ValueError(f"cross_view: {self.cross_view.value} compares co_reward's wordings (a judge that "
                             f"reads rewrites), not {self.method}")
        return self


class PairWeight(str, enum.Enum):
    none = "none"  # every pair counts once
    margin = "margin"  # ScPO: chosen reward - rejected reward (with vote_share: the vote margin / k)


class PairsConfig(_Section):
    min_margin: float = Field(0.0, ge=0, description="drop pairs whose reward margin is not above this")
    weight: PairWeight = Field(
        PairWeight.none, description="each pair's weight in the preference loss (and its NLL term): none, or "
        "margin (ScPO's vote margin with judge.method vote_share)",
    )
    max_pairs: Optional[int] = Field(
        None, ge=1, description="at most this many pairs per iteration, a seeded draw (None: all): a control "
        "arm (judge.method random) held to the pair budget of the rule it controls",
    )
    sft_min_reward: float = Field(1.0, description="RAFT keeps best samples with at least this reward")
    penalty: float = Field(1.0, ge=0, description="grpo: the advantage -penalty of every sample of a prompt "
                           "judge.low_consensus penalise marked (RESTRAIN's negative rollout penalty)")
