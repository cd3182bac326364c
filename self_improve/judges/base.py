"""What every judge takes and returns: the samples' verdicts, the models and templates a judge may need
(JudgeContext), and the task's check of an answer (`verify`, absent where there is no ground truth)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import pandas as pd

from self_improve import templates
from self_improve.config import JudgeMode

Verify = Callable[..., Optional[float]]  # (answer, gold, category=None) -> 1.0 / 0.0 / None




@dataclass
class Verdicts:
    reward: list[Optional[float]]
    label: Optional[list[Optional[str]]] = None  # a pseudo-label (vote judges)
    parse_rate: Optional[list[Optional[float]]] = None  # share of judge outputs that parsed
    penalised: Optional[list[bool]] = None  # judge.low_consensus penalise: the sample's prompt had no label


@dataclass
class ModelHandle:
    model: "torch.nn.Module"  # noqa: F821 - torch is imported only by the judges that run a model
    tokenizer: object

    def context(self, max_length: int | None = None) -> int:
        """Tokens a prompt plus its answer may take: the model's positions, capped by model.max_length."""
        positions = int(getattr(self.model.config, "max_position_embeddings", 2048))
        return min(positions, max_length) if max_length else positions


@dataclass
class JudgeContext:
    """What model-based judges need: the policy (it wrote the samples) and its predecessor."""

    policy: Optional[ModelHandle] = None
    reference: Optional[ModelHandle] = None
    template: Optional[str] = None
    seed: int = 0
    batch_size: int = 256
    max_tokens: int = 8192  # padded tokens per scoring forward pass
    max_length: int | None = None  # model.max_length
    progress: bool = True
    verify: Optional[Verify] = None  # the task's check of an answer against the gold (None: no ground truth)
    question: Callable[[str], str] = lambda prompt: prompt  # the task's question without its instruction
    ruled_out: Callable[[str], frozenset] = lambda prompt: frozenset()  # judge.shortcut: answers the task rules out
    frozen: Optional[ModelHandle] = None  # judge.frozen: the base model, adapters off
    frozen_template: Optional[str] = None  # judge.correct_template, for the frozen judge
    inverse: Optional[Callable[[str, str], list]] = None  # judge.inverse: the task's inverse problems
    extract: Optional[Callable[[str], Optional[str]]] = None  # judge.inverse: the task's reading of an answer
    _scores: dict = field(default_factory=dict)

    def scores(self, which: str, samples: pd.DataFrame):
        """Log-prob scores of every sample under `policy` or `reference` (computed once)."""
        if which not in self._scores:
            from self_improve.engines.hf import score

            handle = getattr(self, which)
            if handle is None:
                raise ValueError(f"this judge needs the {which} model")
            self._scores[which] = score(handle.model, handle.tokenizer, list(samples["prompt"]),
                                        list(samples["response"]), batch_size=self.batch_size,
                                        desc=f"score ({which})", progress=self.progress,
                                        max_tokens=self.max_tokens)
        return self._scores[which]


def template_path(params, key: str | None = None) -> Path:
    """The judge's prompt file (judge.template, or judge.correct_template for mode yes_logprob):
    the user's file, or the packaged template of that name."""
    if key is None:
        key = "correct_template" if params.judge.mode == JudgeMode.yes_logprob else "template"
    return templates.resolve(getattr(params.judge, key))


def category(c) -> Optional[str]:
    """A sample's category as a task's check takes it (None for a missing one)."""
    return c if isinstance(c, str) else None
