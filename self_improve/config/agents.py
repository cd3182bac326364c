"""params.yaml `agents`: CoMAS, several agents on one base that solve, evaluate and score each other.

The pipeline is comas/dvc.yaml (`dvc repro comas/dvc.yaml`); the default loop never reads this section.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator, model_validator

from self_improve.config.base import _Section
from self_improve.errors import ConfigError


class AgentLink(_Section):
    prev: str  # the iteration the agents start from (it0: the base model)

    @field_validator("prev")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(r"it\d+", v):
            raise ValueError(f"iteration names look like it0, it1, ...; got {v!r}")
        return v


class AgentsConfig(_Section):
    """CoMAS (arXiv 2510.08529): per problem and round, every agent writes a solution, another agent
    evaluates it and another scores it 1-3; the score rewards the solver ((s - 1) / 2) and, zero-sum,
    the evaluator; the scorer is rewarded for a score that parses. Each agent trains on its own
    interactions (REINFORCE++ advantages through the GRPO trainer, `train.grpo`)."""

    n: int = Field(2, ge=2, le=8, description="agents, each its own adapter chain on model.base (4 in the paper)")
    rounds: int = Field(2, ge=1, description="discussion rounds per problem (the paper's num_rounds)")
    references: int = Field(
        2, ge=0, description="kappa: earlier (solution, evaluation) pairs a solver sees from the round before")
    problems: int = Field(32, ge=1, description="fresh problems per iteration, drawn by the task")
    include_ttt: bool = Field(False, description="also discuss the test-time problems (answers unseen)")
    max_new_tokens: int = Field(256, ge=1, description="tokens per solution, evaluation and score")
    temperature: float = Field(1.0, gt=0, description="sampling temperature of every role (1.0 in the paper)")
    loop: dict[str, AgentLink] = Field(
        default_factory=lambda: {"it1": {"prev": "it0"}, "it2": {"prev": "it1"}}, validate_default=True,
        description="the agents' iterations and their predecessor (comas/dvc.yaml unrolls them)")

    @model_validator(mode="after")
    def _chain(self) -> "AgentsConfig":
        if not self.loop:
            raise ValueError("loop: at least one iteration is needed")
        for name, link in self.loop.items():
            if not re.fullmatch(r"it[1-9]\d*", name):
                raise ValueError(f"loop.{name}: iteration names are it1, it2, ... (it0 is the base model)")
            if link.prev != f"it{int(name[2:]) - 1}":
                raise ValueError(f"loop.{name}.prev: expected it{int(name[2:]) - 1}, got {link.prev}")
            if link.prev != "it0" and link.prev not in self.loop:
                raise ValueError(f"loop.{name}.prev: {link.prev} is not an iteration of agents.loop")
        return self

    def index(self, name: str) -> int:
        if name != "it0" and name not in self.loop:
            raise ConfigError(f"unknown iteration {name!r}; params.yaml agents.loop has {list(self.loop)}")
        return int(name[2:])
