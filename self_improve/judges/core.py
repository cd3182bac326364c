"""The judge registry: every method takes the samples and returns nullable rewards.

One interface for all: ``fn(samples, cfg, ctx) -> Verdicts``, where a reward is a float or None
(no verdict). None is never turned into 0: a sample without a verdict is dropped downstream, not
"rejected". Each method is registered once below with what it needs (a model, the reference
model, the rubric template) and how its rewards read (a verdict in [0, 1], or a ranking score).

- ``majority_vote`` (TTRL): per prompt, the plurality answer of its k samples is the label.
- ``co_reward`` (Co-Reward): per problem, the plurality answer pooled over the samples of all its
  equivalent rewrites (``a+b``, ``b+a``, ``(a+d)+(b-d)``, ...) is the label. Errors on different
  surface forms are less correlated than k samples of one prompt, so a model confirming its own
  mistakes is outvoted by the other formulations.
- ``llm_judge`` (Self-Rewarding LMs): the model itself scores each response with the additive
  5-point rubric in ``judge.template``, ``judge.judgments`` times, averaged; only the judge's own
  generated text is parsed (self_improve/judges/rubric.py); a parse failure is None. Reward = points / 5.
  With ``judge.mode`` score_logprob (G-Eval) the score is the expected value over the tokens 1..5
  after "Score: ", and with yes_logprob P(Yes) for "is this answer correct?"
  (``judge.correct_template``): one forward pass per judgment, nothing to parse.
- ``self_certainty``: mean over response tokens of KL(Uniform || p) under the policy.
- ``implicit_reward`` (CREAM / DPO): sum log pi_current(y|x) - sum log pi_reference(y|x), the
  reference being the model before the current one (the base for it1).
- ``vote_share`` (ScPO): a sample's reward is the share of the prompt's votes its answer got, so the
  pair is the most-voted answer over the least-voted and the reward margin is the vote margin / k.
- ``verifier``: ground truth; an oracle baseline and the yardstick for judge quality.

The vote judges take the label-free rules of `judge`: the `min_share` gate (RESTRAIN, ScPO),
Self-Harmony's cross-view label for co_reward (`cross_view: harmonic`), the validity check
(`validity`, self_improve/judges/validity.py: invalid responses do not vote and get the lowest reward) and a
frozen judge (`frozen`: the base model's P(Yes) weighs each answer's votes).

CREAM's consistency (when asked for): per prompt, Kendall tau between the ranking of its samples
by this judge and by the previous iteration's model (the reference, scoring each sample by its
mean token log-prob), stored as ``consistency`` = (tau + 1) / 2 for the train stage.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import pandas as pd

from self_improve import templates
from self_improve.config import CrossView, FrozenJudge, JudgeConfig, JudgeMethod, JudgeMode, LowConsensus
from self_improve.judges.rubric import mean_score, parse_score, render
from self_improve.judges.validity import invalid_reason
from self_improve.quality import consistency_from_tau, kendall_tau, roc_auc

Verify = Callable[..., Optional[float]]  # (answer, gold, category=None) -> 1.0 / 0.0 / None

MAX_POINTS = 5


@dataclass
class Verdicts:
    reward: list[Optional[float]]
    label: Optional[list[Optional[str]]] = None  # a pseudo-label (vote judges)
    parse_rate: Optional[list[Optional[float]]] = None  # share of judge outputs that parsed
    penalised: Optional[list[bool]] = None  # judge.low_consensus penalise: the sample's prompt had no label


@dataclass
class ModelHandle:
    model: "torch.nn.Module"  # noqa: F821 - torch is imported only by the judges that run a model
    tokenizer: object

    def context(self, max_length: int | None = None) -> int:
        """Tokens a prompt plus its answer may take: the model's positions, capped by model.max_length."""
        positions = int(getattr(self.model.config, "max_position_embeddings", 2048))
        return min(positions, max_length) if max_length else positions


