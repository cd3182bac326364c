"""params.yaml `judge` and `pairs`: how samples are labelled without gold, and which become training data."""

from __future__ import annotations

import enum
from typing import Optional

from pydantic import Field, model_validator

from self_improve.config.base import _Section


class JudgeMethod(str, enum.Enum):
    majority_vote = "majority_vote"  # TTRL
    co_reward = "co_reward"  # agreement with the pooled vote of equivalent rewrites
    llm_judge = "llm_judge"  # Self-Rewarding LMs: the model scores with the 5-point rubric
    self_certainty = "self_certainty"  # mean KL(Uniform || p) over the response tokens
    implicit_reward = "implicit_reward"  # sum log pi_current - sum log pi_reference (CREAM)
    vote_share = "vote_share"  # ScPO: a sample's reward is the share of the votes its answer got
    verifier = "verifier"  # ground truth: oracle baseline
    # control arms (Spurious Rewards, 2506.10947): what a loop gains from a reward that knows nothing
    random = "random"  # a seeded uniform reward in [0, 1] per sample
    format = "format"  # 1 for a response that is not cut, short, and ends with an extractable answer; else 0
    validity_only = "validity_only"  # the validity check's verdict alone (1 valid, 0 not), no vote

    @property
    def runs_model(self) -> bool:
        """The judge scores with a model (the policy, its predecessor), not from the answers alone."""
        return self in (JudgeMethod.llm_judge, JudgeMethod.self_certainty, JudgeMethod.implicit_reward)

    @property
    def needs_rewrites(self) -> bool:
        """The prompts must come with equivalent rewrites (evolve writes them): co_reward's views."""
        return self is JudgeMethod.co_reward


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
    method: JudgeMethod = JudgeMethod.co_reward
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

    @model_validator(mode="after")
    def _vote_options(self) -> "JudgeConfig":
        votes = (JudgeMethod.majority_vote, JudgeMethod.co_reward, JudgeMethod.vote_share)
        if self.inverse and self.method not in votes:
            raise ValueError(f"inverse: weighs the votes of a vote judge ({', '.join(m.value for m in votes)}), "
                             f"not {self.method.value}")
        if self.frozen != FrozenJudge.none and self.method not in votes:
            raise ValueError(f"frozen: weighs the votes of a vote judge ({', '.join(m.value for m in votes)}), "
                             f"not {self.method.value}")
        if self.frozen_mix > 0 and self.frozen == FrozenJudge.none:
            raise ValueError("frozen_mix: mixes the frozen judge's weights; set frozen (yes_logprob) too")
        if self.low_consensus != LowConsensus.skip and self.method not in votes:
            raise ValueError(f"low_consensus: penalises the prompts without a vote label, which "
                             f"{self.method.value} does not give")
        if self.cross_view != CrossView.pooled and self.method != JudgeMethod.co_reward:
            raise ValueError(f"cross_view: {self.cross_view.value} compares co_reward's wordings, "
                             f"not {self.method.value}")
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
