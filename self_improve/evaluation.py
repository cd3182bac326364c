"""How good a model is, and how good its iteration's self-judge was: the evaluate stage's metrics.

Two protocols on the model after the iteration: `accuracy` (greedy) and `maj_accuracy` (maj@k)
on the held-out set, disjoint from every training prompt (generalisation), and `ttt_accuracy`
(greedy) on the test-time set, whose prompts, never answers, the loop may train on (the
protocol of TTRL). For the iteration's own samples: reward, judge quality, pairs, training.
With a user's prompt file, accuracy covers the rows that have answers, and `win_rate` is the share
of held-out prompts on which the new model's answer beats the previous model's, as the new model
judges them with the rubric (Self-Rewarding's llm_judge; ties count 1/2).
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import numpy as np
import pandas as pd

from self_improve import artifacts as art
from self_improve import choice
from self_improve.config import (
    EvaluateConfig,
    JudgeConfig,
    JudgeMode,
    Params,
    judge_of,
)
from self_improve.engines.hf import Generations, SamplingSpec, generate
from self_improve.engines.sampler import Sampler
from self_improve.floors import metric_name
from self_improve.judges import (
    JudgeContext,
    ModelHandle,
    frozen_context,
    judge_quality,
    vote_label,
)
from self_improve.judges.validity import invalid_reason, numbers
from self_improve.quality import auc_se, binomial_se, cluster_se, paired_gain, win_rate
from self_improve.tasks import Task

EXAMPLES = 3  # best and worst judged samples kept per iteration
PAIR_EXAMPLES = 5


def category_mix(prompts: pd.DataFrame) -> dict[str, float]:
    """Share of the iteration's prompts in each category (null category: "(none)")."""
    if prompts.empty:
        return {}
    shares = prompts["category"].fillna("(none)").value_counts(normalize=True)
    return {f"{art.MIX_PREFIX}{k}": float(v) for k, v in sorted(shares.items())}


def judged_examples(judgments: pd.DataFrame, n: int = EXAMPLES) -> pd.DataFrame:
    """The `n` best and `n` worst judged samples (no verdict: left out); ties by sample id."""
    scored = judgments.dropna(subset=["reward"]).assign(reward=lambda d: d["reward"].astype(float))
    best = scored.sort_values(["reward", "sample_id"], ascending=[False, True]).head(n).assign(rank="best")
    worst = scored.sort_values(["reward", "sample_id"], ascending=[True, True]).head(n).assign(rank="worst")
    return pd.concat([best, worst])[art.JUDGED_EXAMPLE_COLUMNS].reset_index(drop=True)


def pair_examples(pairs: pd.DataFrame, n: int = PAIR_EXAMPLES) -> pd.DataFrame:
    return pairs.sort_values("prompt_id").head(n)[art.PAIR_EXAMPLE_COLUMNS].reset_index(drop=True)


def records(df: pd.DataFrame) -> list[dict]:
    """JSON rows: missing values as null, numbers as Python numbers."""
    return df.astype(object).where(df.notna(), None).to_dict("records")


def dataset_record(path: str, rows: pd.DataFrame) -> dict:
    """What MLflow gets of an artifact it does not store: where it is, its bytes' md5 (DVC's
    content hash of a file), and its row count."""
    return {"source": path, "digest": hashlib.md5(Path(path).read_bytes()).hexdigest(), "rows": len(rows)}


def accuracy(preds: list[str | None], answers: list[str], task: Task, categories: list | None = None) -> float:
    cats = [c if isinstance(c, str) else None for c in categories] if categories is not None else [None] * len(preds)
    return float(sum(task.verify(p, a, c) for p, a, c in zip(preds, answers, cats, strict=True)) / max(1, len(answers)))


SETS = (("accuracy", "heldout", "heldout_n"), ("ttt_accuracy", "ttt", "ttt_n"))  # metric, set, size


def _answer_rows(task: Task, set_name: str, df: pd.DataFrame, res, preds: list) -> list[dict]:
    """The EVAL rows of one set's greedy answers: the answer, whether it is right, cut short, valid
    (no invalid reason) and a restatement of a number of the question (None for open tasks)."""
    question = getattr(task, "question", lambda prompt: prompt)

    def valid(prompt: str, response: str, pred: str | None) -> bool | None:
        if pred is None or task.open_ended:
            return None
        return invalid_reason(question(prompt), response, pred) is None

    def restates(prompt: str, pred: str | None) -> bool | None:
        if pred is None or task.open_ended:
            return None
        return pred in numbers(question(prompt))

    return [{"set": set_name, "prompt_id": pid, "category": cat if isinstance(cat, str) else None,
             "answer": gold, "response": r[0], "pred": pred,
             "correct": float(task.verify(pred, gold, cat if isinstance(cat, str) else None)), "truncated": t[0],
             "valid": valid(prompt, r[0], pred), "restates": restates(prompt, pred)}
            for pid, prompt, gold, r, pred, t, cat in zip(df["prompt_id"], df["prompt"], df["answer"], res, preds,
                                                          res.truncated, df["category"])]


