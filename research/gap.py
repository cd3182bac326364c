"""Every judge and label-free rule diagnosed on the base model's own samples, before any loop.

    make gap-smollm2       # the recipe's sizes, temperatures 0.3 / 0.7 / 1.0 -> research/results/gap_smollm2.*
    make lengths-smollm2   # step 1 only, at 48..256 new tokens -> research/results/lengths_smollm2.*
    python -m research.gap --recipe smollm2-gym --greedy-only --out research/results/gym_mix_smollm2.json
    python -m research.gap -S model.base=models/smollm2-135m-instruct -S task.name=word_math \\
        --judges verifier majority_vote scpo+validity --temperatures 0.3 1.0 --out reports/gap.json

With params.yaml and the -S overrides (as `dvc exp run -S` takes them): 1. the task's dev set
(`task.dev_size`, disjoint from held-out and test-time; `--on heldout` for the held-out set) answered
greedily by it0 (accuracy per category: where the task's difficulty sits; with --lengths,
accuracy and cut share at each length; the validity check on those answers with the gold beside
it); 2. it1's prompts proposed from that set as a loop proposes them from its test-time set (the
task's proposal, rewrites included, never a held-out problem) sampled `sample.k` times by it0 at
each temperature, and every rule of RULES run on the same samples: label precision (labels that are
right), coverage (prompts with a label, prompts with a pair), pair precision (chosen right and
rejected wrong), judge AUC, the share the validity check rejects and the right answers among them.
Judges that run a model (and the frozen judge, which at it0 is the policy) run at
`sample.temperature` only. Writes the figures as JSON and a Markdown table beside it; nothing in
data/ is touched.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd
import yaml

from self_improve import artifacts as art
from self_improve import recipes
from self_improve.stage import derive_seed
from self_improve.config import (
    FrozenJudge,
    JudgeConfig,
    JudgeMode,
    PairsConfig,
    load_params,
    parse_params,
)
from self_improve.engines.hf import SamplingSpec
from self_improve.judges import (
    JudgeContext,
    ModelHandle,
    judge_quality,
    judge_samples,
    template_path,
)
from self_improve.judges.rubric import load_template
from self_improve.judges.validity import REASONS, invalid_reason
from self_improve.models.loading import load_model, set_threads
from self_improve.pairs import build
from self_improve.tasks import ProposeInput, task_for


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-S", "--set", action="append", default=[], help="params override, key=value")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--recipe", help="a recipe (configs/recipes/<name>.yaml, or a YAML path) applied before the -S overrides")
    ap.add_argument("--judges", nargs="+", default=list(RULES),
                    help=f"rules: {', '.join(RULES)}; or a judge.method (llm_judge:<mode>)")
    ap.add_argument("--temperatures", type=float, nargs="+", default=None,
                    help="sample it0 at each (default sample.temperature); judges that run a model only at "
                         "sample.temperature")
    ap.add_argument("--greedy-only", action="store_true", help="only the greedy calibration (step 1)")
    ap.add_argument("--lengths", type=int, nargs="+", default=None,
                    help="step 1 at each response length: one greedy run at the longest, each answer cut at "
                         "every shorter length (greedy decoding is prefix-consistent), accuracy and cut share")
    ap.add_argument("--on", choices=("dev", "heldout"), default="dev",
                    help="the set diagnosed: dev (task.dev_size problems, disjoint from held-out and test-time: "
                         "choices fitted here are not scored on what they were fitted on) or heldout")
    ap.add_argument("--out", required=True, help="JSON figures; a .md table is written beside it")
    args = ap.parse_args(argv)
    raw = yaml.safe_load(Path(args.params).read_text())
    raw = recipes.apply(recipes.apply(raw, recipes.load(args.recipe)) if args.recipe else raw, args.set)
    params = parse_params(raw, args.params)
    load_params(args.params)  # the file itself must be valid too
    set_threads()
    t0 = time.perf_counter()
    task = task_for(params.task)
    sets = task.sets(derive_seed(params.seed, "split"), params.prepare.train_size)
    if args.on == "dev" and (sets.dev is None or sets.dev.empty):
        raise SystemExit("gap: --on dev needs a dev set: set -S task.dev_size=128 (word_math, reasoning_gym), "
                         "or diagnose the held-out set with --on heldout")
    # step 1 calibrates on this set; step 2's prompts are drawn from it (as a loop's from its test-time set)
    calib = sets.dev if args.on == "dev" else sets.heldout
    model, tok = load_model(params.model.base if not params.model.builtin else "data/it0/model",
                            security=params.security, model_cfg=params.model)
    from self_improve.engines.sampler import HFSampler, open_sampler
    from self_improve.sampling import sample

    sampler = (HFSampler(model, tok) if params.model.builtin else
               open_sampler(params.model.base, params.sample, params.security, model_cfg=params.model))
    given = {k: recipes.render(v) for k, v in recipes.load(args.recipe).items()} if args.recipe else {}
    result: dict = {"params": given | {k: v for k, v in (s.split("=", 1) for s in args.set)}, "set": args.on}

    # 1. where the task's difficulty sits: greedy accuracy per category on the dev (or held-out) set
    longest = max(args.lengths) if args.lengths else params.evaluate.max_new_tokens
    greedy = SamplingSpec(n=1, greedy=True, max_new_tokens=longest, batch_size=params.evaluate.batch_size)
    res = sampler.generate(list(calib["prompt"]), greedy, derive_seed(params.seed, "evaluate"), desc="greedy")
    if args.lengths:
        result["lengths"] = by_length(task, tok, calib, res, sorted(args.lengths))
        result["instruction"] = params.task.instruction
    preds = [task.extract(r[0]).answer for r in res]
    held = calib.assign(pred=preds, right=[task.verify(p, a, c) for p, a, c in zip(preds, calib["answer"], calib["category"])],
                        cut=[t[0] for t in res.truncated])
    result["greedy"] = {
        "accuracy": float(held["right"].mean()), "n": len(held),
        "extract_failure_rate": float(held["pred"].isna().mean()), "truncated_share": float(held["cut"].mean()),
        "by_category": {c: {"accuracy": float(g["right"].mean()), "n": len(g), "truncated_share": float(g["cut"].mean()),
                            "extract_failure_rate": float(g["pred"].isna().mean())}
                        for c, g in held.groupby("category")},
    }
    question = getattr(task, "question", lambda prompt: prompt)
    reasons = [invalid_reason(question(q), r[0], p) for q, r, p in zip(held["prompt"], res, preds)]
    n_right = max(1, int(held["right"].sum()))
    result["greedy"]["validity"] = {  # the validity check on it0's greedy answers, with the gold beside it
        "invalid_share": sum(x is not None for x in reasons) / len(reasons),
        "by_reason": {k: sum(x == k for x in reasons) / len(reasons) for k in REASONS},
        "right_rejected": sum(x is not None and bool(ok) for x, ok in zip(reasons, held["right"])) / n_right,
    }
    if args.greedy_only:
        print(json.dumps({k: result[k] for k in ("greedy", "lengths") if k in result}, indent=1))
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        out.with_suffix(".md").write_text(lengths_table(result) if args.lengths else greedy_table(result))
        return
    # 2. it1's prompts, sampled by it0 at each temperature, diagnosed under every rule
    # the base model writes the paraphrases of a task without rewrites of its own (file tasks,
    # reasoning_gym), as the evolve stage's writer does in a loop
    from self_improve.evolution import model_writer

    base_dir = params.model.base if not params.model.builtin else "data/it0/model"
    evolve_seed = derive_seed(params.seed, "evolve", "it1")
    inp = ProposeInput(params.evolve, "it1", evolve_seed, sets.dev if args.on == "dev" else sets.ttt, sets.heldout,
                       art.empty_table(art.JUDGMENTS), rewrites=True,
                       writer=model_writer(str(base_dir), params, evolve_seed))
    prompts = task.propose(inp)
    handle = ModelHandle(model, tok)
    temperatures = args.temperatures or [params.sample.temperature]
    result["samples"], result["judges"] = {}, {}
    for temperature in temperatures:
        scfg = params.sample.model_copy(update={"temperature": temperature})
        t = time.perf_counter()
        samples = sample(sampler, prompts, scfg, derive_seed(params.seed, "sample", "it1"), task)
        result["samples"][str(temperature)] = sample_stats(samples, task, params, time.perf_counter() - t)
        ctx = JudgeContext(policy=handle, reference=handle, frozen=handle,
                           seed=derive_seed(params.seed, "judge", "it1"), batch_size=params.sample.batch_size,
                           max_tokens=params.sample.score_tokens, max_length=params.model.max_length,
                           verify=task.verify, question=getattr(task, "question", lambda prompt: prompt),
                           frozen_template=load_template(template_path(params, "correct_template")),
                           inverse=getattr(task, "inverse", None),
                           extract=lambda response: task.extract(response).answer)
        model_based = temperature == params.sample.temperature
        result["judges"][str(temperature)] = {}
        for name in args.judges:
            cfg, pcfg = rule(name, params)
            judge = cfg.entry
            if not model_based and (judge.needs_policy or cfg.frozen != FrozenJudge.none):
                continue  # the model-based judges: at sample.temperature only
            ctx.template = (load_template(template_path(params.model_copy(update={"judge": cfg})))
                            if judge.needs_template else None)
            t = time.perf_counter()
            judged = judge_samples(samples, cfg, ctx)
            q = diagnose(judged, cfg, pcfg, judge.verdict, task.verify, derive_seed(params.seed, "pairs", "it1"))
            q["seconds"] = round(time.perf_counter() - t, 1)
            if cfg.inverse:  # how often an answer's inverse came back, for right and for wrong answers
                q.update(inverse_rates(judged, ctx, "group_id" if cfg.entry.needs_rewrites else "prompt_id"))
            if cfg.method == "llm_judge" and cfg.mode == JudgeMode.yes_logprob:
                # at it0 the frozen judge is the policy itself: its P(Yes) on these samples is this one
                ctx._scores.setdefault("frozen_yes", [None if pd.isna(x) else float(x) for x in judged["reward"]])
            result["judges"][str(temperature)][name] = q
            print(temperature, name, json.dumps(q))
    result["seconds"] = round(time.perf_counter() - t0, 1)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    out.with_suffix(".md").write_text(table(result))
    print(table(result))


ROOT = Path(__file__).resolve().parents[1]
# the label-free rules and the control arms (configs/rules/<name>.yaml), and the judge that runs a model
RULES = [*recipes.rules(ROOT), "llm_judge:yes_logprob"]


def rule_overrides(name: str, root: Path = ROOT) -> dict[str, object]:
    """A judge as dotted params overrides: a rule recipe (configs/rules/), or `method[:mode]`; either
    with `@key=value,...` after it for a sweep (`scpo+category_gate@judge.category_gate=0.3`)."""
    name, _, tail = name.partition("@")
    extra = {}
    for kv in filter(None, tail.split(",")):
        if "=" not in kv or "." not in kv.partition("=")[0]:
            raise SystemExit(f"rule {name}@{tail}: {kv!r} is not section.key=value")
        key, value = recipes.parse_assignment(kv)
        extra[key] = value
    if (root / recipes.RULES / f"{name}.yaml").is_file():
        return recipes.load(root / recipes.RULES / f"{name}.yaml") | extra
    method, _, mode = name.partition(":")
    return {"judge.method": method, **({"judge.mode": mode} if mode else {})} | extra


SET_NAMES = {"dev": "dev", "heldout": "held-out"}  # the set a diagnosis read (reports kept before --on: held-out)


def rule(name: str, params) -> tuple[JudgeConfig, PairsConfig]:
    """A rule of configs/rules/ (or `method[:mode]`) as the judge and pairs configs it runs with."""
    over = rule_overrides(name)
    section = {sec: {k.split(".", 1)[1]: v for k, v in over.items() if k.startswith(f"{sec}.")}
               for sec in ("judge", "pairs")}
    return (JudgeConfig(**{**params.judge.model_dump(), **section["judge"]}),
            PairsConfig(**{**params.pairs.model_dump(), **section["pairs"]}))


def inverse_rates(judged: pd.DataFrame, ctx: JudgeContext, key: str) -> dict:
    """The share of proposed answers whose inverse problems came back to the hidden number, among right
    and among wrong answers (the gold read here only to measure the check)."""
    checked = ctx._scores.get("inverse", {}).get(key, {})
    right = {(g, p): c for g, p, c in zip(judged[key], judged["pred"], judged["correct"]) if isinstance(p, str)}
    out = {}
    for name, want in (("inverse_confirms_right", True), ("inverse_confirms_wrong", False)):
        got = [v for k, v in checked.items() if v is not None and k in right and (float(right[k]) >= 0.5) == want]
        out[name] = sum(got) / len(got) if got else None
    return out


def sample_stats(samples: pd.DataFrame, task, params, seconds: float) -> dict:
    correct = pd.Series([task.verify(p, a, c) for p, a, c in zip(samples["pred"], samples["answer"], samples["category"])],
                        dtype=float)
    per_prompt = samples.groupby("prompt_id")["pred"]
    return {"n": len(samples), "prompts": int(samples["prompt_id"].nunique()), "k": params.sample.k,
            "accuracy": float(correct.mean()),
            "extract_failure_rate": float(samples["pred"].isna().mean()),
            "truncated_share": float(samples["truncated"].mean()),
            "distinct_answers": float(per_prompt.nunique().mean()),
            "unanimous_share": float((per_prompt.nunique(dropna=False) == 1).mean()),
            "forms": samples["pred_form"].fillna("none").value_counts().to_dict(),
            "seconds": round(seconds, 1)}


def diagnose(judged: pd.DataFrame, cfg: JudgeConfig, pcfg: PairsConfig, verdict: bool, verify, seed: int) -> dict:
    """A rule's figures on one set of samples: label precision (labels, or verdicts of "right",
    that are right), coverage (prompts with a label; prompts with a pair), pair precision (chosen
    right and rejected wrong; weighted by the pairs' weights where they have them), judge AUC, and
    the share of samples the validity check rejects."""
    q = judge_quality(judged, verdict, verify)
    pairs, _ = build(judged, pcfg, seed)
    prompts = judged["prompt_id"].nunique()
    precise = (pairs["chosen_correct"] >= 0.5) & (pairs["rejected_correct"] < 0.5)
    out = {"judge_auc": q["judge_auc"], "label_precision": q["label_accuracy"],
           "label_coverage": q["label_coverage"], "pairs": len(pairs),
           "pair_coverage": pairs["prompt_id"].nunique() / prompts if prompts else None,
           "pair_precision": float(precise.mean()) if len(pairs) else None,
           "invalid_share": float((judged["valid"] == False).mean()) if judged["valid"].notna().any() else None}  # noqa: E712
    if judged["valid"].notna().any():
        right = judged["correct"].astype(float) >= 0.5
        out["right_rejected"] = float((judged.loc[right, "valid"] == False).mean()) if right.any() else None  # noqa: E712
    if q["label_accuracy"] is None and verdict:
        said_right = judged[judged["reward"].astype(float) >= 0.5].dropna(subset=["correct"])
        out["label_precision"] = float((said_right["correct"] >= 0.5).mean()) if len(said_right) else None
    if len(pairs) and pairs["weight"].notna().any():
        w = pairs["weight"].astype(float)
        out["pair_precision_weighted"] = float((w * precise).sum() / w.sum()) if w.sum() > 0 else None
    cats = judged["category"].fillna("(none)")
    if cats.nunique() > 1:  # where a rule's labels are right: a shortcut is right on one category only
        pair_cat = pairs["prompt_id"].map(judged.drop_duplicates("prompt_id").set_index("prompt_id")["category"]).fillna("(none)")
        out["by_category"] = {}
        for c in sorted(cats.unique()):
            qc = judge_quality(judged[cats == c], verdict, verify)
            pc = precise[(pair_cat == c).to_numpy()]
            out["by_category"][c] = {"label_precision": qc["label_accuracy"], "label_coverage": qc["label_coverage"],
                                     "pairs": int(len(pc)), "pair_precision": float(pc.mean()) if len(pc) else None}
    return out


def by_length(task, tok, heldout: pd.DataFrame, res, lengths: list[int]) -> dict[str, dict]:
    """Accuracy, cut share and mean length of greedy answers at each of `lengths` new tokens, read
    from one greedy run at the longest: an answer of n tokens is cut at L when n > L (or n == L and
    the run cut it); its first L tokens are then what a run at L would have written."""
    out = {}
    ids = [tok.encode(r[0], add_special_tokens=False) for r in res]
    for length in lengths:
        right, cut, n_tokens = [], [], []
        for toks, text, trunc, gold in zip(ids, res, res.truncated, heldout["answer"]):
            is_cut = len(toks) > length or (len(toks) == length and trunc[0])
            shown = tok.decode(toks[:length], skip_special_tokens=True) if len(toks) > length else text[0]
            right.append(bool(task.verify(task.extract(shown).answer, gold)))
            cut.append(is_cut)
            n_tokens.append(min(len(toks), length))
        out[str(length)] = {"accuracy": sum(right) / len(right), "truncated_share": sum(cut) / len(cut),
                            "mean_tokens": sum(n_tokens) / len(n_tokens), "n": len(right)}
    return out


def greedy_table(r: dict) -> str:
    """it0's greedy accuracy per category as Markdown, with its binomial s.e. and the cut share."""
    g = r["greedy"]
    lines = [f"it0 greedy answers to {g['n']} {SET_NAMES[r.get('set', 'heldout')]} problems ({r['params'].get('model.base', 'the model')}, "
             f"{r['params'].get('evaluate.max_new_tokens', '')} new tokens, instruction "
             f"{r['params'].get('task.instruction')!r}): accuracy {g['accuracy']:.3f}.", "",
             "| category | problems | greedy accuracy | s.e. | answers cut | no answer |", "|---|---|---|---|---|---|"]
    for c, v in g["by_category"].items():
        se = (v["accuracy"] * (1 - v["accuracy"]) / v["n"]) ** 0.5
        lines.append(f"| {c} | {v['n']} | {v['accuracy']:.3f} | {se:.3f} | {v.get('truncated_share', float('nan')):.3f} | "
                     f"{v.get('extract_failure_rate', float('nan')):.3f} |")
    return "\n".join(lines) + "\n"


def lengths_table(r: dict) -> str:
    """The length study as Markdown: accuracy, cut share and mean length per response length."""
    g = r["greedy"]
    lines = [f"it0 greedy answers to {g['n']} {SET_NAMES[r.get('set', 'heldout')]} problems, instruction: {r.get('instruction')!r}; "
             f"by category at the longest length: "
             + ", ".join(f"{c} {v['accuracy']:.3f} (n {v['n']})" for c, v in g["by_category"].items()), "",
             "| new tokens | accuracy | s.e. | answers cut | mean tokens |", "|---|---|---|---|---|"]
    if "validity" in g:
        v = g["validity"]
        lines[1:1] = ["", f"The validity check on the answers at the longest length: {v['invalid_share']:.3f} invalid ("
                      + ", ".join(f"{k} {x:.3f}" for k, x in v["by_reason"].items())
                      + f"); right answers rejected: {v['right_rejected']:.3f}"]
    for length, v in sorted(r["lengths"].items(), key=lambda kv: int(kv[0])):
        se = (v["accuracy"] * (1 - v["accuracy"]) / v["n"]) ** 0.5
        lines.append(f"| {length} | {v['accuracy']:.3f} | {se:.3f} | {v['truncated_share']:.3f} | {v['mean_tokens']:.1f} |")
    return "\n".join(lines) + "\n"


def _f(x) -> str:
    return "" if x is None else f"{x:.3f}"


def table(r: dict) -> str:
    """The diagnosis as Markdown: it0's greedy calibration, then per temperature the samples and
    every rule's figures; the aim (pair precision >= 0.65 at pair coverage >= 25%) is marked."""
    g = r["greedy"]
    lines = [f"it0 greedy accuracy {g['accuracy']:.3f} on {g['n']} {SET_NAMES[r.get('set', 'heldout')]} problems "
             f"(answers unreadable {g['extract_failure_rate']:.3f}, cut {g['truncated_share']:.3f}); by category: "
             + ", ".join(f"{c} {v['accuracy']:.2f} (n {v['n']})" for c, v in g["by_category"].items()), ""]
    if "validity" in g:
        v = g["validity"]
        lines += [f"The validity check on these greedy answers: {v['invalid_share']:.3f} invalid ("
                  + ", ".join(f"{k} {x:.3f}" for k, x in v["by_reason"].items())
                  + f"); right answers rejected: {v['right_rejected']:.3f}", ""]
    for temperature, judges in r["judges"].items():
        s = r["samples"][temperature]
        notes: list[str] = []
        lines += [f"### temperature {temperature}: {s['n']} samples (k {s['k']}) over {s['prompts']} prompts, "
                  f"accuracy {s['accuracy']:.3f}, distinct answers per prompt {s['distinct_answers']:.2f}, "
                  f"unanimous prompts {s['unanimous_share']:.2f}, unreadable {s['extract_failure_rate']:.3f}, "
                  f"cut {s['truncated_share']:.3f}", "",
                  "| rule | label precision | label coverage | pair precision | pair coverage | pairs | "
                  "judge AUC | invalid share | right answers rejected | aim met | seconds |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for name, q in judges.items():
            if q.get("inverse_confirms_right") is not None or q.get("inverse_confirms_wrong") is not None:
                notes.append(f"{name}: the inverse problems came back for {_f(q.get('inverse_confirms_right'))} of the "
                             f"right answers proposed and {_f(q.get('inverse_confirms_wrong'))} of the wrong ones")
            met = (q["pair_precision"] is not None and q["pair_precision"] >= 0.65
                   and (q["pair_coverage"] or 0) >= 0.25)
            precision = _f(q["pair_precision"])
            if q.get("pair_precision_weighted") is not None:
                precision += f" ({_f(q['pair_precision_weighted'])} weighted)"
            lines.append(f"| {name} | {_f(q['label_precision'])} | {_f(q['label_coverage'])} | {precision} | "
                         f"{_f(q['pair_coverage'])} | {q['pairs']} | {_f(q['judge_auc'])} | "
                         f"{_f(q['invalid_share'])} | {_f(q.get('right_rejected'))} | {'yes' if met else ''} | "
                         f"{q['seconds']} |")
        lines.append("")
        if notes:
            lines += [f"- {n}" for n in notes] + [""]
        cats = sorted({c for q in judges.values() for c in q.get("by_category", {})})
        if cats:
            lines += ["Per category: label precision (label coverage) / pair precision (pairs)", "",
                      "| rule | " + " | ".join(cats) + " |", "|---|" + "---|" * len(cats)]
            for name, q in judges.items():
                by = q.get("by_category", {})
                lines.append(f"| {name} | " + " | ".join(
                    (f"{_f(by[c]['label_precision'])} ({_f(by[c]['label_coverage'])})" if by[c]["label_coverage"]
                     is not None else "–") + f" / {_f(by[c]['pair_precision'])} ({by[c]['pairs']})"
                    if c in by else "" for c in cats) + " |")
            lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
