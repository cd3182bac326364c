"""params.yaml `evolve`, `sample` and `evaluate`: which prompts, how responses are drawn, how they are scored."""

from __future__ import annotations

import enum
import re
from typing import Annotated, Optional

from pydantic import AfterValidator, Field, field_validator

from self_improve.config.base import _Section
from self_improve.config.engines import AUTO, backend_name


class EvolveStrategy(str, enum.Enum):
    fixed = "fixed"  # the same prompts every iteration
    eva = "eva"  # keep and mutate the prompts whose self-judged rewards spread the most
    sec = "sec"  # Self-Evolving Curriculum: a bandit over prompt categories


class SecScope(str, enum.Enum):
    fresh = "fresh"  # the curriculum draws the fresh problems only
    mix = "mix"  # it draws the whole mix: which test-time problems train, and the fresh ones


class EvolveConfig(_Section):
    """Which prompts an iteration works on."""

    strategy: EvolveStrategy = EvolveStrategy.eva
    include_ttt: bool = Field(True, description="work on the test-time problems (answers unseen)")
    fresh: int = Field(200, ge=0, description="new procedural problems per iteration")
    keep_top: int = Field(100, ge=0, description="most informative previous problems, mutated")
    rewrites: int = Field(3, ge=0, description="equivalent rewrites of each problem (co_reward)")
    seed_prompts: Optional[int] = Field(
        None, ge=0,
        description="seed-data prompts (with reference answers, for SPIN) per iteration; "
        "None: the algorithm's own (300 for spin, 0 for the others: the algorithm table's seed_prompts)",
    )
    sec_alpha: float = Field(0.5, gt=0, le=1, description="sec: TD(0) step size of the category values")
    sec_temperature: float = Field(0.2, gt=0, description="sec: softmax temperature over category values")
    sec_scope: SecScope = Field(
        SecScope.fresh, description="sec: what the curriculum steers: the `fresh` problems, or the whole `mix` "
        "(as many problems as the test-time set and the fresh ones together, by category from the bandit: a "
        "category's test-time problems first, fresh draws for the rest; procedural tasks and reasoning_gym, whose "
        "draws come from the category's level: a file of the user's poses `fresh` of its test-time problems)")


class Ct2ComputeType(str, enum.Enum):
    float32 = "float32"  # the model itself: greedy outputs equal hf's
    int8 = "int8"  # weights quantised at load time: faster, other outputs than the model's own
    int8_float32 = "int8_float32"


class Ct2Config(_Section):
    compute_type: Ct2ComputeType = Field(
        Ct2ComputeType.float32, description="ct2: precision at load time (the converted model is float32)")
    threads: int = Field(0, ge=0, description="ct2: CPU threads in all (0: every core)")
    batch_size: int = Field(
        64, ge=1, description="ct2: sequences decoded together (batch_size // n prompts); on 2 cores 64 "
        "decoded faster than 128 or 512 (finished rows leave the batch, so large batches buy little)")
    inter_threads: int = Field(
        2, ge=1, description="ct2: batches decoded in parallel, each on threads / inter_threads cores "
        "(small models decode faster as several single-threaded batches)")
    lanes: int = Field(
        1, ge=1, description="ct2 sampling: generators drawing at once, each seeded from (seed, lane) and "
        "given every lanes-th batch in order, on threads / lanes cores each; the samples depend on it "
        "(1: one generator on every thread, the draws independent of the thread count)")