def _set_accuracy(name: str, df: pd.DataFrame, preds: list, task: Task) -> dict[str, float]:
    """One set's greedy accuracy, its standard error, and per category (a word_math level, a
    reasoning-gym dataset) as `<name>/<category>` where the set has more than one."""
    out = {name: accuracy(preds, list(df["answer"]), task, list(df["category"]))}
    out[f"{name}_se"] = binomial_se(out[name], len(df))  # one greedy answer per problem
    cats = df["category"].fillna("(none)")
    if cats.nunique() > 1:
        for cat in sorted(cats.unique()):
            on = (cats == cat).to_numpy()
            out[f"{name}/{metric_name(cat)}"] = accuracy([p for p, o in zip(preds, on) if o], list(df["answer"][on]),
                                                         task, list(df["category"][on]))
    return out


def model_metrics(sampler: Sampler, heldout: pd.DataFrame, ttt: pd.DataFrame, cfg: EvaluateConfig,
                  seed: int, task: Task, progress: bool = True, answers: list | None = None,
                  base_samples: bool = False, stop_at=None) -> dict[str, float]:
    """Accuracy protocols over the rows that have an answer (a user's prompt file may have none),
    the share of greedy answers cut by `evaluate.max_new_tokens` (`eval_truncated_share`) and the
    share from which no answer could be read (`eval_extract_failure_rate`). `answers`, when given,
    receives each problem's greedy answer (EVAL rows) for the paired comparison of iterations, and
    with `base_samples` (the base model, it0) also `evaluate.support_k` sampled answers to each test-time
    problem in both wordings (set `choice.SAMPLE_SET`: the base support of the label-free choice).
    `stop_at`: the task's answer stop (sample.stop_at_answer), for every response generated here."""
    greedy = SamplingSpec(n=1, greedy=True, max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size,
                          stop_at=stop_at)
    heldout, ttt = heldout[heldout["answer"].notna()], ttt[ttt["answer"].notna()]
    out: dict[str, float] = {}
    cut: list[bool] = []
    failed: list[bool] = []
    sets = [(*s, df) for s, df in zip(SETS, (heldout, ttt))]
    if answers is not None:  # the label-free signals' second wording of each test-time problem
        sets.append((None, choice.VIEW_SET, None, rewritten(task, ttt, seed)))
    for name, set_name, size, df in sets:
        if df.empty:
            continue
        res = sampler.generate(list(df["prompt"]), greedy, seed, desc=name or set_name, progress=progress)
        preds = [task.extract(r[0]).answer for r in res]
        if answers is not None:
            answers += _answer_rows(task, set_name, df, res, preds)
        if answers is not None and base_samples and set_name != "heldout":
            answers += support_samples(sampler, df, cfg, seed, task, progress, desc=f"{set_name} base samples",
                                       stop_at=stop_at)
        if name is None:
            continue
        out.update(_set_accuracy(name, df, preds, task))
        out[size] = len(df)
        cut += [t[0] for t in res.truncated]
        failed += [p is None for p in preds]
    if cut:
        out["eval_truncated_share"] = sum(cut) / len(cut)
        out["eval_extract_failure_rate"] = sum(failed) / len(failed)
    if heldout.empty or cfg.k == 0:
        return out
    sampled = SamplingSpec(n=cfg.k, temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens,
                           batch_size=cfg.batch_size, stop_at=stop_at)
    res = sampler.generate(list(heldout["prompt"]), sampled, seed, desc="maj@k", progress=progress)
    votes = [vote_label([task.extract(x).answer for x in r], 0.0) for r in res]  # a tie: no answer
    out["maj_accuracy"] = accuracy(votes, list(heldout["answer"]), task, list(heldout["category"]))
    out["maj_accuracy_se"] = binomial_se(out["maj_accuracy"], len(heldout))
    return out


