"""One iteration's discussions: the three roles' prompts, the scorer's tag, the rewards, who reviews
whom, the discussion rounds, each agent's REINFORCE++ buffer and its metrics."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from self_improve import templates
from self_improve.stage import derive_seed
from self_improve.config import AgentsConfig

if TYPE_CHECKING:
    from self_improve.engines.hf import Generations

SOLVE, EVALUATE, SCORE = "comas_solve.txt", "comas_evaluate.txt", "comas_score.txt"
ROLES = ("solution", "evaluation", "score")
_SCORE_TAG = re.compile(r"<score>\s*([1-3])\s*</score>", re.IGNORECASE)

TRANSCRIPTS = pa.schema(  # one row per generation of one iteration's discussions
    [
        ("iteration", pa.string()),
        ("prompt_id", pa.string()),  # the problem
        ("round", pa.int64()),
        ("solver", pa.int64()),  # the discussion: the agent whose solution it is
        ("role", pa.string()),  # solution | evaluation | score
        ("agent", pa.int64()),  # who wrote this row's response
        ("prompt", pa.string()),  # the user turn the agent was given
        ("response", pa.string()),
        ("truncated", pa.bool_()),
        ("score", pa.int64()),  # score rows: the parsed 1-3, null when it did not parse
        ("reward", pa.float64()),
        ("pred", pa.string()),  # solution rows: the final answer as the task reads it
        ("correct", pa.float64()),  # solution rows: the verifier's verdict, measured only
    ]
)

# generate(agent, prompts, seed) -> one response per prompt
Generate = Callable[[int, list[str], int], "Generations"]


def parse_score(text: str | None) -> int | None:
    """The scorer's 1-3 score: the last `<score>n</score>` of its output, None when there is none."""
    found = _SCORE_TAG.findall(text or "")
    return int(found[-1]) if found else None


def rewards(score: int | None) -> tuple[float, float, float]:
    """(solution, evaluation, scorer) rewards of one scored discussion."""
    if score is None:
        return 0.0, 0.0, -1.0
    s = (score - 1) / 2
    return s, 1.0 - s, 0.0


def reviewers(solver: int, n: int, rng: random.Random) -> tuple[int, int]:
    """(evaluator, scorer) of one solution: never the solver; with 3 or more agents, three agents."""
    others = [a for a in range(n) if a != solver]
    evaluator = rng.choice(others)
    scorers = [a for a in others if a != evaluator] or others
    return evaluator, rng.choice(scorers)


def render_discussion(pairs: Sequence[tuple[str, str]]) -> str:
    if not pairs:
        return "(no discussion yet)"
    return "\n\n".join(f"=== Discussion {i} ===\nSolution: {s.strip()}\nEvaluation: {e.strip()}"
                       for i, (s, e) in enumerate(pairs, 1))


@dataclass(frozen=True)
class Problem:
    prompt_id: str
    question: str
    answer: str | None
    category: str | None = None


def discuss(problems: list[Problem], cfg: AgentsConfig, generate: Generate, seed: int, iteration: str,
            extract: Callable[[str], str | None], verify: Callable[[str | None, Problem], float | None]
            ) -> pd.DataFrame:
    """Every round of every problem's discussion: the TRANSCRIPTS rows, rewards allocated."""
    solve_t, evaluate_t, score_t = (templates.read(t) for t in (SOLVE, EVALUATE, SCORE))
    rng = random.Random(seed)
    rows: list[dict] = []
    previous: dict[str, list[tuple[str, str]]] = {p.prompt_id: [] for p in problems}
    for rnd in range(cfg.rounds):
        # solutions: every agent answers every problem; a problem's references are drawn once per round
        prompts = []
        for p in problems:
            refs = previous[p.prompt_id]
            picked = rng.sample(refs, min(cfg.references, len(refs)))
            prompts.append(solve_t.format(problem=p.question, discussion=render_discussion(picked)))
        solutions: dict[tuple[int, int], tuple[str, bool]] = {}
        for a in range(cfg.n):
            out = generate(a, prompts, _seed(seed, rnd, "solution", a))
            for i, (texts, cut) in enumerate(zip(out, out.truncated, strict=True)):
                solutions[i, a] = (texts[0], cut[0])
        # evaluations and scores, each asked of another agent
        roles = {(i, a): reviewers(a, cfg.n, rng) for i in range(len(problems)) for a in range(cfg.n)}

        def evaluate_prompt(i: int, a: int, sols=solutions) -> str:
            return evaluate_t.format(problem=problems[i].question, solution=sols[i, a][0].strip())

        evaluations = _ask(generate, roles, 0, seed, rnd, "evaluation", cfg.n, evaluate_prompt)

        def score_prompt(i: int, a: int, sols=solutions, evals=evaluations) -> str:
            return score_t.format(problem=problems[i].question, solution=sols[i, a][0].strip(),
                                  evaluation=evals[i, a][1].strip())

        scores = _ask(generate, roles, 1, seed, rnd, "score", cfg.n, score_prompt)
        for i, p in enumerate(problems):
            for a in range(cfg.n):
                solution, cut = solutions[i, a]
                evaluator, scorer = roles[i, a]
                score = parse_score(scores[i, a][1])
                r_sol, r_eval, r_score = rewards(score)
                pred = extract(solution)
                base = {"iteration": iteration, "prompt_id": p.prompt_id, "round": rnd, "solver": a}
                rows.append({**base, "role": "solution", "agent": a, "prompt": prompts[i], "response": solution,
                             "truncated": cut, "score": None, "reward": r_sol, "pred": pred,
                             "correct": verify(pred, p)})
                e_prompt, e_text, e_cut = evaluations[i, a]
                rows.append({**base, "role": "evaluation", "agent": evaluator, "prompt": e_prompt,
                             "response": e_text, "truncated": e_cut, "score": None, "reward": r_eval,
                             "pred": None, "correct": None})
                s_prompt, s_text, s_cut = scores[i, a]
                rows.append({**base, "role": "score", "agent": scorer, "prompt": s_prompt, "response": s_text,
                             "truncated": s_cut, "score": score, "reward": r_score, "pred": None, "correct": None})
            previous[p.prompt_id] = [(solutions[i, a][0], evaluations[i, a][1]) for a in range(cfg.n)]
    df = pd.DataFrame(rows, columns=TRANSCRIPTS.names)
    return df.astype({"score": "Int64"})


