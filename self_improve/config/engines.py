"""The engine table: every `sample.backend`, once, with where its code lives.

An entry names three functions, each `"module:function"` (imported only when the engine runs, so
reading the table, as config validation does, loads no model code) or the function itself:

- `open(engine_dir, model_dir, base, cfg, security, model_cfg) -> Sampler`: the sampler on the
  iteration's model (`cfg` the `sample` section; `engine_dir` the engine stage's output, or None
  outside the pipeline). A Sampler has a `backend` name and
  `generate(prompts, spec, seed, desc, progress) -> Generations` (self_improve/engines/sampler.py).
- `prepare(model_dir, base, out, security, model_cfg) -> record`: what the `engine` stage does once
  per iteration, filling the new dir `out` (a conversion, a merged copy) and returning its record
  (a dict with `engine`, written as engine.json); None: nothing to prepare.
- `unavailable() -> str | None`: why it cannot run here (not installed, no GPU), or None.

`auto` tries the engines whose `auto` rank is set, lowest first, and takes the first available; an
engine whose `prepare` refuses the model (a ConfigError) falls back to hf under `auto`. Adding an
engine is one module and one `register_engine` call (docs/extending.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from self_improve.config.tables import Table, resolve

AUTO = "auto"  # sample.backend's default: the first available engine by `auto` rank
Ref = Union[str, Callable[..., Any]]


@dataclass(frozen=True)
class Engine:
    open: Ref  # "module:function" or the function: the sampler
    about: str = ""
    prepare: Optional[Ref] = None  # the engine stage's work, once per iteration; None: only the record
    unavailable: Optional[Ref] = None  # why it cannot run here, or None; unset: it always can
    auto: Optional[int] = None  # `auto`'s order (lower first); None: only when named

    def why_not(self) -> Optional[str]:
        return resolve(self.unavailable)() if self.unavailable is not None else None


ENGINES: Table[Engine] = Table("engine", {
    "vllm": Engine("self_improve.engines.sampler:open_vllm", auto=0,
                   prepare="self_improve.engines.engine:merge_for_vllm",
                   unavailable="self_improve.engines.engine:vllm_unavailable",
                   about="vLLM on the visible GPUs (the `gpu` extra), in-process or a `vllm serve` server"),
    "ct2": Engine("self_improve.engines.sampler:open_ct2_sampler", auto=1,
                  prepare="self_improve.engines.ct2:convert",
                  unavailable="self_improve.engines.ct2:ct2_unavailable",
                  about="CTranslate2 on the iteration's converted model (the fast CPU engine)"),
    "hf": Engine("self_improve.engines.sampler:open_hf", auto=2,
                 about="batched `transformers` generation (CPU or GPU)"),
})

register_engine = ENGINES.register  # a new sample.backend: register_engine("name", Engine(...))
unregister_engine = ENGINES.unregister


def backend_name(name: str) -> str:
    """A pydantic AfterValidator's function: `auto` or a name of the engine table."""
    if name != AUTO and name not in ENGINES:
        raise ValueError(f"unknown engine {name!r} (auto or one of the engines: {', '.join(ENGINES)})")
    return name