class VllmConfig(_Section):
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs one vLLM engine shards the model over")
    data_parallel_size: int = Field(
        0, ge=0, description="vLLM engines, each on its own tensor_parallel_size GPUs, each sampling its share of "
        "the prompts; 0: as many as the visible GPUs hold"
    )
    url: Optional[str] = Field(
        None, description="a running vLLM server (OpenAI-compatible, e.g. http://gpu-host:8000) serving the "
        "iteration's model: sample through it instead of starting vLLM here")
    server_python: Optional[str] = Field(
        None, description="a Python with vLLM in its own virtualenv (make vllm-env: .venv-vllm/bin/python): "
        "each stage starts `vllm serve` on the model, samples through it and stops it")
    served_model_name: str = Field("policy", min_length=1, description="the model's name on the server")
    server_dtype: str = Field(
        "float32", description="server_python: --dtype of the server; auto: bfloat16 on a CPU with AMX or "
        "avx512_bf16 (the server then takes the CPU's own kernels, not the AVX2 pins), float32 elsewhere")
    offline: bool = Field(
        False, description="server_python: run vLLM's offline engine (vllm.LLM) in a worker process fed over a pipe "
        "instead of `vllm serve`: it starts in seconds, and a call's prompts are queued before its first step, "
        "so a seed gives the same samples with the engine in the worker's own process (of server_args, "
        "--enforce-eager applies)")
    server_args: list[str] = Field(
        default_factory=list, description="server_python: more `vllm serve` flags, e.g. [--enforce-eager] "
        "(no graph compilation: a CPU server starts in about 30 s instead of 90)")
    cpu_kv_cache_gb: int = Field(4, ge=1, description="server_python on a CPU: VLLM_CPU_KVCACHE_SPACE in GB")

    @field_validator("url")
    @classmethod
    def _url(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not re.match(r"https?://[^\s/]+", v):
            raise ValueError(f"an http(s) URL, e.g. http://127.0.0.1:8000; got {v!r}")
        return v


class BstarLabels(str, enum.Enum):
    judge = "judge"  # label-free: a sample is right when its answer is the judge's pseudo-label
    verifier = "verifier"  # the gold answers: the oracle's choice, for comparison


class BstarConfig(_Section):
    """B-STaR (arXiv 2412.17256, hkust-nlp/B-STaR): each iteration's sampling temperature and RAFT
    reward threshold (pairs.sft_min_reward) chosen by the balance score on a dev subset of its
    prompts, instead of fixed."""

    enabled: bool = Field(False, description="bstar: choose sample.temperature and pairs.sft_min_reward "
                          "each iteration by the balance score (the bstar stage)")
    temperatures: list[float] = Field([0.5, 0.7, 0.9, 1.1], min_length=1,
                                      description="bstar: the temperatures tried")
    thresholds: list[float] = Field([0.0, 0.5, 1.0], min_length=1,
                                    description="bstar: the reward thresholds tried (a sample is selected when its "
                                    "reward >= threshold)")
    dev_size: int = Field(32, ge=1, description="bstar: problems of the iteration (each with its rewrites) "
                          "sampled at every temperature: dev_size x k x len(temperatures) samples")
    n_star: int = Field(8, ge=1, description="bstar: distinct right responses a prompt needs for full exploration")
    labels: BstarLabels = Field(BstarLabels.judge, description="bstar: what counts as right: the judge's pseudo-"
                                "labels (label-free) or the verifier's (the oracle's choice)")

    @field_validator("temperatures")
    @classmethod
    def _positive(cls, v: list[float]) -> list[float]:
        if any(t <= 0 for t in v):
            raise ValueError(f"every temperature must be > 0; got {v}")
        return v


class AdaptiveConfig(_Section):
    """Sampling only what a vote needs (ESC, arXiv 2401.10480; Adaptive-Consistency, arXiv 2305.11860):
    each prompt is sampled `window` responses at a time, and its vote group (a prompt, or a problem and its
    rewrites for co_reward) stops once more samples cannot change what the judge makes of it."""

    enabled: bool = Field(False, description="adaptive: sample in windows and stop a vote group once its label "
                          "and pairs are settled, it can have no label, or a whole window agrees (vote judges "
                          "without a model weighing the votes; the others keep k)")
    window: int = Field(4, ge=1, description="adaptive: responses per prompt drawn at a time (k at most)")
    unanimous: bool = Field(True, description="adaptive: also stop a vote group when the last window of each of "
                            "its prompts agrees on one valid answer (ESC's stop; such a prompt never draws the "
                            "dissenting sample its pair would need)")


class SampleConfig(_Section):
    backend: Annotated[str, AfterValidator(backend_name)] = Field(
        AUTO, description="sampling engine (sample and evaluate): an entry of the engine table "
        "(self_improve/config/engines.py: vllm, ct2, hf, or one added with `register_engine`), or auto: vllm with a "
        "GPU, else ct2 when installed and the model converts, else hf")
    k: int = Field(4, ge=1, description="responses per prompt (with adaptive sampling: at most)")
    temperature: float = Field(0.7, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_new_tokens: int = Field(6, ge=1)
    batch_size: int = Field(
        1024, ge=1, description="hf: sequences per generate() call, lowered to fit free memory (ct2 decodes "
        "sample.ct2.batch_size at once; vLLM schedules its own batches)"
    )
    score_tokens: int = Field(
        8192, ge=1, description="padded tokens per scoring forward pass (log-probs), lowered to fit free memory"
    )
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1, description="vllm: share of GPU memory it may take")
    stop_at_answer: bool = Field(
        False, description="stop each response where its first complete final answer ends, in the task's "
        "format (`#### 72`, 'the answer is 72.', a closed \\boxed{}), and cut it there: in sampling and "
        "evaluation, on every engine (vLLM cuts after decoding)")
    adaptive: AdaptiveConfig = AdaptiveConfig()
    vllm: VllmConfig = VllmConfig()
    ct2: Ct2Config = Ct2Config()
    bstar: BstarConfig = BstarConfig()


class EvaluateConfig(_Section):
    k: int = Field(8, ge=0, description="samples per problem for maj@k (0: no maj@k, one sampled pass fewer)")
    support_k: int = Field(8, ge=0, description="it0 only: samples per test-time problem and wording, the base "
                                               "support of the label-free choice (0: not drawn, no signal)")
    temperature: float = Field(0.7, gt=0, description="of the maj@k and base support samples")
    max_new_tokens: int = Field(6, ge=1, description="length of the evaluated answers (greedy and maj@k)")
    batch_size: int = Field(1024, ge=1)
