"""Sampling backends behind one interface: batched `transformers` (hf), CTranslate2 (ct2) and vLLM.

`sample.backend: auto` takes vLLM when it is installed and a CUDA GPU is visible, else CTranslate2
when it is installed (self_improve/engines/ct2.py: the CPU engine, on the iteration's converted model), else
hf. vLLM is imported only when it is used (it is the optional `gpu` extra). It loads a plain HF
directory: an iteration stored as an adapter chain (or a base record) is merged once per stage
into a temporary standalone copy (the same code as `self_improve.models.export`). Every engine gets the same
prompt token ids from the model's chat format and stops on the same ids, and each returns
`Generations` (texts and truncation), so the stages write the same schema whichever engine ran.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Protocol

import torch

from self_improve.chat import ChatFormat
from self_improve.config import AUTO, ENGINES, ModelConfig, SampleConfig, SecurityConfig, VllmConfig
from self_improve.config.tables import resolve
from self_improve.engines.ct2 import ct2_unavailable, open_ct2
from self_improve.engines.engine import read_engine, resolve_backend, vllm_unavailable  # noqa: F401 (re-exported)
from self_improve.engines.hf import Generations, SamplingSpec, chat_format, finish, generate
from self_improve.errors import ConfigError, PipelineError
from self_improve.models.loading import check_model_dir, load_model, merged_copy

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
    """vLLM on the visible GPUs: one engine sharding the model over `tensor_parallel_size` GPUs, or,
    for data parallelism, `data_parallel_size` such engines, each in a process of its own that sees
    only its GPUs (CUDA_VISIBLE_DEVICES) and samples a contiguous share of the prompts. Each prompt
    carries its own seed (prompt_seeds), so its samples do not depend on which engine drew them."""

    backend = "vllm"

    def __init__(self, model_dir: str | Path, gpu_memory_utilization: float,
                 security: SecurityConfig = SecurityConfig(), base: str | Path | None = None,
                 model_cfg: ModelConfig = ModelConfig(), vllm: VllmConfig = VllmConfig()):
        reason = vllm_unavailable()
        if reason:
            raise PipelineError(f"sample.backend: vllm cannot run here: {reason}")
        groups = engine_plan(visible_gpus(), vllm.tensor_parallel_size, vllm.data_parallel_size)
        model_dir, self._tmp = merged_copy(model_dir, base, security, model_cfg)  # merged once per stage
        model_dir = str(check_model_dir(model_dir, security))
        self.chat = ChatFormat.from_dir(model_dir, security.trust_remote_code)
        dtype = "auto" if model_cfg.dtype.value == "auto" else model_cfg.dtype.value
        llm_kwargs = {
            "model": model_dir, "tokenizer": model_dir, "trust_remote_code": security.trust_remote_code,
            "load_format": "auto" if security.allow_pickle_weights else "safetensors",
            "gpu_memory_utilization": gpu_memory_utilization, "seed": 0, "dtype": dtype,
            "max_model_len": model_cfg.max_length, "tensor_parallel_size": vllm.tensor_parallel_size,
        }
        log.info("vllm: %d engine(s) on GPUs %s", len(groups), groups)
        if len(groups) == 1:
            from vllm import LLM

            self.llm, self.engines = LLM(**llm_kwargs), []
        else:
            self.llm, self.engines = None, [_Engine(group, llm_kwargs) for group in groups]
            for engine in self.engines:
                engine.wait_ready()

    def generate(self, prompts, spec, seed, desc="generate", progress=True):
        if not prompts:
            return Generations()
        params = {
            "n": spec.n,
            "temperature": 0.0 if spec.greedy else spec.temperature,
            "top_p": 1.0 if spec.greedy else spec.top_p,
            "max_tokens": spec.max_new_tokens,
            "stop_token_ids": self.chat.stop_ids,
            "skip_special_tokens": True,
        }
        ids = [self.chat.prompt_ids(p) for p in prompts]
        if not spec.greedy:  # a seed per prompt: with one for all, sample j of every prompt drew alike
            from self_improve.engines.vllm_server import prompt_seeds

            params["seeds"] = prompt_seeds(seed, len(ids), spec.n)
        if self.llm is not None:
            texts, cut, tokens = _vllm_generate(self.llm, ids, params, progress)
            return _answer_cut(Generations(texts, cut, tokens), spec)
        shares = split_evenly(list(range(len(ids))), len(self.engines))
        busy = [(e, share) for e, share in zip(self.engines, shares) if share]
        for k, (engine, share) in enumerate(busy):  # each prompt keeps its seed whichever engine draws it
            seeds = [params["seeds"][i] for i in share] if "seeds" in params else None
            engine.send([ids[i] for i in share], {**params, "seeds": seeds}, progress and k == 0)
        texts, cut, tokens = [], [], 0
        for engine, _ in busy:  # in prompt order: engine k holds the k-th contiguous share
            t, c, n = engine.receive()
            texts += t
            cut += c
            tokens += n
        return _answer_cut(Generations(texts, cut, tokens), spec)

    def close(self) -> None:
        for engine in getattr(self, "engines", []):  # also after a failed __init__
            engine.close()
        self.engines = []

    def __del__(self):
        self.close()


def _answer_cut(gens: Generations, spec: SamplingSpec) -> Generations:
    """vLLM has no stop where an answer ends: the answer stop (spec.stop_at) cuts its texts after decoding,
    so they equal the other engines' (the tokens past the answer are spent, not kept)."""
    if spec.stop_at is None:
        return gens
    texts, cut = [], []
    for rs, cs in zip(gens, gens.truncated):
        done = [finish(r, spec.stop_at) for r in rs]
        texts.append([t for t, _ in done])
        cut.append([c and not answered for c, (_, answered) in zip(cs, done)])
    return Generations(texts, cut, gens.new_tokens)


