"""params.yaml `model`, `prepare` and `security`: the base model, the tiny default's warm-up, what loading may run."""

from __future__ import annotations

import enum
from typing import Optional

from pydantic import Field, model_validator

from self_improve.config.base import _Section


class DType(str, enum.Enum):
    auto = "auto"  # bfloat16 on a GPU that supports it, float32 otherwise (CPU)
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


BUILTIN = "builtin"


class ModelConfig(_Section):
    """The base model (it0): the embedded tiny model, or a pretrained Hugging Face causal LM."""

    base: str = Field(
        BUILTIN, min_length=1,
        description="builtin (the tiny model prepare trains), a local HF model directory, a GGUF file, or a hub id",
    )
    revision: Optional[str] = Field(None, min_length=1, description="hub id only: branch, tag or commit")
    gguf_file: Optional[str] = Field(
        None, min_length=1, description="a GGUF checkpoint inside `base` (a directory or hub repo), read by transformers"
    )
    dtype: DType = Field(DType.auto, description="weights and compute: auto = bf16 on a capable GPU, fp32 on CPU")
    max_length: int = Field(2048, ge=8, description="prompt + response tokens; longer training rows are cut")

    @property
    def builtin(self) -> bool:
        return self.base == BUILTIN

    @model_validator(mode="after")
    def _combos(self) -> "ModelConfig":
        if self.builtin and (self.gguf_file or self.revision):
            raise ValueError("model.gguf_file and model.revision need a pretrained model.base, not builtin")
        return self


class ModelShape(_Section):
    """Shape of the tiny Llama-architecture default model."""

    hidden_size: int = Field(128, ge=8)
    num_layers: int = Field(4, ge=1)
    num_heads: int = Field(4, ge=1)
    intermediate_size: int = Field(256, ge=8)

    @model_validator(mode="after")
    def _heads(self) -> "ModelShape":
        if self.hidden_size % self.num_heads:
            raise ValueError("hidden_size must be divisible by num_heads")
        return self


class PrepareConfig(_Section):
    """Supervised warm-up of the base model (iteration 0)."""

    model: ModelShape = ModelShape()
    train_size: int = Field(3000, ge=1, description="SFT problems for the base model")
    steps: int = Field(600, ge=1, description="at most this many steps")
    stop_loss: Optional[float] = Field(
        0.5, gt=0, description="stop once the loss's moving average is below this (None: run all steps)"
    )
    batch_size: int = Field(64, ge=1)
    lr: float = Field(3e-3, gt=0)
    warmup_steps: int = Field(50, ge=0)
    min_lr_ratio: float = Field(0.5, ge=0, le=1, description="cosine floor; >0 keeps the base trainable")


class SecurityConfig(_Section):
    """What loading a model directory may do; both off unless the user turns them on."""

    trust_remote_code: bool = Field(False, description="run Python code shipped inside a model directory")
    allow_pickle_weights: bool = Field(
        False, description="load pickle (*.bin) weights when a model directory has no safetensors"
    )