def _seed(seed: int, rnd: int, role: str, agent: int) -> int:
    return derive_seed(seed, "comas", rnd, role, agent)


def _ask(generate: Generate, roles: dict, which: int, seed: int, rnd: int, role: str, n: int,
         prompt_of: Callable[[int, int], str]) -> dict[tuple[int, int], tuple[str, str, bool]]:
    """Each discussion's `role` prompt, asked of its reviewer (`roles[...][which]`), batched per agent:
    {(problem, solver): (prompt, response, truncated)}."""
    out = {}
    for agent in range(n):
        keys = [k for k, r in roles.items() if r[which] == agent]
        if not keys:
            continue
        prompts = [prompt_of(*k) for k in keys]
        gen = generate(agent, prompts, _seed(seed, rnd, role, agent))
        for k, p, texts, cut in zip(keys, prompts, gen, gen.truncated, strict=True):
            out[k] = (p, texts[0], cut[0])
    return out


def advantages(rewards_: Sequence[float]) -> list[float]:
    """REINFORCE++: rewards normalised over the agent's whole buffer (all zero when they are all equal)."""
    r = np.asarray(rewards_, dtype=float)
    if len(r) == 0:
        return []
    sd = r.std()
    return [0.0] * len(r) if sd < 1e-8 else ((r - r.mean()) / sd).tolist()


def buffer(transcripts: pd.DataFrame, agent: int) -> pd.DataFrame:
    """One agent's training rows (every role it played) with their advantages."""
    mine = transcripts[transcripts["agent"] == agent].reset_index(drop=True)
    return mine.assign(advantage=advantages(mine["reward"].astype(float)))


def agent_metrics(transcripts: pd.DataFrame, n: int) -> dict[str, dict[str, float | None]]:
    """Per agent: mean reward per role, the verifier's accuracy of its solutions (and of its last
    round's), how often its scores parse and how often a parsed score agrees with the verifier
    (2 or 3: the answer stands; 1: it does not)."""
    sol = transcripts[transcripts["role"] == "solution"].set_index(["prompt_id", "round", "solver"])["correct"]
    out = {}
    for a in range(n):
        mine = transcripts[transcripts["agent"] == a]
        m: dict[str, float | None] = {}
        for role in ROLES:
            r = mine[mine["role"] == role]["reward"]
            m[f"reward_{role}"] = float(r.mean()) if len(r) else None
        own = mine[mine["role"] == "solution"]
        m["solution_accuracy"] = _mean(own["correct"])
        m["last_round_accuracy"] = _mean(own[own["round"] == own["round"].max()]["correct"]) if len(own) else None
        m["truncated_share"] = float(mine["truncated"].mean()) if len(mine) else None
        scored = mine[mine["role"] == "score"]
        m["score_parse_rate"] = float(scored["score"].notna().mean()) if len(scored) else None
        parsed = scored[scored["score"].notna()]
        if len(parsed):
            truth = sol.reindex(list(zip(parsed["prompt_id"], parsed["round"], parsed["solver"]))).to_numpy()
            says = (parsed["score"].astype(int) >= 2).to_numpy()
            known = ~pd.isna(truth)
            m["score_agreement"] = float((says[known] == (truth[known] >= 1)).mean()) if known.any() else None
            m["mean_score"] = float(parsed["score"].astype(int).mean())
        else:
            m["score_agreement"] = m["mean_score"] = None
        out[f"agent{a}"] = m
    return out


def _mean(s: pd.Series) -> float | None:
    s = s.dropna()
    return float(s.astype(float).mean()) if len(s) else None
