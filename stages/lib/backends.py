"""Sampling backends behind one interface: batched `transformers` (hf) and vLLM.

`sample.backend: auto` takes vLLM when it is installed and a CUDA GPU is visible, else hf. vLLM
is imported only when it is used (it is the optional `gpu` extra), loads the iteration's merged
model directory like any HF model (safetensors only, no remote code), and returns the same
`list[list[str]]` as hf, so the stages write the same schema whichever engine ran.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Protocol

import torch

from .config import SampleBackend, SampleConfig, SecurityConfig
from .errors import PipelineError
from .generation import SamplingSpec, generate
from .models import check_model_dir, load_model

log = logging.getLogger(__name__)


class Sampler(Protocol):
    backend: str

    def generate(
        self, prompts: list[str], spec: SamplingSpec, seed: int, desc: str = "generate", progress: bool = True
    ) -> list[list[str]]:
        """`spec.n` responses for each prompt, in prompt order."""
        ...


class HFSampler:
    backend = "hf"

    def __init__(self, model: torch.nn.Module, tokenizer):
        self.model, self.tokenizer = model, tokenizer

    def generate(self, prompts, spec, seed, desc="generate", progress=True):
        return generate(self.model, self.tokenizer, prompts, spec, seed, desc=desc, progress=progress)


class VLLMSampler:
    backend = "vllm"

    def __init__(self, model_dir: str | Path, gpu_memory_utilization: float,
                 security: SecurityConfig = SecurityConfig()):
        reason = vllm_unavailable()
        if reason:
            raise PipelineError(f"sample.backend: vllm cannot run here: {reason}")
        from vllm import LLM

        model_dir = str(check_model_dir(model_dir, security))
        self.llm = LLM(
            model=model_dir, tokenizer=model_dir, trust_remote_code=security.trust_remote_code,
            load_format="auto" if security.allow_pickle_weights else "safetensors",
            gpu_memory_utilization=gpu_memory_utilization, seed=0,
        )

    def generate(self, prompts, spec, seed, desc="generate", progress=True):
        from vllm import SamplingParams

        if not prompts:
            return []
        params = SamplingParams(
            n=spec.n,
            temperature=0.0 if spec.greedy else spec.temperature,
            top_p=1.0 if spec.greedy else spec.top_p,
            max_tokens=spec.max_new_tokens,
            seed=seed,
            skip_special_tokens=True,
        )
        outs = self.llm.generate(prompts, params, use_tqdm=progress)
        return [[c.text for c in o.outputs] for o in outs]


def vllm_unavailable() -> str | None:
    """Why vLLM cannot run here, or None when it can."""
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed (pip install -e '.[gpu]' on a GPU machine)"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible"
    return None


def resolve_backend(requested: SampleBackend) -> SampleBackend:
    if requested == SampleBackend.auto:
        return SampleBackend.hf if vllm_unavailable() else SampleBackend.vllm
    return requested


def open_sampler(model_dir: str | Path, cfg: SampleConfig, security: SecurityConfig = SecurityConfig()) -> Sampler:
    """The configured engine, loaded with the model in `model_dir`."""
    backend = resolve_backend(cfg.backend)
    log.info("sampling backend: %s", backend.value)
    if backend == SampleBackend.vllm:
        return VLLMSampler(model_dir, cfg.gpu_memory_utilization, security)
    return HFSampler(*load_model(model_dir, security=security))
