"""Sampling backends behind one interface: batched `transformers` (hf) and vLLM.

`sample.backend: auto` takes vLLM when it is installed and a CUDA GPU is visible, else hf. vLLM
is imported only when it is used (it is the optional `gpu` extra). It loads a plain HF directory:
an iteration stored as an adapter chain (or a base record) is merged once per stage into a
temporary standalone copy (the same code as `stages.export`). Both engines get the same prompt
token ids from the model's chat format and stop on the same ids, and both return `Generations`
(texts and truncation), so the stages write the same schema whichever engine ran.
"""

from __future__ import annotations

import importlib.util
import logging
import tempfile
from pathlib import Path
from typing import Protocol

import torch

from .chat import ChatFormat
from .config import ModelConfig, SampleBackend, SampleConfig, SecurityConfig
from .errors import PipelineError
from .generation import Generations, SamplingSpec, chat_format, generate
from .models import BASE_FILE, CHAIN_FILE, check_model_dir, load_model

log = logging.getLogger(__name__)


class Sampler(Protocol):
    backend: str

    def generate(
        self, prompts: list[str], spec: SamplingSpec, seed: int, desc: str = "generate", progress: bool = True
    ) -> Generations:
        """`spec.n` responses for each prompt, in prompt order."""
        ...


class HFSampler:
    backend = "hf"

    def __init__(self, model: torch.nn.Module, tokenizer):
        self.model, self.tokenizer = model, tokenizer
        self.chat = chat_format(model, tokenizer)

    def generate(self, prompts, spec, seed, desc="generate", progress=True):
        return generate(self.model, self.tokenizer, prompts, spec, seed, desc=desc, progress=progress,
                        chat=self.chat)


class VLLMSampler:
    backend = "vllm"

    def __init__(self, model_dir: str | Path, gpu_memory_utilization: float,
                 security: SecurityConfig = SecurityConfig(), base: str | Path | None = None,
                 model_cfg: ModelConfig = ModelConfig()):
        reason = vllm_unavailable()
        if reason:
            raise PipelineError(f"sample.backend: vllm cannot run here: {reason}")
        from transformers import AutoTokenizer, GenerationConfig
        from vllm import LLM

        model_dir = Path(model_dir)
        if (model_dir / CHAIN_FILE).is_file() or (model_dir / BASE_FILE).is_file():
            from .models import export_merged

            self._tmp = tempfile.TemporaryDirectory(prefix="self-improve-vllm-")
            merged = Path(self._tmp.name) / "model"
            export_merged(model_dir, base, merged, security, model_cfg)  # merged once per stage
            model_dir = merged
        model_dir = str(check_model_dir(model_dir, security))
        tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=security.trust_remote_code)
        try:
            gen_cfg = GenerationConfig.from_pretrained(model_dir)
        except OSError:
            gen_cfg = None
        self.chat = ChatFormat.of(tokenizer, gen_cfg)
        dtype = "auto" if model_cfg.dtype.value == "auto" else model_cfg.dtype.value
        self.llm = LLM(
            model=model_dir, tokenizer=model_dir, trust_remote_code=security.trust_remote_code,
            load_format="auto" if security.allow_pickle_weights else "safetensors",
            gpu_memory_utilization=gpu_memory_utilization, seed=0, dtype=dtype,
            max_model_len=model_cfg.max_length,
        )

    def generate(self, prompts, spec, seed, desc="generate", progress=True):
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if not prompts:
            return Generations()
        params = SamplingParams(
            n=spec.n,
            temperature=0.0 if spec.greedy else spec.temperature,
            top_p=1.0 if spec.greedy else spec.top_p,
            max_tokens=spec.max_new_tokens,
            seed=seed,
            stop_token_ids=self.chat.stop_ids,
            skip_special_tokens=True,
        )
        inputs = [TokensPrompt(prompt_token_ids=self.chat.prompt_ids(p)) for p in prompts]
        outs = self.llm.generate(inputs, params, use_tqdm=progress)
        texts = [[c.text for c in o.outputs] for o in outs]
        cut = [[c.finish_reason == "length" for c in o.outputs] for o in outs]
        return Generations(texts, cut, sum(len(c.token_ids) for o in outs for c in o.outputs))


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


def open_sampler(model_dir: str | Path, cfg: SampleConfig, security: SecurityConfig = SecurityConfig(),
                 base: str | Path | None = None, model_cfg: ModelConfig = ModelConfig()) -> Sampler:
    """The configured engine, loaded with the model in `model_dir` (on `base` if it is a chain)."""
    backend = resolve_backend(cfg.backend)
    log.info("sampling backend: %s", backend.value)
    if backend == SampleBackend.vllm:
        return VLLMSampler(model_dir, cfg.gpu_memory_utilization, security, base, model_cfg)
    return HFSampler(*load_model(model_dir, security=security, base=base, model_cfg=model_cfg))