class Replay:
    """The sampler of an iteration whose model is its predecessor's (the loop stopped before it): each
    greedy answer the predecessor's evaluation recorded (`answers`: prompt -> (response, truncated)) is
    given again instead of generated again; any other request (sampled answers, a prompt not recorded)
    goes to the real engine, opened (`open_real`) on first use."""

    backend = "replay"

    def __init__(self, answers: dict[str, tuple[str, bool]], open_real):
        self.answers, self.open_real, self.real = answers, open_real, None

    def generate(self, prompts, spec, seed, desc="generate", progress=True) -> Generations:
        if spec.greedy and spec.n == 1 and all(p in self.answers for p in prompts):
            return Generations([[self.answers[p][0]] for p in prompts], [[self.answers[p][1]] for p in prompts])
        if self.real is None:
            self.real = self.open_real()
        return self.real.generate(prompts, spec, seed, desc=desc, progress=progress)

    def close(self) -> None:
        close = getattr(self.real, "close", None)
        if close is not None:
            close()


def recorded_answers(prev_eval: pd.DataFrame, heldout: pd.DataFrame, ttt: pd.DataFrame, seed: int,
                     task: Task) -> dict[str, tuple[str, bool]]:
    """The greedy answers of an evaluation (its eval.parquet) by prompt text: the sets model_metrics
    answers greedily (held-out, test-time, the test-time problems' second wording), their prompts
    looked up by prompt_id as model_metrics builds them with the same `seed`."""
    prompts = {(set_name, pid): prompt for set_name, df in (*zip((s for _, s, _ in SETS), (heldout, ttt)),
                                                            (choice.VIEW_SET, rewritten(task, ttt, seed)))
               for pid, prompt in zip(df["prompt_id"], df["prompt"])}
    return {prompts[(s, pid)]: (response, bool(cut))
            for s, pid, response, cut in zip(prev_eval["set"], prev_eval["prompt_id"], prev_eval["response"],
                                             prev_eval["truncated"]) if (s, pid) in prompts}


def support_samples(sampler: Sampler, df: pd.DataFrame, cfg: EvaluateConfig, seed: int, task: Task,
                    progress: bool = True, desc: str = "base samples", stop_at=None) -> list[dict]:
    """The base model's `evaluate.support_k` sampled answers (at `evaluate.temperature`) to each of
    `df`'s problems, as EVAL rows of set `choice.SAMPLE_SET`: the label-free choice's base support.
    None for an open task or `support_k` 0."""
    if df.empty or cfg.support_k == 0 or task.open_ended:
        return []
    spec = SamplingSpec(n=cfg.support_k, temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens,
                        batch_size=cfg.batch_size, stop_at=stop_at)
    drawn = sampler.generate(list(df["prompt"]), spec, seed, desc=desc, progress=progress)
    return [{"set": choice.SAMPLE_SET, "prompt_id": pid, "category": cat if isinstance(cat, str) else None,
             "answer": gold, "response": x,
             "pred": (pred := task.extract(x).answer),
             "correct": float(task.verify(pred, gold, cat if isinstance(cat, str) else None)),
             "truncated": t, "valid": None, "restates": None}
            for pid, gold, r, ts, cat in zip(df["prompt_id"], df["answer"], drawn, drawn.truncated, df["category"])
            for x, t in zip(r, ts)]


def rewritten(task: Task, ttt: pd.DataFrame, seed: int) -> pd.DataFrame:
    """One equivalent rewrite of each test-time problem, the same at every iteration (seeded by the
    run's seed, not the iteration), its prompt_id the problem's: the task's own second wording where it
    has one (`view(prompt)`, reasoning_gym's arithmetic), else a rewrite of the parsed problem; none for a
    task without either (files, open prompts) or a prompt it cannot parse."""
    view = getattr(task, "view", None)
    if not ttt.empty and callable(view):
        rows = [{**row, "prompt": other} for row in ttt.to_dict("records") if (other := view(row["prompt"]))]
        return pd.DataFrame(rows, columns=ttt.columns)
    if ttt.empty or not hasattr(task, "rewrites") or not hasattr(task, "parse"):
        return ttt.iloc[:0]
    rng = random.Random(f"{seed}-views")
    rows = []
    for row in ttt.to_dict("records"):
        try:
            problem = task.parse(row["prompt"])
        except ValueError:
            continue
        views = task.rewrites(problem, 1, rng, set())
        if views:
            rows.append({**row, "prompt": views[0].prompt})
    return pd.DataFrame(rows, columns=ttt.columns)