def _vllm_generate(llm, ids: list[list[int]], params: dict, progress: bool):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = dict(params)
    seeds = params.pop("seeds", None) or [None] * len(ids)
    outs = llm.generate([TokensPrompt(prompt_token_ids=i) for i in ids],
                        [SamplingParams(**params, seed=s) for s in seeds], use_tqdm=progress)
    texts = [[c.text for c in o.outputs] for o in outs]
    cut = [[c.finish_reason == "length" for c in o.outputs] for o in outs]
    return texts, cut, sum(len(c.token_ids) for o in outs for c in o.outputs)


def visible_gpus() -> list[str]:
    """The CUDA devices this process may use, as CUDA_VISIBLE_DEVICES names them."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None and env.strip():
        return [d.strip() for d in env.split(",") if d.strip()]
    return [str(i) for i in range(torch.cuda.device_count())]


def engine_plan(gpus: list[str], tensor_parallel_size: int, data_parallel_size: int) -> list[list[str]]:
    """The GPUs of each vLLM engine: `data_parallel_size` groups of `tensor_parallel_size` (0: as many
    groups as the GPUs hold)."""
    tp = tensor_parallel_size
    dp = data_parallel_size or len(gpus) // tp
    if dp < 1 or tp * dp > len(gpus):
        raise ConfigError(
            f"sample.vllm: {max(dp, 1)} engine(s) x tensor_parallel_size {tp} need {tp * max(dp, 1)} GPUs; "
            f"{len(gpus)} visible ({','.join(gpus) or 'none'})")
    return [gpus[k * tp:(k + 1) * tp] for k in range(dp)]


def split_evenly(items: list, parts: int) -> list[list]:
    """`items` in `parts` contiguous runs whose lengths differ by at most one, in order."""
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for k in range(parts):
        end = start + size + (1 if k < extra else 0)
        out.append(items[start:end])
        start = end
    return out


class _Engine:
    """One vLLM engine in a spawned process that sees only its GPUs."""

    def __init__(self, gpus: list[str], llm_kwargs: dict):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")  # CUDA cannot be shared with a forked child
        self.gpus = gpus
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_engine_main, args=(child, ",".join(gpus), llm_kwargs), daemon=True)
        self.proc.start()
        child.close()

    def _reply(self):
        try:
            status, value = self.conn.recv()
        except EOFError:
            raise PipelineError(f"vllm engine on GPUs {self.gpus} exited (code {self.proc.exitcode})") from None
        if status == "error":
            raise PipelineError(f"vllm engine on GPUs {self.gpus}: {value}")
        return value

    def wait_ready(self) -> None:
        self._reply()

    def send(self, ids, params, progress) -> None:
        self.conn.send((ids, params, progress))

    def receive(self):
        return self._reply()

    def close(self) -> None:
        if self.proc.is_alive():
            try:
                self.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            self.proc.join(timeout=60)
            if self.proc.is_alive():
                self.proc.terminate()


def _engine_main(conn, gpus: str, llm_kwargs: dict) -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = gpus  # before vLLM or torch initialise CUDA in this process
    try:
        from vllm import LLM

        llm = LLM(**llm_kwargs)
        conn.send(("ok", None))
        while (job := conn.recv()) is not None:
            ids, params, progress = job
            conn.send(("ok", _vllm_generate(llm, ids, params, progress)))
    except Exception as err:  # noqa: BLE001 - the parent raises it, naming the engine
        conn.send(("error", f"{type(err).__name__}: {err}"))


def close_sampler(sampler) -> None:
    """Stop what `sampler` started (a vLLM server and its engine, vLLM engine processes) now, not at the
    process's exit: the plain runner runs a loop's stages in one process, and a server left to the exit
    kept 2.5 GB per stage until a loop's memory ran out."""
    close = getattr(sampler, "close", None)
    if close is not None:
        close()


