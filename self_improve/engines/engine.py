"""An iteration's model made ready for the inference engine, once: what the `engine` stage does.

`prepare` resolves `sample.backend` once (`auto`: the first available engine of the engine table,
self_improve/config/engines.py, by rank: vLLM where it can run, else CTranslate2 where it is
installed, else hf) and fills the engine dir every later stage that samples or evaluates the model
reads, with the engine's own `prepare`: for ct2 the model, merged with its adapters, converted into
CTranslate2's format (`auto` falls back to hf, with the reason recorded, for an architecture the
converter does not know; `ct2` names it as an error); for vLLM the model merged with its adapters
into `hf/` (what vLLM and `vllm serve` load); for hf nothing but the record. The record
(`engine.json`) names the engine the samplers then open (self_improve/engines/sampler.py's
`open_sampler`).
"""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path

from self_improve.config import AUTO, ENGINES, ModelConfig, SecurityConfig
from self_improve.config.tables import resolve
from self_improve.errors import ConfigError, PipelineError

log = logging.getLogger(__name__)

ENGINE_FILE = "engine.json"  # the record inside an engine dir
MERGED_DIR = "hf"  # vLLM: the merged model (safetensors) inside an engine dir
FALLBACK = "hf"  # what `auto` takes for a model an engine's `prepare` refuses


def read_engine(engine_dir: str | Path) -> dict:
    path = Path(engine_dir) / ENGINE_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise PipelineError(f"{path}: unreadable engine record ({err}); rerun its engine stage") from None
    if not isinstance(record, dict) or "engine" not in record:
        raise PipelineError(f"{path}: not an engine record (needs `engine`)")
    return record


def vllm_unavailable() -> str | None:
    """Why vLLM cannot run here, or None when it can."""
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed (pip install -e '.[gpu]' on a GPU machine)"
    import torch  # only where vllm is installed

    if not torch.cuda.is_available():
        return "no CUDA GPU is visible"
    return None


def resolve_backend(requested: str) -> str:
    """The engine `requested` names; `auto`: the first available engine by the table's `auto` rank."""
    if requested != AUTO:
        ENGINES.of(requested)
        return requested
    ranked = sorted((entry.auto, name) for name, entry in ENGINES.items() if entry.auto is not None)
    for _, name in ranked:
        if ENGINES[name].why_not() is None:
            return name
    return FALLBACK


def merge_for_vllm(model_dir: str | Path, base: str | Path | None, out: Path,
                   security: SecurityConfig = SecurityConfig(), model_cfg: ModelConfig = ModelConfig()) -> dict:
    """vLLM's `prepare`: vLLM loads a plain HF dir, so the adapters are merged once, into `out/hf`."""
    from self_improve.models.loading import export_merged

    export_merged(model_dir, base, Path(out) / MERGED_DIR, security, model_cfg,
                  {"exported_from": str(model_dir), "base": str(base) if base else None})
    return {"engine": "vllm", "model": MERGED_DIR}


def prepare(requested: str, model_dir: str | Path, base: str | Path | None, out: Path,
            security: SecurityConfig = SecurityConfig(), model_cfg: ModelConfig = ModelConfig()) -> dict:
    """Fill the (new, empty) engine dir `out` for `model_dir` (an adapter chain on `base`) and write its
    record; returns the record. torch and the engines load only for the backend that needs them."""
    backend = resolve_backend(requested)
    entry = ENGINES[backend]
    record: dict = {"engine": backend}
    if entry.prepare is not None:
        from self_improve.models.loading import set_threads

        set_threads()
        try:
            record = resolve(entry.prepare)(model_dir, base, out, security, model_cfg)
        except ConfigError as err:
            if requested != AUTO:
                raise
            log.warning("%s; sampling with %s", err, FALLBACK)
            record = {"engine": FALLBACK, "fallback": str(err)}
    (out / ENGINE_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return record