def frozen_yes(answers: pd.DataFrame, ttt: pd.DataFrame, params: Params, base: str) -> pd.DataFrame:
    """judge.frozen: the base model's (adapters off) P(Yes) for each test-time greedy answer."""
    from self_improve.judges.model import frozen_yes as base_yes
    from self_improve.models.loading import load_model

    rows = answers["set"] == "ttt"
    prompts = ttt.set_index("prompt_id")["prompt"]
    frame = pd.DataFrame({"prompt": list(prompts.loc[answers.loc[rows, "prompt_id"]]),
                          "response": list(answers.loc[rows, "response"])})
    ctx = frozen_context(params, ModelHandle(*load_model(base, security=params.security, model_cfg=params.model)))
    answers = answers.copy()
    answers["frozen_yes"] = pd.array([None] * len(answers), dtype="Float64")
    answers.loc[rows, "frozen_yes"] = pd.array(base_yes(frame, ctx), dtype="Float64")
    return answers


def gains(base: pd.DataFrame, new: pd.DataFrame) -> dict[str, float]:
    """The gain in greedy accuracy from the base model's answers to these, on the problems both
    answered, with its paired bootstrap 95% interval: `accuracy_gain`, `accuracy_gain_lo`, ...;
    for `ttt_accuracy` likewise; and per category where a set has several (`accuracy_gain/<category>`,
    `accuracy_gain_lo/<category>`, ...)."""
    out: dict[str, float] = {}
    for name, set_name, _ in SETS:
        b = base[base["set"] == set_name].set_index("prompt_id")["correct"]
        rows = new[new["set"] == set_name]
        n = rows.set_index("prompt_id")["correct"]
        both = b.index.intersection(n.index)
        cats = rows.set_index("prompt_id")["category"].fillna("(none)")
        parts = [("", both)]
        if cats.loc[both].nunique() > 1:
            parts += [(f"/{metric_name(c)}", both[(cats.loc[both] == c).to_numpy()])
                      for c in sorted(cats.loc[both].unique())]
        for tail, ids in parts:
            g = paired_gain(b.loc[ids], n.loc[ids]) if len(ids) else None
            if g is not None:
                out.update({f"{name}_gain{tail}": g["gain"], f"{name}_gain_lo{tail}": g["lo"],
                            f"{name}_gain_hi{tail}": g["hi"]})
    return out


def train_coverage(prompts: pd.DataFrame, heldout: pd.DataFrame) -> dict[str, float]:
    """`train_coverage`: over the held-out set's categories, the lowest ratio of a category's share of
    the iteration's prompts to its share of the held-out set (1: trained as often as evaluated; 0: a
    category evaluated and never trained on). None for a held-out set of one category or none."""
    held = heldout["category"].fillna("(none)").value_counts(normalize=True)
    if len(held) < 2 or prompts.empty:
        return {}
    mix = prompts["category"].fillna("(none)").value_counts(normalize=True)
    return {"train_coverage": float(min(mix.get(c, 0.0) / share for c, share in held.items()))}


def head_to_head(new: ModelHandle, old: ModelHandle, heldout: pd.DataFrame, judge_cfg: JudgeConfig,
                 template: str, max_new_tokens: int, batch_size: int, seed: int,
                 max_length: int | None = None) -> dict:
    """Win rate of the new model against the previous one on the held-out prompts: each answers
    greedily, the new model judges both answers with the rubric (llm_judge); ties count 1/2."""
    prompts = list(heldout["prompt"])
    spec = SamplingSpec(n=1, greedy=True, max_new_tokens=max_new_tokens, batch_size=batch_size)
    answers = {}
    for name, handle in (("new", new), ("old", old)):
        outs = generate(handle.model, handle.tokenizer, prompts, spec, seed, desc=name)
        answers[name] = [r[0] for r in outs]
    frame = pd.DataFrame({"prompt_id": [f"{i}-{k}" for k in ("new", "old") for i in range(len(prompts))],
                          "prompt": prompts * 2, "response": answers["new"] + answers["old"]})
    ctx = JudgeContext(policy=new, template=template, seed=seed, batch_size=batch_size, max_length=max_length)
    mode = JudgeMode.score_logprob if judge_cfg.mode == JudgeMode.yes_logprob else judge_cfg.mode  # the rubric
    every_prompt = judge_cfg.model_copy(update={"max_prompts": None, "mode": mode})
    verdicts = judge_of("llm_judge").function()(frame, every_prompt, ctx)
    n = len(prompts)
    result = win_rate(verdicts.reward[:n], verdicts.reward[n:])
    return {f"win_{k}" if k != "win_rate" else k: v for k, v in result.items()}


