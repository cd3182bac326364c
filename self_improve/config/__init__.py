"""Typed, validated params.yaml.

One frozen pydantic model per section, in a module per topic (task, model, sampling, judging,
training); this module holds the whole file (`Params`), its loading and flattening. Unknown keys are refused by name, closed choices are
enums, and every stage validates the whole file before it writes anything, so a typo anywhere
stops the loop at once with one line naming the key.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from self_improve.config.agents import AgentLink, AgentsConfig  # noqa: F401 (re-exported)
from self_improve.config.base import _Section
from self_improve.config.algorithms import (  # noqa: F401 (re-exported)
    ALGORITHMS,
    Algorithm,
    algorithm_of,
    register_algorithm,
    unregister_algorithm,
)
from self_improve.config.judges import JUDGES, Judge, judge_of, register, unregister  # noqa: F401 (re-exported)
from self_improve.config.engines import AUTO, ENGINES, Engine, register_engine, unregister_engine  # noqa: F401
from self_improve.config.tasks import TASKS, TaskEntry, register_task, task_of, unregister_task  # noqa: F401
from self_improve.config.judging import (  # noqa: F401 (re-exported)
    CrossView,
    FrozenJudge,
    JudgeConfig,
    JudgeMode,
    LowConsensus,
    PairsConfig,
    PairWeight,
    RestateRule,
)
from self_improve.config.model import (  # noqa: F401 (re-exported)
    BUILTIN,
    DType,
    ModelConfig,
    ModelShape,
    PrepareConfig,
    SecurityConfig,
)
from self_improve.config.sampling import (  # noqa: F401 (re-exported)
    BstarConfig,
    BstarLabels,
    Ct2ComputeType,
    Ct2Config,
    EvaluateConfig,
    EvolveConfig,
    EvolveStrategy,
    SampleConfig,
    SecScope,
    VllmConfig,
)
from self_improve.config.task import (  # noqa: F401 (re-exported)
    WORD_OPS,
    GymDataset,
    OnError,
    TaskConfig,
)
from self_improve.config.training import (  # noqa: F401 (re-exported)
    DpoConfig,
    GrpoConfig,
    LoraConfig,
    NftConfig,
    NftOmega,
    TrainConfig,
)
from self_improve.errors import ConfigError


class TrackingConfig(_Section):
    enabled: bool = True
    experiment: str = Field("self-improve", min_length=1)


class StopConfig(_Section):
    enabled: bool = Field(False, description="stop the loop early by the label-free choice rule: once stopped, "
                          "later iterations pose no prompts and train nothing, passing the model on")
    patience: int = Field(3, ge=1, description="stop once the iteration the choice rule recommends (choice.RULE) "
                          "is this many iterations behind the latest (no candidate since) and its agreement "
                          "signal set no new high in them (stopping.rising)")
    while_rising: bool = Field(True, description="go on while the rule's agreement signal sets new highs (above "
                               "every earlier iteration's by more than the rule's minimum gain) in those iterations, "
                               "at iterations no veto of the choice holds back, though none passed the rule; false: "
                               "stop on the recommendation alone")
    on_alarm: bool = Field(False, description="also stop when the reward-hacking alarm fires (quality.py; it reads "
                           "held-out and verifier accuracy where the task has gold answers: not label-free)")


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
    plugins: list[str] = Field(
        [], description="modules imported before the params are checked, each registering what it adds (a task, "
        "judge or training algorithm): e.g. plugins.my_judge for plugins/my_judge.py, a dependency of every "
        "stage (docs/extending.md)",
    )
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
    agents: AgentsConfig = AgentsConfig()  # CoMAS (comas/dvc.yaml); the loop never reads it
    stop: StopConfig = StopConfig()  # when the loop stops early (self_improve/stopping.py)
    loop: dict[str, IterationLink]

    @field_validator("loop", mode="before")
    @classmethod
    def _in_order(cls, v: Any) -> Any:
        """Iterations in their number's order, however they were written (a recipe may add it4 before
        an override adds it3)."""
        if isinstance(v, dict) and all(isinstance(k, str) and _IT.fullmatch(k) for k in v):
            return dict(sorted(v.items(), key=lambda kv: int(kv[0][2:])))
        return v

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
        if self.task.entry.math and self.task.columns and "answer" not in self.task.columns:
            raise ValueError(f"task.columns: {self.task.name} needs `answer` (the file's gold answer column)")
        if self.train.entry.reference_pairs and self.evolve.seed_prompts == 0:
            raise ValueError(f"train.algorithm {self.train.algorithm} needs evolve.seed_prompts > 0: it pairs the "
                             "seed data's reference answers with the model's own samples")
        if self.sample.bstar.enabled and (self.judge.entry.runs_model or self.judge.frozen != FrozenJudge.none):
            raise ValueError(f"sample.bstar.enabled: the sweep selects samples by the judge's reward from the "
                             f"answers alone; judge.method {self.judge.method} (or judge.frozen) runs a "
                             "model: use a vote judge or the verifier")
        return self

    def seed_prompts(self) -> int:
        """Seed-data prompts per iteration (evolve.seed_prompts, or its default)."""
        if self.evolve.seed_prompts is not None:
            return self.evolve.seed_prompts
        return self.train.entry.seed_prompts

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


def import_plugins(raw: dict, source: str = "params.yaml") -> None:
    """Import the modules `plugins` names (before validation: what they register is then known)."""
    names = raw.get("plugins") or []
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise ConfigError(f"{source}: plugins: expected a list of module names, got {names!r}")
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as err:  # a plugin's own error, named with the plugin
            raise ConfigError(f"{source}: plugins: cannot import {name}: {type(err).__name__}: {err}") from None


def parse_params(raw: Any, source: str = "params.yaml") -> Params:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping of sections, got {type(raw).__name__}")
    import_plugins(raw, source)
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
