"""Self-verification by inverse problems (`judge.inverse`), a label-free rule of the vote judges.

For each answer a prompt's samples propose, the task poses the problem backwards with that answer
given and one of the question's numbers hidden (`Task.inverse`, self_improve/tasks/inverse.py); the
policy answers each inverse greedily, and the answer is confirmed when every inverse comes back to
the hidden number. A confirmed answer keeps its vote score; an unconfirmed one is weighed by
`judge.inverse_weight`. No gold is read: the hidden number is the question's own. What it is for: a
policy that learned a shortcut (the sum of the question's numbers) answers a subtraction with a
number whose inverse does not come back, so the shortcut's votes lose to an answer that checks out.
"""

from __future__ import annotations

from typing import Optional

import pandas as pd

from self_improve.judges.base import JudgeContext
from self_improve.tasks.answers import equivalent


def inverse_checks(samples: pd.DataFrame, key: str, ctx: JudgeContext, max_new_tokens: int) -> dict[tuple, Optional[float]]:
    """{(samples[key], answer): 1.0 confirmed, 0.0 not, None where the task poses no inverse}, each
    answer checked once per `key` group (on the first sample that gave it); computed once per context."""
    cache = ctx._scores.setdefault("inverse", {})
    if key in cache:
        return cache[key]
    if ctx.inverse is None or ctx.policy is None:
        raise ValueError("judge.inverse needs the task's inverse problems and the policy model")
    todo: dict[tuple, list[tuple[str, str]]] = {}
    for group, prompt, pred in zip(samples[key], samples["prompt"], samples["pred"]):
        if isinstance(pred, str) and (group, pred) not in todo:
            todo[(group, pred)] = ctx.inverse(prompt, pred)
    flat = [(k, q, hidden) for k, posed in todo.items() for q, hidden in posed]
    out: dict[tuple, Optional[float]] = {k: None for k in todo}
    if flat:
        from self_improve.engines.hf import SamplingSpec, generate

        spec = SamplingSpec(n=1, greedy=True, max_new_tokens=max_new_tokens, batch_size=ctx.batch_size)
        answers = generate(ctx.policy.model, ctx.policy.tokenizer, [q for _, q, _ in flat], spec, ctx.seed,
                           desc="inverse", progress=ctx.progress)
        for (k, _, hidden), response in zip(flat, answers):
            solved = ctx.extract(response[0]) if ctx.extract is not None else None
            ok = float(solved is not None and equivalent(solved, hidden))
            out[k] = ok if out[k] is None else min(out[k], ok)
    cache[key] = out
    return out