@dataclass
class JudgeContext:
    """What model-based judges need: the policy (it wrote the samples) and its predecessor."""

    policy: Optional[ModelHandle] = None
    reference: Optional[ModelHandle] = None
    template: Optional[str] = None
    seed: int = 0
    batch_size: int = 256
    max_tokens: int = 8192  # padded tokens per scoring forward pass
    max_length: int | None = None  # model.max_length
    progress: bool = True
    verify: Optional[Verify] = None  # the task's check of an answer against the gold (None: no ground truth)
    question: Callable[[str], str] = lambda prompt: prompt  # the task's question without its instruction
    frozen: Optional[ModelHandle] = None  # judge.frozen: the base model, adapters off
    frozen_template: Optional[str] = None  # judge.correct_template, for the frozen judge
    _scores: dict = field(default_factory=dict)

    def frozen_yes(self, samples: pd.DataFrame) -> list[Optional[float]]:
        """The frozen base model's P(Yes) for "is this answer correct?" on every sample (computed once)."""
        if "frozen_yes" not in self._scores:
            if self.frozen is None or self.frozen_template is None:
                raise ValueError("judge.frozen needs the base model and judge.correct_template")
            sub = JudgeContext(policy=self.frozen, template=self.frozen_template, batch_size=self.batch_size,
                               max_tokens=self.max_tokens, max_length=self.max_length, progress=self.progress)
            cfg = JudgeConfig(method=JudgeMethod.llm_judge, mode=JudgeMode.yes_logprob)
            self._scores["frozen_yes"] = _logprob_judge(samples, cfg, sub).reward
        return self._scores["frozen_yes"]

    def scores(self, which: str, samples: pd.DataFrame):
        """Log-prob scores of every sample under `policy` or `reference` (computed once)."""
        if which not in self._scores:
            from self_improve.engines.hf import score

            handle = getattr(self, which)
            if handle is None:
                raise ValueError(f"this judge needs the {which} model")
            self._scores[which] = score(handle.model, handle.tokenizer, list(samples["prompt"]),
                                        list(samples["response"]), batch_size=self.batch_size,
                                        desc=f"score ({which})", progress=self.progress,
                                        max_tokens=self.max_tokens)
        return self._scores[which]


def template_path(params, key: str | None = None) -> Path:
    """The judge's prompt file (judge.template, or judge.correct_template for mode yes_logprob):
    the user's file, or the packaged template of that name."""
    if key is None:
        key = "correct_template" if params.judge.mode == JudgeMode.yes_logprob else "template"
    return templates.resolve(getattr(params.judge, key))


def answer_scores(preds: list[str | None]) -> dict[str, float]:
    """Each answer's vote share over all `preds` (a sample without an answer counts, voting for none)."""
    counts = Counter(p for p in preds if p is not None)
    return {a: c / len(preds) for a, c in counts.items()}


def frozen_weights(preds: list[str | None], frozen: list[float | None]) -> dict[str, float]:
    """Each answer's mean frozen P(Yes) over its samples (0 where none was judged)."""
    out = {}
    for a in set(p for p in preds if p is not None):
        ps = [f for p, f in zip(preds, frozen) if p == a and f is not None]
        out[a] = sum(ps) / len(ps) if ps else 0.0
    return out


def harmonic_scores(preds: list[str | None], variants: list[int]) -> dict[str, float]:
    """Self-Harmony: per answer, 2 p0 p1 / (p0 + p1) of its shares p0 among the original wording's
    samples and p1 among its rewrites' samples; an answer missing from either view scores 0."""
    views = [[p for p, v in zip(preds, variants) if (v == 0) == original] for original in (True, False)]
    if not all(views):
        return {}
    p0, p1 = (answer_scores(view) for view in views)
    return {a: 2 * p0[a] * p1[a] / (p0[a] + p1[a]) if a in p0 and a in p1 else 0.0
            for a in set(p0) | set(p1)}