def open_sampler(model_dir: str | Path, cfg: SampleConfig, security: SecurityConfig = SecurityConfig(),
                 base: str | Path | None = None, model_cfg: ModelConfig = ModelConfig(),
                 engine: str | Path | None = None) -> Sampler:
    """The configured engine (an entry of the engine table, self_improve/config/engines.py), loaded
    with the model in `model_dir` (on `base` if it is a chain).

    `engine`: the model's engine dir (the `engine` stage's output, self_improve/engines/engine.py), whose
    record names the engine `auto` resolved to (hf where the model was unconvertible); CTranslate2 runs
    its conversion. Without one, `auto` is resolved here and ct2 converts now."""
    record = read_engine(engine) if engine is not None and cfg.backend != "hf" else {}
    if record:  # `auto` was resolved once, by the engine stage: its record says which engine (hf needs none)
        backend = record["engine"]
        if cfg.backend not in (AUTO, backend):
            raise PipelineError(f"{engine}: made for {backend}, not {cfg.backend}; rerun its engine stage")
        if record.get("fallback"):
            log.info("sampling backend: hf (%s)", record["fallback"])
    else:
        backend = resolve_backend(cfg.backend)
    log.info("sampling backend: %s", backend)
    return resolve(ENGINES.of(backend).open)(engine if record else None, model_dir, base, cfg, security, model_cfg)


def open_hf(engine_dir, model_dir, base, cfg: SampleConfig, security: SecurityConfig, model_cfg: ModelConfig):
    """hf's `open`: the model loaded with `transformers` (its adapters applied)."""
    return HFSampler(*load_model(model_dir, security=security, base=base, model_cfg=model_cfg))


def open_ct2_sampler(engine_dir, model_dir, base, cfg: SampleConfig, security: SecurityConfig,
                     model_cfg: ModelConfig):
    """ct2's `open`: the engine dir's conversion (or one made now, outside the pipeline)."""
    reason = ct2_unavailable()
    if reason:
        raise PipelineError(f"sample.backend: ct2 cannot run here: {reason}")
    return open_ct2(engine_dir, model_dir, base, cfg.ct2, security, model_cfg)


def open_vllm(engine_dir, model_dir, base, cfg: SampleConfig, security: SecurityConfig, model_cfg: ModelConfig):
    """vLLM's `open`: in-process on the engine dir's merged copy, or through a server (`sample.vllm`)."""
    record = read_engine(engine_dir) if engine_dir is not None else {}
    merged = Path(engine_dir) / record["model"] if record.get("model") else None
    if cfg.vllm.url or cfg.vllm.server_python:
        return _server_sampler(merged, model_dir, base, cfg.vllm, security, model_cfg)
    return VLLMSampler(merged or model_dir, cfg.gpu_memory_utilization, security, base, model_cfg, cfg.vllm)


def _server_sampler(merged: Path | None, model_dir, base, cfg: VllmConfig, security: SecurityConfig,
                    model_cfg: ModelConfig):
    """A vLLM server's client: the server at `cfg.url`, or one started here with `cfg.server_python`
    on the merged model (the engine dir's copy, else a merge made now into a temporary dir)."""
    from self_improve.engines.vllm_server import VLLMServer, VLLMServerSampler, VLLMWorkerSampler

    tmp = None
    if merged is None:
        merged, tmp = merged_copy(model_dir, base, security, model_cfg, always=True)
    if cfg.url:
        sampler = VLLMServerSampler(merged, cfg, url=cfg.url, security=security)
    elif cfg.offline:
        sampler = VLLMWorkerSampler(cfg.server_python, merged, cfg, model_cfg.max_length, security)
    else:
        server = VLLMServer(cfg.server_python, merged, cfg, model_cfg.max_length, security)
        try:
            sampler = VLLMServerSampler(merged, cfg, server=server, security=security)
        except BaseException:
            server.close()
            raise
    sampler._tmp = tmp  # the merged copy lives as long as the sampler
    return sampler