def vote_signals(judgments: pd.DataFrame) -> dict[str, float | None]:
    """What the samples say without gold: `vote_share`, the mean share of a prompt's samples that
    give its most frequent answer (no answer counts as a vote for none); `distinct_answers` per
    prompt; `cross_view_agreement`, over problems asked in several wordings, the share whose
    wordings' most frequent answers are one and the same."""
    if judgments.empty:
        return {"vote_share": None, "distinct_answers": None, "cross_view_agreement": None}
    preds = judgments.assign(pred=judgments["pred"].astype(object).where(judgments["pred"].notna(), None))
    shares, distinct, tops = [], [], {}
    for (group, variant), g in preds.groupby(["group_id", "variant"], sort=False):
        counts = g["pred"].dropna().value_counts()
        shares.append(float(counts.iloc[0]) / len(g) if len(counts) else 0.0)
        distinct.append(len(counts))
        tops.setdefault(group, []).append(counts.index[0] if len(counts) and
                                          (len(counts) == 1 or counts.iloc[0] > counts.iloc[1]) else None)
    views = [t for t in tops.values() if len(t) > 1]
    agree = [all(x is not None and x == t[0] for x in t) for t in views]
    return {"vote_share": float(np.mean(shares)), "distinct_answers": float(np.mean(distinct)),
            "cross_view_agreement": float(np.mean(agree)) if agree else None}


def label_coverage_by_category(judgments: pd.DataFrame) -> dict[str, float]:
    """`label_coverage/<category>`: per category, the share of its prompts with a pseudo-label (what
    judge.category_gate reads; a masked category reads 0). Label-free: no gold is read."""
    if judgments.empty or judgments["label"].isna().all():
        return {}
    per_prompt = judgments.drop_duplicates("prompt_id")
    cats = per_prompt["category"].fillna("(none)")
    if cats.nunique() < 2:
        return {}
    got = per_prompt["label"].notna().groupby(cats).mean()
    return {f"label_coverage/{metric_name(c)}": float(v) for c, v in sorted(got.items())}


def iteration_metrics(judgments: pd.DataFrame, pairs: pd.DataFrame, sft: pd.DataFrame, train: dict,
                      verdict: bool = True, task: Task | None = None) -> dict:
    q = judge_quality(judgments, verdict, *([task.verify] if task is not None else []))
    correct = judgments["correct"].dropna().astype(float)
    # standard errors with a problem (its samples and rewrites) as the unit: they are not independent
    groups = judgments.loc[correct.index, "group_id"]
    scored = judgments.dropna(subset=["reward", "correct"])
    agree = (scored["reward"].astype(float) >= 0.5) == (scored["correct"].astype(float) >= 0.5)
    noise = {
        "sample_accuracy_se": cluster_se(correct, groups),
        "judge_auc_se": (auc_se(scored["reward"], scored["correct"], scored["group_id"])
                         if q.get("judge_auc") is not None else None),
        "judge_accuracy_se": cluster_se(agree.astype(float), scored["group_id"]) if verdict else None,
    }
    valid, frozen = judgments["valid"].dropna(), judgments["frozen_yes"].dropna().astype(float)
    if len(valid):
        noise["invalid_share_se"] = cluster_se((~valid.astype(bool)).astype(float), judgments.loc[valid.index, "group_id"])
    if len(frozen):
        noise["frozen_yes_se"] = cluster_se(frozen, judgments.loc[frozen.index, "group_id"])
    variants = judgments.groupby("group_id")["variant"].nunique() if len(judgments) else pd.Series(dtype=float)
    return {
        **{k: v for k, v in q.items() if v is not None},
        **{k: v for k, v in noise.items() if v is not None},
        "sample_accuracy": float(correct.mean()) if len(correct) else None,
        "num_prompts": int(judgments["prompt_id"].nunique()),
        "num_samples": int(len(judgments)),
        "num_pairs": int(len(pairs)),
        "num_sft": int(len(sft)),
        "response_length": float(judgments["response"].str.len().mean()) if len(judgments) else None,
        "truncated_share": float(judgments["truncated"].astype(float).mean()) if len(judgments) else None,
        "extract_failure_rate": float(judgments["pred"].isna().mean()) if len(judgments) else None,
        "rewrites_per_problem": float((variants - 1).mean()) if len(variants) else None,
        # label-free signals: the validity check's rejections, the frozen judge's mean P(Yes)
        "invalid_share": float((~valid.astype(bool)).mean()) if len(valid) else None,
        "frozen_yes": float(frozen.mean()) if len(frozen) else None,
        **vote_signals(judgments),
        **label_coverage_by_category(judgments),
        **{k: v for k, v in train.items() if isinstance(v, (int, float))},
    }