def top_answer(scores: dict[str, float], gate: float, gate_scores: dict[str, float] | None = None) -> str | None:
    """The highest-scoring answer if it is unique and its gate score (its vote share unless given)
    reaches `gate`."""
    if not scores:
        return None
    (top, best), *rest = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))
    if best <= 0 or (rest and rest[0][1] == best):
        return None  # a tie has no majority
    if (gate_scores if gate_scores is not None else scores).get(top, 0.0) < gate:
        return None
    return top


def vote_label(preds: list[str | None], min_share: float) -> str | None:
    """Plurality answer of `preds` if it is unique and has at least `min_share` of all votes."""
    return top_answer(answer_scores(preds), min_share)


def _vote_by(key: str, share_reward: bool = False) -> Callable[[pd.DataFrame, JudgeConfig, JudgeContext], Verdicts]:
    """Vote judges over the samples sharing `key`: the label is the top answer (by vote share, by
    Self-Harmony's cross-view score for co_reward with cross_view harmonic, times the frozen judge's
    P(Yes) when on). The reward is 1 for agreeing with the label and 0 otherwise, or with
    `share_reward` (ScPO) the score of the sample's own answer; no label: no verdict."""
    def judge(samples: pd.DataFrame, cfg: JudgeConfig, ctx: JudgeContext) -> Verdicts:
        preds = [p if isinstance(p, str) else None for p in samples["pred"]]
        frozen = ctx.frozen_yes(samples) if cfg.frozen != FrozenJudge.none else None
        harmonic = key == "group_id" and cfg.cross_view == CrossView.harmonic
        label = [None] * len(samples)
        reward: list[Optional[float]] = [None] * len(samples)
        penalised = [False] * len(samples)
        penalise = cfg.low_consensus == LowConsensus.penalise
        positions: dict[str, list[int]] = {}
        for i, k in enumerate(samples[key]):
            positions.setdefault(k, []).append(i)
        variants = list(samples["variant"]) if harmonic else None
        for idx in positions.values():
            ps = [preds[i] for i in idx]
            fz = [frozen[i] for i in idx] if frozen is not None else None
            shares = answer_scores(ps)
            scores = harmonic_scores(ps, [variants[i] for i in idx]) if harmonic else dict(shares)
            if fz is not None:
                weights = frozen_weights(ps, fz)
                scores = {a: s * weights.get(a, 0.0) for a, s in scores.items()}
            top = top_answer(scores, cfg.min_harmony) if harmonic else top_answer(scores, cfg.min_share, shares)
            if top is None:
                if penalise:  # RESTRAIN: a prompt without a trustworthy majority: every sample wrong
                    for i in idx:
                        reward[i], penalised[i] = 0.0, True
                continue
            for i, p in zip(idx, ps):
                label[i] = top
                reward[i] = scores.get(p, 0.0) if share_reward else (1.0 if p == top else 0.0)
        return Verdicts(reward, label, penalised=penalised)

    return judge


def _cat(c) -> Optional[str]:
    return c if isinstance(c, str) else None


def _verifier(samples: pd.DataFrame, cfg: JudgeConfig, ctx: JudgeContext) -> Verdicts:
    if ctx.verify is None:
        raise ValueError("judge.method verifier needs the task's check of an answer (JudgeContext.verify)")
    reward = [ctx.verify(p if isinstance(p, str) else None, a if isinstance(a, str) else None, _cat(c))
              for p, a, c in zip(samples["pred"], samples["answer"], samples["category"])]
    label = [a if isinstance(a, str) else None for a in samples["answer"]]
    return Verdicts(reward, label)


def _self_certainty(samples: pd.DataFrame, cfg: JudgeConfig, ctx: JudgeContext) -> Verdicts:
    return Verdicts([float(x) for x in ctx.scores("policy", samples).self_certainty])


def _implicit_reward(samples: pd.DataFrame, cfg: JudgeConfig, ctx: JudgeContext) -> Verdicts:
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


def _logprob_judge(samples: pd.DataFrame, cfg: JudgeConfig, ctx: JudgeContext) -> Verdicts:
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


