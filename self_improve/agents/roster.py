"""Each iteration's agents (it0: records that every agent is the base model; itN: an adapter chain
per agent) and the problems an iteration discusses."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from self_improve.agents.discussion import Problem
from self_improve.artifacts import JUDGMENTS, ArtifactError, atomic_path, empty_table
from self_improve.config import AgentsConfig, EvolveConfig, EvolveStrategy
from self_improve.tasks import ProposeInput, Task

CHAIN_FILE = "chain.json"  # self_improve/models/loading.py's adapter chain (not imported: no torch here)

START = "start.json"  # it0's agent directories: a record that the agent starts as the base model


def agent_dir(agents: str | Path, k: int) -> Path:
    return Path(agents) / f"agent{k}"


def write_start(agents: str | Path, n: int, prov: dict) -> None:
    """it0's agents: one directory per agent saying it is the base model (no weights copied)."""
    with atomic_path(agents, is_dir=True) as tmp:
        for k in range(n):
            d = agent_dir(tmp, k)
            d.mkdir(parents=True)
            (d / START).write_text(json.dumps({"agent": k, "model": "base", "provenance": prov}, indent=2,
                                              sort_keys=True) + "\n", encoding="utf-8")


def agent_model(agents: str | Path, k: int, base: str | Path) -> Path:
    """The model directory agent `k` of an iteration's agents runs: its adapter chain, or the base."""
    d = agent_dir(agents, k)
    if (d / CHAIN_FILE).is_file():
        return d
    if (d / START).is_file():
        return Path(base)
    raise ArtifactError(f"{d}: no agent here (agents.n larger than the iteration's agents? rerun its stages)")


def problems(task: Task, cfg: AgentsConfig, evolve: EvolveConfig, iteration: str, seed: int,
             ttt: pd.DataFrame, heldout: pd.DataFrame) -> list[Problem]:
    """The iteration's problems, proposed by the task as the loop's evolve stage would with no
    judgments yet: `agents.problems` fresh ones (never a held-out one, in any wording), and the
    test-time problems with `agents.include_ttt`; no rewrites."""
    cfg_evolve = evolve.model_copy(update={"strategy": EvolveStrategy.eva, "fresh": cfg.problems, "keep_top": 0,
                                           "rewrites": 0, "include_ttt": cfg.include_ttt})
    inp = ProposeInput(cfg=cfg_evolve, iteration=iteration, seed=seed, ttt=ttt, heldout=heldout,
                       prev_judgments=empty_table(JUDGMENTS), rewrites=False)
    df = task.propose(inp)
    question = getattr(task, "question", lambda prompt: prompt)
    return [Problem(pid, question(prompt), answer if isinstance(answer, str) else None,
                    cat if isinstance(cat, str) else None)
            for pid, prompt, answer, cat in zip(df["prompt_id"], df["prompt"], df["answer"], df["category"])]
