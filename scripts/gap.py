"""The generation-verification gap of each self-judge on the base model's own samples.

    python -m scripts.gap -S model.base=models/smollm2-135m-instruct -S task.name=word_math \\
        --judges co_reward majority_vote llm_judge:yes_logprob llm_judge:score_logprob self_certainty verifier \\
        --out reports/gap_smollm2.json

With params.yaml and the -S overrides (as `dvc exp run -S` takes them): the task's held-out set
answered greedily by it0 (accuracy per category: where the task's difficulty sits), then it1's prompts
(the task's proposal, rewrites included) sampled `sample.k` times by it0, and every judge named run on
the same samples. A judge has a gap when its verdicts are better than the samples it judges: label
accuracy above sample accuracy (vote judges), or an AUC above 0.5 against the verifier. Writes the
figures as JSON and a Markdown table beside it; nothing in data/ is touched.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd
import yaml

from stages.lib import artifacts as art
from stages.lib.cli import derive_seed
from stages.lib.config import JudgeConfig, JudgeMethod, load_params, parse_params
from stages.lib.generation import SamplingSpec
from stages.lib.judges import REGISTRY, JudgeContext, ModelHandle, judge_quality, judge_samples, template_path
from stages.lib.models import load_model, set_threads
from stages.lib.rubric import load_template
from stages.lib.tasks import ProposeInput, task_for


def override(raw: dict, assignment: str) -> None:
    key, _, value = assignment.partition("=")
    node = raw
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = yaml.safe_load(value)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-S", "--set", action="append", default=[], help="params override, key=value")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--judges", nargs="+", default=["co_reward", "majority_vote", "llm_judge:yes_logprob",
                                                     "self_certainty", "verifier"],
                    help="judge.method, or llm_judge:<mode>")
    ap.add_argument("--greedy-only", action="store_true", help="only the held-out calibration (step 1)")
    ap.add_argument("--out", required=True, help="JSON figures; a .md table is written beside it")
    args = ap.parse_args(argv)
    raw = yaml.safe_load(Path(args.params).read_text())
    for s in args.set:
        override(raw, s)
    params = parse_params(raw, args.params)
    load_params(args.params)  # the file itself must be valid too
    set_threads()
    t0 = time.perf_counter()
    task = task_for(params.task)
    sets = task.sets(derive_seed(params.seed, "split"), params.prepare.train_size)
    model, tok = load_model(params.model.base if not params.model.builtin else "data/it0/model",
                            security=params.security, model_cfg=params.model)
    from stages.lib.backends import HFSampler
    from stages.sample import sample

    sampler = HFSampler(model, tok)
    result: dict = {"params": {k: v for k, v in (s.split("=", 1) for s in args.set)}}

    # 1. where the task's difficulty sits: greedy accuracy per category on the held-out set
    greedy = SamplingSpec(n=1, greedy=True, max_new_tokens=params.evaluate.max_new_tokens,
                          batch_size=params.evaluate.batch_size)
    res = sampler.generate(list(sets.heldout["prompt"]), greedy, derive_seed(params.seed, "evaluate"), desc="greedy")
    preds = [task.extract(r[0]).answer for r in res]
    held = sets.heldout.assign(pred=preds, right=[task.verify(p, a) for p, a in zip(preds, sets.heldout["answer"])],
                               cut=[t[0] for t in res.truncated])
    result["greedy"] = {
        "accuracy": float(held["right"].mean()), "n": len(held),
        "extract_failure_rate": float(held["pred"].isna().mean()), "truncated_share": float(held["cut"].mean()),
        "by_category": {c: {"accuracy": float(g["right"].mean()), "n": len(g)}
                        for c, g in held.groupby("category")},
    }
    if args.greedy_only:
        print(json.dumps(result["greedy"], indent=1))
        return
    # 2. it1's prompts, sampled by it0, judged by every judge
    inp = ProposeInput(params.evolve, "it1", derive_seed(params.seed, "evolve", "it1"), sets.ttt, sets.heldout,
                       art.empty_table(art.JUDGMENTS), rewrites=True)
    prompts = task.propose(inp)
    samples = sample(sampler, prompts, params.sample, derive_seed(params.seed, "sample", "it1"), task)
    correct = [task.verify(p, a) for p, a in zip(samples["pred"], samples["answer"])]
    result["samples"] = {"n": len(samples), "prompts": int(samples["prompt_id"].nunique()),
                         "accuracy": float(pd.Series(correct, dtype=float).mean()),
                         "extract_failure_rate": float(samples["pred"].isna().mean()),
                         "truncated_share": float(samples["truncated"].mean()),
                         "forms": samples["pred_form"].fillna("none").value_counts().to_dict()}
    handle = ModelHandle(model, tok)
    result["judges"] = {}
    for spec in args.judges:
        method, _, mode = spec.partition(":")
        cfg = JudgeConfig(**{**params.judge.model_dump(), "method": method, **({"mode": mode} if mode else {})})
        judge = REGISTRY[JudgeMethod(method)]
        template = None
        if judge.needs_template:
            tparams = params.model_copy(update={"judge": cfg})
            template = load_template(template_path(tparams))
        ctx = JudgeContext(policy=handle, reference=handle, template=template,
                           seed=derive_seed(params.seed, "judge", "it1"), batch_size=params.sample.batch_size,
                           max_tokens=params.sample.score_tokens, max_length=params.model.max_length,
                           verify=task.verify)
        t = time.perf_counter()
        judged = judge_samples(samples, cfg, ctx)
        q = judge_quality(judged, judge.verdict, task.verify)
        q["seconds"] = round(time.perf_counter() - t, 1)
        result["judges"][spec] = q
        print(spec, json.dumps(q))
    result["seconds"] = round(time.perf_counter() - t0, 1)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    out.with_suffix(".md").write_text(table(result))
    print(table(result))


def _f(x) -> str:
    return "" if x is None else f"{x:.3f}"


def table(r: dict) -> str:
    g, s = r["greedy"], r["samples"]
    lines = [f"it0 greedy accuracy {g['accuracy']:.3f} on {g['n']} held-out problems "
             f"(answers unreadable {g['extract_failure_rate']:.3f}, cut {g['truncated_share']:.3f}); by category: "
             + ", ".join(f"{c} {v['accuracy']:.2f} (n {v['n']})" for c, v in g["by_category"].items()),
             "",
             f"it0 samples: {s['n']} over {s['prompts']} prompts, accuracy {s['accuracy']:.3f} "
             f"(unreadable {s['extract_failure_rate']:.3f}, cut {s['truncated_share']:.3f})",
             "",
             "| judge | label accuracy | label coverage | judge AUC | judge accuracy | judged share | seconds |",
             "|---|---|---|---|---|---|---|"]
    for name, q in r["judges"].items():
        lines.append(f"| {name} | {_f(q['label_accuracy'])} | {_f(q['label_coverage'])} | {_f(q['judge_auc'])} | "
                     f"{_f(q['judge_accuracy'])} | {_f(q['judged_share'])} | {q['seconds']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