def _llm_judge(samples: pd.DataFrame, cfg: JudgeConfig, ctx: JudgeContext) -> Verdicts:
    if ctx.policy is None or ctx.template is None:
        raise ValueError("llm_judge needs the policy model and the rubric template")
    if cfg.mode != JudgeMode.generate:
        return _logprob_judge(samples, cfg, ctx)
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


@dataclass(frozen=True)
class Judge:
    fn: Callable[[pd.DataFrame, JudgeConfig, JudgeContext], Verdicts]
    uses_ground_truth: bool = False
    needs_policy: bool = False
    needs_reference: bool = False
    needs_template: bool = False
    verdict: bool = True  # rewards are verdicts in [0, 1] (>= 0.5: judged right); else a ranking


REGISTRY: dict[JudgeMethod, Judge] = {
    JudgeMethod.majority_vote: Judge(_vote_by("prompt_id")),
    JudgeMethod.co_reward: Judge(_vote_by("group_id")),  # the views: JudgeMethod.needs_rewrites
    JudgeMethod.vote_share: Judge(_vote_by("prompt_id", share_reward=True)),
    JudgeMethod.llm_judge: Judge(_llm_judge, needs_policy=True, needs_template=True),
    JudgeMethod.self_certainty: Judge(_self_certainty, needs_policy=True, verdict=False),
    JudgeMethod.implicit_reward: Judge(_implicit_reward, needs_policy=True, needs_reference=True,
                                       verdict=False),
    JudgeMethod.verifier: Judge(_verifier, uses_ground_truth=True),
}


def consistency(samples: pd.DataFrame, reward: list[Optional[float]], ctx: JudgeContext) -> list[Optional[float]]:
    """CREAM: per prompt, (tau + 1) / 2 between the judge's ranking and the reference model's."""
    ref = ctx.scores("reference", samples)
    ref_mean = [lp / max(1, n) for lp, n in zip(ref.logp, ref.tokens)]
    frame = pd.DataFrame({"pid": samples["prompt_id"].to_numpy(), "reward": reward, "ref": ref_mean})
    out: dict[str, Optional[float]] = {}
    for pid, group in frame.groupby("pid", sort=False):
        scored = group.dropna(subset=["reward"])
        if len(scored) < 2:
            out[pid] = None
            continue
        out[pid] = consistency_from_tau(kendall_tau(list(scored["reward"]), list(scored["ref"])))
    return [out[p] for p in samples["prompt_id"]]


def judge_samples(samples: pd.DataFrame, cfg: JudgeConfig, ctx: JudgeContext | None = None,
                  with_consistency: bool = False) -> pd.DataFrame:
    """Add `reward`, `label`, `parse_rate` (the configured judge), `consistency` (CREAM, when
    asked for), `valid` (judge.validity), `frozen_yes` (judge.frozen) and `correct` (the verifier,
    to measure only).

    With judge.validity, invalid responses (self_improve/judges/validity.py) do not vote (their answer is
    hidden from the judge) and get the lowest reward: 0 for verdicts, the lowest reward given for a
    ranking."""
    ctx = ctx or JudgeContext()
    judge = REGISTRY[cfg.method]
    # self-judges never see the ground truth
    visible = samples if judge.uses_ground_truth else samples.assign(answer=None)
    n = len(samples)
    valid: list[Optional[bool]] = [None] * n
    if cfg.validity:
        valid = [invalid_reason(ctx.question(q), r if isinstance(r, str) else "",
                                p if isinstance(p, str) else None, cfg.restates.value) is None
                 for q, r, p in zip(samples["prompt"], samples["response"], samples["pred"])]
        visible = visible.assign(pred=[p if ok else None for p, ok in zip(visible["pred"], valid)])
    v = judge.fn(visible, cfg, ctx)
    reward = list(v.reward)
    if cfg.validity:
        given = [r for r in reward if r is not None]
        lowest = 0.0 if judge.verdict else (min(given) if given else None)
        reward = [r if ok else lowest for r, ok in zip(reward, valid)]
    out = samples.copy()
    out["reward"] = pd.array(reward, dtype="Float64")
    out["valid"] = pd.array(valid, dtype="boolean")
    out["frozen_yes"] = pd.array(ctx._scores.get("frozen_yes", [None] * n), dtype="Float64")
    out["label"] = pd.array(v.label if v.label is not None else [None] * n, dtype="string")
    out["parse_rate"] = pd.array(v.parse_rate if v.parse_rate is not None else [None] * n, dtype="Float64")
    out["penalised"] = pd.array(v.penalised if v.penalised is not None else [None] * n, dtype="boolean")
    cons = consistency(visible, v.reward, ctx) if with_consistency else [None] * n
    out["consistency"] = pd.array(cons, dtype="Float64")
    out["correct"] = pd.array(
        [ctx.verify(p if isinstance(p, str) else None, a if isinstance(a, str) else None, _cat(c))
         for p, a, c in zip(samples["pred"], samples["answer"], samples["category"])]
        if ctx.verify is not None else [None] * n,
        dtype="Float64",
    )
    return out


