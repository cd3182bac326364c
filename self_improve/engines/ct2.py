"""CTranslate2: the fast CPU engine for sampling, on a converted copy of the model.

CTranslate2 has no LoRA, so it runs a merged model converted into its own format. The `engine`
stage converts each iteration's model once (`data/itN/engine`: float32 weights, the tokenizer and
the generation config, `engine.json`), and every stage that samples that model loads the
conversion instead of converting again; `compute_type` is chosen at load time (int8 quantises the
float32 weights as they load), so one conversion serves every precision.

The sampler takes the same prompt token ids and stop ids as hf (self_improve/chat.py) and returns the
same `Generations`. What makes it fast: finished rows leave the batch, each prompt is prefilled
once for its `n` samples, and the token prefix every prompt shares (the chat template's system
turn) is the static prompt, whose state is computed once and reused. Sampling is seeded per call
(same seed, same samples, whatever ran before) and each generator decodes its batches one after
another, so the random draws do not depend on thread timing: with `lanes` > 1, that many
single-worker generators, each seeded from (seed, lane), take every lanes-th batch at once (other
draws than one lane's, as reproducible). Float32 greedy outputs equal hf's token for token
(tests/test_ct2.py on the tiny model; benchmarks/real.py counts them on SmolLM2).
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import shutil
import tempfile
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from self_improve.config import Ct2Config, ModelConfig, SecurityConfig
from self_improve.cpu import usable_cpus
from self_improve.errors import ConfigError, PipelineError

log = logging.getLogger(__name__)

CT2_DIR = "ct2"  # the converted model inside an engine dir
LANE_SEED_STEP = 1_000_003  # lane w of a sampling call seeds its generator with seed + w * this


def ct2_unavailable() -> str | None:
    """Why CTranslate2 cannot run here, or None when it can."""
    if importlib.util.find_spec("ctranslate2") is None:
        return "ctranslate2 is not installed (pip install ctranslate2)"
    return None


def _source_dir(model_dir: Path, base: Path | None, security: SecurityConfig, model_cfg: ModelConfig,
                tmp: Path) -> Path:
    """A plain HF directory of the model: the base where it lives, the full weights as they are, or an
    adapter chain merged into `tmp` (the same merge as `self_improve.models.export`)."""
    from self_improve.models.base import BASE_FILE, base_location, check_unchanged, read_record
    from self_improve.models.loading import CHAIN_FILE, check_model_dir, export_merged

    if (model_dir / CHAIN_FILE).is_file():
        if base is None:
            raise PipelineError(f"{model_dir}: an adapter chain needs its base model directory (--base)")
        export_merged(model_dir, base, tmp / "merged", security, model_cfg)
        return tmp / "merged"
    if (model_dir / BASE_FILE).is_file():
        record = read_record(model_dir)
        if record.get("gguf_file"):  # the converter reads safetensors: dequantise through transformers
            export_merged(model_dir, base, tmp / "merged", security, model_cfg)
            return tmp / "merged"
        where = base_location(record)
        check_unchanged(record, where)
        return Path(check_model_dir(where, security))
    return Path(check_model_dir(model_dir, security))


def convert(model_dir: str | Path, base: str | Path | None, out: Path, security: SecurityConfig = SecurityConfig(),
            model_cfg: ModelConfig = ModelConfig()) -> dict:
    """Convert a pipeline model into `out` (which must not exist): CTranslate2 float32 weights under
    `out/ct2`, the tokenizer and generation config beside them. Returns what was converted.

    An architecture the converter does not know is a ConfigError naming it."""
    import ctranslate2
    from ctranslate2.converters import TransformersConverter
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    model_dir = Path(model_dir)
    with tempfile.TemporaryDirectory(prefix="self-improve-ct2-") as tmp:
        src = _source_dir(model_dir, Path(base) if base else None, security, model_cfg, Path(tmp))
        trust = security.trust_remote_code
        arch = (AutoConfig.from_pretrained(src, trust_remote_code=trust).architectures or ["?"])[0]
        converter = TransformersConverter(str(src), load_as_float16=False, trust_remote_code=trust,
                                          low_cpu_mem_usage=True)
        try:
            converter.convert(str(out / CT2_DIR), quantization=None, force=True)
        except (ValueError, NotImplementedError) as err:
            why = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            if why.startswith("No conversion is registered"):  # it goes on to list every supported config
                why = "its converter knows no such architecture"
            raise ConfigError(f"sample.backend ct2: CTranslate2 cannot convert {arch} ({model_dir}): {why[:300]}; "
                              "use sample.backend hf (or auto, which falls back to hf)") from None
        tokenizer = AutoTokenizer.from_pretrained(src, trust_remote_code=trust)
        tokenizer.save_pretrained(out)
        try:
            GenerationConfig.from_pretrained(src).save_pretrained(out)
        except OSError:
            pass  # no generation config: stop ids come from the tokenizer and the template
    return {"engine": "ct2", "architecture": arch, "ctranslate2": ctranslate2.__version__}


def _threads(cfg: Ct2Config) -> tuple[int, int]:
    """(inter, intra) threads: `cfg.threads` cores in all (0: every core, or OMP_NUM_THREADS)."""
    total = cfg.threads or int(os.environ.get("OMP_NUM_THREADS") or 0) or usable_cpus()
    inter = max(1, min(cfg.inter_threads, total))
    return inter, max(1, total // inter)


def common_prefix(rows: list[list[int]]) -> int:
    """Length of the token prefix every row shares, leaving each row at least one token of its own."""
    if not rows:
        return 0
    first, n = rows[0], min(len(r) for r in rows) - 1
    for r in rows[1:]:
        k = 0
        while k < n and r[k] == first[k]:
            k += 1
        n = k
    return max(0, n)


class CT2Sampler:
    """Sampling and scoring on a converted model (an engine dir written by `convert`)."""

    backend = "ct2"

    def __init__(self, engine_dir: str | Path, cfg: Ct2Config = Ct2Config(),
                 security: SecurityConfig = SecurityConfig()):
        import ctranslate2

        from self_improve.chat import ChatFormat

        engine_dir = Path(engine_dir)
        if not (engine_dir / CT2_DIR / "model.bin").is_file():
            raise PipelineError(f"{engine_dir}: no CTranslate2 model (rerun its engine stage with sample.backend ct2)")
        self.chat = ChatFormat.from_dir(engine_dir, security.trust_remote_code)
        self.tokenizer = self.chat.tokenizer
        self.compute_type = cfg.compute_type.value
        self._path, self._ct2 = str(engine_dir / CT2_DIR), ctranslate2
        self._inter, self._intra = _threads(cfg)
        self.batch_size = cfg.batch_size
        self.lanes = cfg.lanes
        self._greedy = self._scorer = None
        log.info("ct2: %s, %d x %d threads, %d sampling lane(s)", self.compute_type, self._inter, self._intra,
                 self.lanes)

    def _generators(self, greedy: bool, seed: int) -> list:
        """Greedy decoding: one generator, `inter_threads` batches at a time. Sampling: `lanes`
        generators made for the call (0.5 s each for a 135M model), each with one worker so its
        draws follow its batches' order. CTranslate2 seeds a worker's random state from the global
        seed at the worker's first random draw, so with several lanes each one draws a token right
        after its seed is set (lane w: seed + w * LANE_SEED_STEP), before the next lane's seed."""
        if greedy:
            if self._greedy is None:
                self._greedy = self._ct2.Generator(self._path, device="cpu", compute_type=self.compute_type,
                                                   inter_threads=self._inter, intra_threads=self._intra)
            return [self._greedy]
        threads = max(1, self._inter * self._intra // self.lanes)
        out = []
        for lane in range(self.lanes):
            self._ct2.set_random_seed((seed + LANE_SEED_STEP * lane) % 2**32)
            generator = self._ct2.Generator(self._path, device="cpu", compute_type=self.compute_type,
                                            inter_threads=1, intra_threads=threads)
            if self.lanes > 1:  # one sampled token: this worker's random state takes this lane's seed now
                generator.generate_batch(self._tokens([self.chat.prompt_ids("1")[:1]]), max_length=1,
                                         sampling_topk=0, sampling_temperature=1.0)
            out.append(generator)
        return out

    def _tokens(self, ids: list[list[int]]) -> list[list[str]]:
        return [self.tokenizer.convert_ids_to_tokens(i) for i in ids]

    def generate(self, prompts, spec, seed, desc="generate", progress=True):
        from tqdm.auto import tqdm

        from self_improve.engines.hf import Generations, PieceText, finish

        if not prompts:
            return Generations()
        ids = [self.chat.prompt_ids(p) for p in prompts]
        shared = common_prefix(ids)
        static = self._tokens([ids[0][:shared]])[0] if shared else None
        inputs = self._tokens([i[shared:] for i in ids])
        order = sorted(range(len(ids)), key=lambda i: (len(ids[i]), i))  # little padding per batch
        generators = self._generators(spec.greedy, seed)
        workers = self._inter if spec.greedy else len(generators)
        # prompts per batch (spec.batch_size is hf's), and a batch for every worker even when few
        per_call = max(1, min(self.batch_size // spec.n, math.ceil(len(prompts) / workers)))
        kwargs = dict(max_length=spec.max_new_tokens, include_prompt_in_result=False, end_token=self.chat.stop_ids,
                      return_end_token=True, num_hypotheses=spec.n, static_prompt=static)
        if spec.greedy:
            kwargs.update(sampling_topk=1)
        else:
            kwargs.update(sampling_topk=0, sampling_topp=spec.top_p, sampling_temperature=spec.temperature)
        stop_at = spec.stop_at
        texts: list[list[str]] = [[] for _ in prompts]
        cut: list[list[bool]] = [[] for _ in prompts]
        counts = [0] * len(prompts)
        bar = tqdm(total=len(prompts) * spec.n, desc=desc, unit="seq", disable=not progress, mininterval=1.0)

        def run(generator, calls: list[list[int]], max_batch: int) -> None:
            for idx in calls:
                extra = {}
                if stop_at is not None:  # a hypothesis ends once its text holds a complete answer
                    rows = PieceText(self.tokenizer, stop_at)
                    extra["callback"] = lambda step: rows.add((step.batch_id, step.hypothesis_id), step.token_id)
                outs = generator.generate_batch([inputs[i] for i in idx], max_batch_size=max_batch, **kwargs, **extra)
                for i, out in zip(idx, outs):
                    for seq in out.sequences_ids:
                        toks, stopped = self.chat.cut_at_stop(seq)
                        text, answered = finish(self.tokenizer.decode(toks, skip_special_tokens=True), stop_at)
                        texts[i].append(text)
                        cut[i].append(not (stopped or answered))
                        counts[i] += len(toks) + int(stopped)
                bar.update(len(idx) * spec.n)

        if len(generators) == 1:  # greedy's `inter_threads` workers share each call's batches
            step = per_call * workers
            run(generators[0], [order[s:s + step] for s in range(0, len(order), step)], per_call)
        else:  # a thread per lane (CTranslate2 releases the GIL while it decodes), batch b on lane b % lanes
            batches = [order[s:s + per_call] for s in range(0, len(order), per_call)]
            with ThreadPoolExecutor(len(generators)) as pool:
                done = [pool.submit(run, g, batches[lane::len(generators)], per_call)
                        for lane, g in enumerate(generators)]
                for f in done:
                    f.result()
        bar.close()
        return Generations(texts, cut, sum(counts))

    def score(self, prompts, responses, batch_size: int = 64, max_tokens: int = 2048, desc: str = "score",
              progress: bool = True):
        """`hf.score` on the converted model: per (prompt, response), the summed log-prob of the
        response tokens (end-of-turn included), their count and self-certainty, from the same token
        rows as hf (`encode_rows`), in length-sorted batches of at most `max_tokens` padded tokens
        (each batch returns rows x width x vocabulary float32 log-probs, 0.8 GB at 4,096 tokens and a
        49k vocabulary). Float32 sums match torch's to about 1e-3 (tests/test_ct2.py); on a CPU it is
        no faster than torch (`make bench-real`), so the judges and the trainers score on torch."""
        import numpy as np
        from tqdm.auto import tqdm

        from self_improve.engines.hf import Scores, encode_rows, token_batches

        n = len(prompts)
        logp, count, certainty = [0.0] * n, [0] * n, [0.0] * n
        if n == 0:
            return Scores(logp, count, certainty, 0)
        if self._scorer is None:  # one batch at a time, on every thread
            self._scorer = self._ct2.Generator(self._path, device="cpu", compute_type=self.compute_type,
                                               inter_threads=1, intra_threads=self._inter * self._intra)
        rows = encode_rows(self.chat, prompts, responses)
        processed = 0
        bar = tqdm(total=n, desc=desc, unit="seq", disable=not progress, mininterval=1.0)
        for idx in token_batches([len(r.ids) for r in rows], batch_size, max_tokens):
            out = np.asarray(self._scorer.forward_batch(self._tokens([rows[i].ids for i in idx]),
                                                        return_log_probs=True))
            for j, i in enumerate(idx):
                row = rows[i]
                pos = np.arange(row.prompt_len - 1, len(row.ids) - 1)  # the positions predicting the response
                lp = out[j, pos]
                logp[i] = float(lp[np.arange(len(pos)), row.ids[row.prompt_len:]].astype(np.float64).sum())
                count[i] = row.response_len
                # KL(Uniform || p) per position = -log V - mean_j log p_j, averaged over the response
                certainty[i] = float((-math.log(out.shape[-1]) - lp.astype(np.float64).mean(-1)).mean())
                processed += len(row.ids)
            bar.update(len(idx))
        bar.close()
        return Scores(logp, count, certainty, processed)


def open_ct2(engine_dir: str | Path | None, model_dir: str | Path, base: str | Path | None, cfg: Ct2Config,
             security: SecurityConfig = SecurityConfig(), model_cfg: ModelConfig = ModelConfig()) -> CT2Sampler:
    """The sampler on `engine_dir`'s conversion, or, without one (scripts, benchmarks), on a
    conversion made now into a temporary directory removed with the sampler."""
    if engine_dir is not None:
        return CT2Sampler(engine_dir, cfg, security)
    tmp = tempfile.mkdtemp(prefix="self-improve-ct2-")
    try:
        convert(model_dir, base, Path(tmp) / "engine", security, model_cfg)
        sampler = CT2Sampler(Path(tmp) / "engine", cfg, security)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    weakref.finalize(sampler, shutil.rmtree, tmp, True)
    return sampler
