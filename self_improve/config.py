"""Typed, validated params.yaml.

One frozen pydantic model per section. Unknown keys are refused by name, closed choices are
enums, and every stage validates the whole file before it writes anything, so a typo anywhere
stops the loop at once with one line naming the key.
"""

from __future__ import annotations

import enum
import re
from pathlib import Path
from typing import Any, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from self_improve.errors import ConfigError


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, use_enum_values=False)


class TaskName(str, enum.Enum):
    arithmetic = "arithmetic"  # procedural two-digit addition, verifiable (the tiny model's task)
    word_math = "word_math"  # procedural grade-school word problems, 1-3 steps (real models)
    math_file = "math_file"  # the user's GSM8K- or MATH-style file (`prompt_file`, `columns`)
    instructions = "instructions"  # the user's open prompts (`prompt_file`); answers optional
    prompts = "prompts"  # the earlier name of `instructions`
    reasoning_gym = "reasoning_gym"  # reasoning-gym's procedural datasets (`datasets`), graded by their scorers


WORD_OPS = ("add", "sub", "mul", "div")


class OnError(str, enum.Enum):
    fail = "raise"  # the first bad row stops prepare with its file, row and column
    skip = "skip"  # bad rows are dropped and counted by reason


class GymDataset(_Section):
    """One reasoning-gym dataset of task.datasets: its name, its own config, its share, its category."""

    name: str = Field(min_length=1, description="a reasoning-gym dataset, e.g. chain_sum, basic_arithmetic")
    config: dict[str, Any] = Field(default_factory=dict, description="the dataset's own config (difficulty)")
    weight: float = Field(1.0, gt=0, description="its share of every set, relative to the other entries")
    label: Optional[str] = Field(None, min_length=1, description="its category (default: the name); "
                                 "entries of one dataset at other settings are levels")

    @property
    def category(self) -> str:
        return self.label or self.name


class TaskConfig(_Section):
    """The task (self_improve/tasks/): procedural, or the user's file; and the evaluation sets."""

    name: TaskName = TaskName.arithmetic
    prompt_file: str = Field(
        "data/inputs/instructions.jsonl", min_length=1,
        description="instructions / math_file: JSONL or parquet with `prompt`, optional `answer` and `category`",
    )
    columns: Optional[dict[str, str]] = Field(
        None, description="instructions / math_file: the file's column for `prompt`, `answer`, `category`, "
        "e.g. {prompt: question, answer: answer}; other columns are then ignored",
    )
    heldout_file: Optional[str] = Field(
        None, min_length=1, description="instructions / math_file: a separate held-out file (same columns); "
        "None: hold out `heldout_fraction` of prompt_file",
    )
    instruction: Optional[str] = Field(
        None, min_length=1, description="word_math / math_file: a line added after every question, "
        "e.g. how to state the answer",
    )
    levels: list[str] = Field(
        ["add", "sub", "mul"], min_length=1,
        description="word_math: the chains of operations (add, sub, mul, div joined by +, 1-3 steps) "
        "that problems are drawn from; each is a category",
    )
    max_number: int = Field(10, ge=2, description="word_math: largest number a problem starts with or adds")
    datasets: list[GymDataset] = Field(
        default_factory=list, description="reasoning_gym: the datasets drawn from (name, config, weight, label)")
    on_error: OnError = Field(
        OnError.fail, description="prompts: a bad row raises, or is skipped and counted"
    )
    max_prompt_chars: int = Field(2000, ge=1, description="prompts: longer prompts are bad rows")
    heldout_fraction: float = Field(
        0.25, gt=0, lt=1, description="prompts: share of the file held out for evaluation (win rate)"
    )
    min_operand: int = Field(10, ge=0)
    max_operand: int = Field(99, ge=1)
    heldout_size: int = Field(500, ge=1, description="held-out problems, disjoint from all training")
    ttt_size: int = Field(1000, ge=1, description="test-time problems: prompts trainable, answers measured")

    @model_validator(mode="after")
    def _range(self) -> "TaskConfig":
        if self.max_operand <= self.min_operand:
            raise ValueError("max_operand must be greater than min_operand")
        return self

    @field_validator("datasets")
    @classmethod
    def _datasets(cls, v: list[GymDataset]) -> list[GymDataset]:
        cats = [d.category for d in v]
        if len(set(cats)) != len(cats):
            raise ValueError("two entries share a category: give each entry of one dataset its own label")
        return v

    @field_validator("levels")
    @classmethod
    def _levels(cls, v: list[str]) -> list[str]:
        for level in v:
            ops = level.split("+")
            if not 1 <= len(ops) <= 3 or any(op not in WORD_OPS for op in ops):
                raise ValueError(f"{level!r} is not a chain of 1 to 3 of {', '.join(WORD_OPS)} joined by +")
        if len(set(v)) != len(v):
            raise ValueError("a level is listed twice")
        return v

    @field_validator("columns")
    @classmethod
    def _columns(cls, v: Optional[dict[str, str]]) -> Optional[dict[str, str]]:
        if v is None:
            return v
        for key, col in v.items():
            if key not in ("prompt", "answer", "category"):
                raise ValueError(f"{key!r} is not one of prompt, answer, category")
            if not isinstance(col, str) or not col:
                raise ValueError(f"{key}: the file's column name must be a non-empty string")
        if "prompt" not in v:
            raise ValueError("the mapping needs `prompt` (the file's question column)")
        return v

    @property
    def kind(self) -> TaskName:
        """The task's name, with the earlier name `prompts` read as `instructions`."""
        return TaskName.instructions if self.name == TaskName.prompts else self.name


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


