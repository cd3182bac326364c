"""params.yaml `train`: the algorithm and its family's section (`dpo`, `grpo`, `nft`), LoRA, batching."""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import AfterValidator, Field, model_validator

from self_improve.config.algorithms import ALGORITHMS, algorithm_of
from self_improve.config.base import _Section
from self_improve.config.tables import named_in


class LoraConfig(_Section):
    enabled: bool = True
    r: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)


class NftOmega(str, enum.Enum):
    one_minus_r = "one_minus_r"  # 1 - r_q (the paper's default)
    sqrt = "sqrt"  # sqrt((1 - r_q) / r_q)
    none = "none"  # 1: every prompt alike


class NftConfig(_Section):
    """train.algorithm nft (arXiv 2505.18116, NVlabs/NFT's defaults)."""

    eps: float = Field(1.0, gt=0, description="nft: floor of the negative proxy (1 - r_q R) / (1 - r_q), "
                       "its gradient kept (the official clamp_negative)")
    neg_weight: float = Field(1.0, ge=0, description="nft: weight of the wrong samples' loss (1: NFT, 0: RFT)")
    omega: NftOmega = Field(NftOmega.one_minus_r, description="nft: prompt weight from r_q, the prompt's rate of right samples")
    threshold: float = Field(0.5, description="nft: a sample is right when its reward >= this, and it is neither "
                             "truncated nor invalid (judge.validity); prompts whose samples all share a label are dropped")


class DpoConfig(_Section):
    """train.algorithm dpo, ipo, spin, cream: the preference family. `beta` is TRL's DPOConfig name
    (algorithm ipo is TRL's loss_type "ipo"); `rpo_alpha` is Iterative RPO's NLL weight (Pang et al.
    2024), averaged per pair, not per token as TRL's `sft` loss term (docs/loop.md)."""

    beta: float = Field(0.1, gt=0, description="dpo family: temperature of the implicit reward (IPO: its tau)")
    rpo_alpha: float = Field(1.0, ge=0, description="dpo/cream/spin: weight of the NLL term on the chosen "
                             "answer (iterative RPO: each pair's token-mean NLL, averaged over pairs; 0: none)")


class GrpoConfig(_Section):
    """train.algorithm grpo, with TRL's GRPOConfig names."""

    epsilon: float = Field(0.2, gt=0, lt=1, description="grpo: ratio clipping")
    beta: float = Field(0.0, ge=0, description="grpo: weight of the KL to the reference (0: off)")


# keys that moved into a family's section: an old params file is told where each went
_MOVED = {"beta": "train.dpo.beta", "nll_weight": "train.dpo.rpo_alpha",
          "clip_eps": "train.grpo.epsilon", "kl_beta": "train.grpo.beta"}


class TrainConfig(_Section):
    algorithm: Annotated[str, AfterValidator(named_in(ALGORITHMS))] = Field(
        "raft", description="the training algorithm: an entry of the algorithm table "
        "(self_improve/config/algorithms.py), built in or added with `register_algorithm` (docs/extending.md)",
    )
    lora: LoraConfig = LoraConfig()
    lr: float = Field(1e-3, gt=0)
    epochs: int = Field(4, ge=1)
    batch_size: int = Field(64, ge=1, description="examples per optimiser step")
    micro_batch_size: Optional[int] = Field(
        None, ge=1, description="examples per forward/backward pass, gradients accumulated to batch_size "
        "(None: the whole batch at once); memory grows with this, not with batch_size",
    )
    gradient_checkpointing: bool = Field(False, description="recompute activations in backward: less memory, slower")
    bf16: Union[bool, Literal["auto"]] = Field(
        False, description="mixed precision (transformers' TrainingArguments.bf16): forward passes autocast to "
        "bfloat16, weights, gradients and optimiser state stay float32. auto: on for a GPU with bfloat16 and a "
        "CPU with AMX or avx512_bf16 (the stage lifts the AVX2 pin of oneDNN for itself before its first matmul), "
        "float32 elsewhere; without bfloat16 instructions true is emulated, slower than float32",
    )
    dpo: DpoConfig = DpoConfig()
    grpo: GrpoConfig = GrpoConfig()
    nft: NftConfig = NftConfig()
    max_grad_norm: float = Field(1.0, gt=0)
    checkpoint_every: int = Field(50, ge=0, description="steps between resumable checkpoints (0: none)")

    @property
    def entry(self):
        """This algorithm's entry of the algorithm table (self_improve/config/algorithms.py)."""
        return algorithm_of(self.algorithm)

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, raw: Any) -> Any:
        if isinstance(raw, dict):
            if moved := [f"train.{k} is now {v}" for k, v in _MOVED.items() if k in raw]:
                raise ValueError("; ".join(moved))
        return raw

    @property
    def micro(self) -> int:
        return min(self.micro_batch_size or self.batch_size, self.batch_size)