def _pairwise_accuracy(scored: pd.DataFrame) -> float | None:
    """Within each prompt, over (correct, wrong) sample pairs: share ranked right (ties 1/2)."""
    hits, total = 0.0, 0
    for _, g in scored.groupby("prompt_id", sort=False):
        r = g["reward"].astype(float).to_numpy()
        c = g["correct"].astype(float).to_numpy() >= 0.5
        good, bad = r[c], r[~c]
        if len(good) and len(bad):
            diff = good[:, None] - bad[None, :]
            hits += float((diff > 0).sum() + 0.5 * (diff == 0).sum())
            total += diff.size
    return hits / total if total else None


def judge_quality(judgments: pd.DataFrame, verdict: bool = True,
                  verify: Optional[Verify] = None) -> dict[str, float | None]:
    """How far the self-judge can be trusted, where ground truth exists.

    judge_accuracy: for verdict judges, agreement of the binary verdict (reward >= 0.5) with the
    verifier over the samples the judge scored; for ranking judges (self_certainty,
    implicit_reward), the share of (correct, wrong) sample pairs of one prompt that the judge ranks
    the right way round. judge_auc: ROC AUC of reward against correctness over all scored samples.
    label_accuracy / label_coverage: pseudo-labels (vote judges). judged_share: samples with a
    verdict. parse_failure_rate (llm_judge): share of judge outputs that did not parse, over the
    samples it was asked to judge.
    """
    scored = judgments.dropna(subset=["reward", "correct"])
    out: dict[str, float | None] = {
        "judge_accuracy": None,
        "judge_auc": None,
        "label_accuracy": None,
        "label_coverage": None,
        "reward_mean": None,
        "judged_share": None,
        "parse_failure_rate": None,
    }
    if len(judgments):
        out["judged_share"] = float(judgments["reward"].notna().mean())
    if len(judgments.dropna(subset=["reward"])):
        out["reward_mean"] = float(judgments["reward"].dropna().astype(float).mean())
    if len(scored):
        if verdict:
            agree = (scored["reward"].astype(float) >= 0.5) == (scored["correct"].astype(float) >= 0.5)
            out["judge_accuracy"] = float(agree.mean())
        else:
            out["judge_accuracy"] = _pairwise_accuracy(scored)
        out["judge_auc"] = roc_auc(list(scored["reward"].astype(float)), list(scored["correct"].astype(float)))
    if "parse_rate" in judgments and judgments["parse_rate"].notna().any():
        out["parse_failure_rate"] = float(1 - judgments["parse_rate"].dropna().astype(float).mean())
    if judgments["label"].notna().any():
        per_prompt = judgments.drop_duplicates("prompt_id")
        labelled = per_prompt[per_prompt["label"].notna() & per_prompt["answer"].notna()]
        out["label_coverage"] = float(per_prompt["label"].notna().mean())
        if len(labelled) and verify is not None:
            out["label_accuracy"] = float(sum(
                verify(str(lab), str(gold), _cat(c)) or 0.0
                for lab, gold, c in zip(labelled["label"], labelled["answer"], labelled["category"])
            ) / len(labelled))
    return out