class EvolveStrategy(str, enum.Enum):
    fixed = "fixed"  # the same prompts every iteration
    eva = "eva"  # keep and mutate the prompts whose self-judged rewards spread the most
    sec = "sec"  # Self-Evolving Curriculum: a bandit over prompt categories


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
        "None: 300 when train.algorithm is spin, else 0",
    )
    sec_alpha: float = Field(0.5, gt=0, le=1, description="sec: TD(0) step size of the category values")
    sec_temperature: float = Field(0.2, gt=0, description="sec: softmax temperature over category values")


class SampleBackend(str, enum.Enum):
    auto = "auto"  # vllm with a GPU, else ct2 when installed and the model converts, else hf
    hf = "hf"  # batched `transformers` generation (CPU or GPU)
    ct2 = "ct2"  # CTranslate2 on the iteration's converted model (data/itN/engine)
    vllm = "vllm"  # the `gpu` extra; GPU only


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
    server_dtype: str = Field("float32", description="server_python: --dtype of the server (float32 on a CPU)")
    cpu_kv_cache_gb: int = Field(4, ge=1, description="server_python on a CPU: VLLM_CPU_KVCACHE_SPACE in GB")

    @field_validator("url")
    @classmethod
    def _url(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not re.match(r"https?://[^\s/]+", v):
            raise ValueError(f"an http(s) URL, e.g. http://127.0.0.1:8000; got {v!r}")
        return v


class SampleConfig(_Section):
    backend: SampleBackend = Field(SampleBackend.auto, description="sampling engine (sample and evaluate)")
    k: int = Field(4, ge=1, description="responses per prompt")
    temperature: float = Field(0.7, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_new_tokens: int = Field(6, ge=1)
    batch_size: int = Field(
        1024, ge=1, description="hf: sequences per generate() call, lowered to fit free memory"
    )
    score_tokens: int = Field(
        8192, ge=1, description="padded tokens per scoring forward pass (log-probs), lowered to fit free memory"
    )
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1, description="vllm: share of GPU memory it may take")
    vllm: VllmConfig = VllmConfig()
    ct2: Ct2Config = Ct2Config()


class JudgeMethod(str, enum.Enum):
    majority_vote = "majority_vote"  # TTRL
    co_reward = "co_reward"  # agreement with the pooled vote of equivalent rewrites
    llm_judge = "llm_judge"  # Self-Rewarding LMs: the model scores with the 5-point rubric
    self_certainty = "self_certainty"  # mean KL(Uniform || p) over the response tokens
    implicit_reward = "implicit_reward"  # sum log pi_current - sum log pi_reference (CREAM)
    vote_share = "vote_share"  # ScPO: a sample's reward is the share of the votes its answer got
    verifier = "verifier"  # ground truth: oracle baseline

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
    template: str = Field(
        "self_improve/templates/judge_rubric.txt", min_length=1, description="llm_judge: the rubric prompt"
    )
    judgments: int = Field(3, ge=1, description="llm_judge: judgments per response, averaged")
    temperature: float = Field(0.7, gt=0, description="llm_judge: sampling temperature of the judge")
    max_new_tokens: int = Field(48, ge=1, description="llm_judge: length of the judge's answer")
    max_prompts: Optional[int] = Field(
        32, ge=1, description="llm_judge mode generate: prompts judged per iteration (seeded choice; None: all)"
    )

    @model_validator(mode="after")
    def _vote_options(self) -> "JudgeConfig":
        votes = (JudgeMethod.majority_vote, JudgeMethod.co_reward, JudgeMethod.vote_share)
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
    sft_min_reward: float = Field(1.0, description="RAFT keeps best samples with at least this reward")
    penalty: float = Field(1.0, ge=0, description="grpo: the advantage -penalty of every sample of a prompt "
                           "judge.low_consensus penalise marked (RESTRAIN's negative rollout penalty)")


class Algorithm(str, enum.Enum):
    raft = "raft"  # fine-tune on the best-judged samples (RAFT / ReST / STaR)
    dpo = "dpo"  # sigmoid DPO, optional NLL on the chosen answer (iterative RPO)
    ipo = "ipo"  # squared loss towards a margin of 1/(2 beta)
    spin = "spin"  # DPO form: the seed data's reference answer over the model's own sample
    cream = "cream"  # DPO regularised by the judge's consistency across iterations
    grpo = "grpo"  # group-relative advantages with a clipped ratio
    nft = "nft"  # negative-aware fine-tuning: right samples' likelihood up, wrong ones' via the implicit negative policy


PREFERENCE = (Algorithm.dpo, Algorithm.ipo, Algorithm.spin, Algorithm.cream)


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


class TrainConfig(_Section):
    algorithm: Algorithm = Algorithm.raft
    lora: LoraConfig = LoraConfig()
    lr: float = Field(1e-3, gt=0)
    epochs: int = Field(4, ge=1)
    batch_size: int = Field(64, ge=1, description="examples per optimiser step")
    micro_batch_size: Optional[int] = Field(
        None, ge=1, description="examples per forward/backward pass, gradients accumulated to batch_size "
        "(None: the whole batch at once); memory grows with this, not with batch_size",
    )
    gradient_checkpointing: bool = Field(False, description="recompute activations in backward: less memory, slower")
    beta: float = Field(0.1, gt=0, description="DPO temperature")
    nll_weight: float = Field(1.0, ge=0, description="dpo/cream/spin: weight of the NLL term on the chosen answer")
    clip_eps: float = Field(0.2, gt=0, lt=1, description="grpo: ratio clipping")
    kl_beta: float = Field(0.0, ge=0, description="grpo: weight of the KL to the reference (0: off)")
    nft: NftConfig = NftConfig()
    max_grad_norm: float = Field(1.0, gt=0)
    checkpoint_every: int = Field(50, ge=0, description="steps between resumable checkpoints (0: none)")

    @property
    def micro(self) -> int:
        return min(self.micro_batch_size or self.batch_size, self.batch_size)


class EvaluateConfig(_Section):
    k: int = Field(8, ge=0, description="samples per problem for maj@k (0: no maj@k, one sampled pass fewer)")
    temperature: float = Field(0.7, gt=0)
    max_new_tokens: int = Field(6, ge=1, description="length of the evaluated answers (greedy and maj@k)")
    batch_size: int = Field(1024, ge=1)


class SecurityConfig(_Section):
    """What loading a model directory may do; both off unless the user turns them on."""

    trust_remote_code: bool = Field(False, description="run Python code shipped inside a model directory")
    allow_pickle_weights: bool = Field(
        False, description="load pickle (*.bin) weights when a model directory has no safetensors"
    )


class TrackingConfig(_Section):
    enabled: bool = True
    experiment: str = Field("self-improve", min_length=1)


class IterationLink(_Section):
    prev: str  # the model this iteration starts from
    # the model before that: the reference of implicit_reward and CREAM's consistency. For it1
    # the policy is the base itself, so its reference is the base before its warm-up (`init`).
    ref: str

    @field_validator("prev", "ref")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _IT.fullmatch(v) and v != INIT:
            raise ValueError(f"iteration names look like it0, it1, ...; got {v!r}")
        return v


_IT = re.compile(r"it(\d+)")
INIT = "init"  # the base model as initialised, before prepare's warm-up


class Params(_Section):
    seed: int = Field(0, ge=0)
    model: ModelConfig = ModelConfig()
    task: TaskConfig = TaskConfig()
    prepare: PrepareConfig = PrepareConfig()
    evolve: EvolveConfig = EvolveConfig()
    sample: SampleConfig = SampleConfig()
    judge: JudgeConfig = JudgeConfig()
    pairs: PairsConfig = PairsConfig()
    train: TrainConfig = TrainConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    tracking: TrackingConfig = TrackingConfig()
    security: SecurityConfig = SecurityConfig()
    loop: dict[str, IterationLink]

    @model_validator(mode="after")
    def _chain(self) -> "Params":
        if not self.loop:
            raise ValueError("loop: at least one iteration is needed")
        seen = {"it0"}
        for name, link in self.loop.items():
            if not _IT.fullmatch(name) or name == "it0":
                raise ValueError(f"loop.{name}: iteration names are it1, it2, ... (it0 is the base model)")
            if link.prev not in seen:
                raise ValueError(f"loop.{name}.prev: {link.prev!r} is not it0 or an earlier iteration")
            if int(name[2:]) != int(link.prev[2:]) + 1:
                raise ValueError(f"loop.{name}.prev: expected it{int(name[2:]) - 1}, got {link.prev}")
            if link.prev == INIT:
                raise ValueError(f"loop.{name}.prev: {INIT!r} is only a reference, not a starting model")
            want = INIT if link.prev == "it0" else self.loop[link.prev].prev
            if link.ref != want:
                raise ValueError(f"loop.{name}.ref: expected {want} (the model before {link.prev}), got {link.ref}")
            seen.add(name)
        if self.task.kind == TaskName.math_file and self.task.columns and "answer" not in self.task.columns:
            raise ValueError("task.columns: math_file needs `answer` (the file's gold answer column)")
        if self.train.algorithm == Algorithm.spin and self.evolve.seed_prompts == 0:
            raise ValueError("train.algorithm spin needs evolve.seed_prompts > 0: SPIN pairs the seed "
                             "data's reference answers with the model's own samples")
        return self

    def seed_prompts(self) -> int:
        """Seed-data prompts per iteration (evolve.seed_prompts, or its default)."""
        if self.evolve.seed_prompts is not None:
            return self.evolve.seed_prompts
        return 300 if self.train.algorithm == Algorithm.spin else 0

    def min_share(self, iteration: str) -> float:
        """judge.min_share at `iteration`: risen by min_share_step for every iteration after it1."""
        step = max(0, self.iteration_index(iteration) - 1)
        return min(1.0, self.judge.min_share + step * self.judge.min_share_step)

    def iteration_index(self, name: str) -> int:
        if name != "it0" and name not in self.loop:
            raise ConfigError(f"unknown iteration {name!r}; params.yaml loop has {list(self.loop)}")
        return int(name[2:])


def _describe(err: ValidationError, source: str) -> str:
    first = err.errors()[0]
    key = ".".join(str(p) for p in first["loc"]) or "<root>"
    kind = first["type"]
    if kind == "extra_forbidden":
        msg = "unknown key"
    elif kind == "missing":
        msg = "missing key"
    else:
        msg = first["msg"].removeprefix("Value error, ")
        if kind == "value_error" and not first["loc"]:
            return f"{source}: {msg}"  # a cross-key check names its keys itself
        if "input" in first and kind not in ("model_type", "dict_type", "value_error"):
            msg += f" (got {first['input']!r})"
    more = f" (+{len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    return f"{source}: {key}: {msg}{more}"


def parse_params(raw: Any, source: str = "params.yaml") -> Params:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping of sections, got {type(raw).__name__}")
    try:
        return Params.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_describe(err, source)) from None


def load_params(path: str | Path = "params.yaml") -> Params:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}".replace("\n", " ")) from None
    return parse_params(raw, str(path))


def flatten_tree(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A nested mapping as dotted keys, e.g. {'train': {'lora': {'r': 8}}} -> {'train.lora.r': 8}: the
    one flattener of params trees (recipes, overrides, provenance, MLflow)."""
    if isinstance(tree, dict) and tree:
        return {k: v for key, sub in tree.items() for k, v in flatten_tree(sub, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): tree} if prefix else {}


def flatten(params: Params) -> dict[str, Any]:
    """params as dotted keys, e.g. {'train.lora.r': 16}, for MLflow and provenance."""
    return {k: v for k, v in flatten_tree(params.model_dump(mode="json")).items() if v != {}}  # no empty sections
