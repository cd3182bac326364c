"""The model as its own judge: llm_judge (the 5-point rubric generated and parsed, or read from the
next-token distribution: G-Eval's score_logprob, P(Yes) for yes_logprob), self_certainty and
CREAM's implicit reward."""

from __future__ import annotations

import random
from typing import Optional

import pandas as pd

from self_improve.config import JudgeConfig, JudgeMode
from self_improve.judges.base import JudgeContext, Verdicts
from self_improve.judges.rubric import mean_score, parse_score, render

MAX_POINTS = 5


def self_certainty(samples: pd.DataFrame, cfg: JudgeConfig, ctx: JudgeContext) -> Verdicts:
    return Verdicts([float(x) for x in ctx.scores("policy", samples).self_certainty])


def implicit_reward(samples: pd.DataFrame, cfg: JudgeConfig, ctx: JudgeContext) -> Verdicts:
    cur, ref = ctx.scores("policy", samples).logp, ctx.scores("reference", samples).logp
    return Verdicts([float(c - r) for c, r in zip(cur, ref)])


def judged_prompts(prompt_ids: list[str], max_prompts: int | None, seed: int) -> set[str]:
    """The prompts llm_judge scores this iteration: all, or a seeded choice of `max_prompts`."""
    unique = sorted(set(prompt_ids))
    if max_prompts is None or len(unique) <= max_prompts:
        return set(unique)
    return set(random.Random(seed).sample(unique, max_prompts))


SCORE_PREFILL = "Score: "  # score_logprob: the judge's answer starts here; the next token is the score
YES_NO = ["Yes", "No"]


def logprob_judge(samples: pd.DataFrame, cfg: JudgeConfig, ctx: JudgeContext) -> Verdicts:
    """The score read from the judge's next-token distribution: one forward pass per judgment.

    score_logprob (G-Eval): after the rubric and "Score: ", the expected value of the score over
    the tokens 1..5 (renormalised over them), / 5. yes_logprob: P(Yes) / (P(Yes) + P(No)) for
    "is the proposed answer correct?". Every distinct (prompt, response) is judged, once.
    """
    from self_improve.engines.hf import chat_format, next_token_probs

    tok = ctx.policy.tokenizer
    chat = chat_format(ctx.policy.model, tok)
    context = ctx.policy.context(ctx.max_length)
    texts: dict[tuple[str, str], Optional[str]] = {}
    for prompt, response in zip(samples["prompt"], samples["response"]):
        if (prompt, response) not in texts:
            text = render(ctx.template, prompt, response)
            texts[(prompt, response)] = text if len(chat.prompt_ids(text)) + 4 <= context else None
    todo = [key for key, text in texts.items() if text is not None]
    scored = cfg.mode == JudgeMode.score_logprob
    labels = [str(k) for k in range(1, MAX_POINTS + 1)] if scored else YES_NO
    probs = next_token_probs(ctx.policy.model, tok, [texts[k] for k in todo], labels,
                             prefill=SCORE_PREFILL if scored else "", batch_size=ctx.batch_size,
                             max_tokens=ctx.max_tokens, desc=f"llm_judge ({cfg.mode.value})",
                             progress=ctx.progress, chat=chat)
    verdict: dict[tuple[str, str], Optional[float]] = {key: None for key in texts}
    for key, p in zip(todo, probs):
        mass = sum(p)
        if mass <= 0:
            continue
        if scored:
            verdict[key] = sum((k + 1) * pk for k, pk in enumerate(p)) / mass / MAX_POINTS
        else:
            verdict[key] = p[0] / mass
    return Verdicts([verdict[(p, r)] for p, r in zip(samples["prompt"], samples["response"])])


def llm_judge(samples: pd.DataFrame, cfg: JudgeConfig, ctx: JudgeContext) -> Verdicts:
    if ctx.policy is None or ctx.template is None:
        raise ValueError("llm_judge needs the policy model and the rubric template")
    if cfg.mode != JudgeMode.generate:
        return logprob_judge(samples, cfg, ctx)
    from self_improve.engines.hf import SamplingSpec, chat_format, generate
    tok = ctx.policy.tokenizer
    chat = chat_format(ctx.policy.model, tok)
    context = ctx.policy.context(ctx.max_length)
    chosen = judged_prompts(list(samples["prompt_id"]), cfg.max_prompts, ctx.seed)
    # each distinct (prompt, response) is judged once, `judgments` times
    texts: dict[tuple[str, str], Optional[str]] = {}
    for pid, prompt, response in zip(samples["prompt_id"], samples["prompt"], samples["response"]):
        if pid in chosen and (prompt, response) not in texts:
            text = render(ctx.template, prompt, response)
            fits = len(chat.prompt_ids(text)) + cfg.max_new_tokens <= context
            texts[(prompt, response)] = text if fits else None  # too long for the judge: no verdict
    todo = [key for key, text in texts.items() if text is not None]
    spec = SamplingSpec(n=cfg.judgments, temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens,
                        batch_size=ctx.batch_size)
    outs = generate(ctx.policy.model, tok, [texts[k] for k in todo], spec, ctx.seed, desc="llm_judge",
                    progress=ctx.progress, chat=chat)
    verdict: dict[tuple[str, str], tuple[Optional[float], float]] = {
        key: (None, 0.0) for key in texts
    }
    for key, generations in zip(todo, outs):
        points = [parse_score(g, MAX_POINTS) for g in generations]
        avg = mean_score(points)
        parsed = sum(p is not None for p in points) / len(points)
        verdict[key] = (None if avg is None else avg / MAX_POINTS, parsed)
    reward, rate = [], []
    for prompt, response in zip(samples["prompt"], samples["response"]):
        r, p = verdict.get((prompt, response), (None, None))
        reward.append(r)
        rate.append(p)
    return Verdicts(reward, parse_rate=rate)


def frozen_yes(samples: pd.DataFrame, ctx: JudgeContext) -> list[Optional[float]]:
    """The frozen base model's P(Yes) for "is this answer correct?" on every sample (computed once per context)."""
    if "frozen_yes" not in ctx._scores:
        if ctx.frozen is None or ctx.frozen_template is None:
            raise ValueError("judge.frozen needs the base model and judge.correct_template")
        sub = JudgeContext(policy=ctx.frozen, template=ctx.frozen_template, batch_size=ctx.batch_size,
                           max_tokens=ctx.max_tokens, max_length=ctx.max_length, progress=ctx.progress)
        cfg = JudgeConfig(method="llm_judge", mode=JudgeMode.yes_logprob)
        ctx._scores["frozen_yes"] = logprob_judge(samples, cfg, sub).reward
    return ctx._scores["frozen_yes"]
