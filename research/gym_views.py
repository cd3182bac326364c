"""Would a second wording of each reasoning-gym problem give the gym's label-free choice a better signal?

The gym posed no rewrites when its runs were kept, so their choice reads base support alone
(self_improve/choice.py), and on kept gym runs that guard lets falling controls through and holds rising rules back (research/results/choice_check.md).
Word problems read the cross-view agreement instead. This study gives each test-time arithmetic problem of
a finished gym loop one equivalent wording (the task's `view`, reasoning_gym.other_wording: the other of
reasoning-gym's two templates, "Calculate a op b." and "State the final answer to the following arithmetic
problem: a op b =", with the operands swapped where the operation commutes; evaluate answers it too since),
answers it greedily with each iteration's kept engine, as the evaluate stage answers a task that has rewrites (evaluation.model_metrics: the greedy answers of both
wordings, and at it0 the base model's `evaluate.support_k` samples of both), and reads the choice again
with the agreement signals. No gold answer is read by the signals; held-out accuracy (recorded by the
loop) only scores the picks.

    python -m research.gym_views /tmp/loops75/smol-...-s0 --finished research/results/smollm2_gym_long/...-s0.json \
        --out research/results/smollm2_gym_long/views

needs the loop's workspace (research.real_loops --plain DIR keeps each iteration's engine under
data/itN/engine) and writes, per run, `<stem>.json` (the signals per iteration) and a line in `views.md`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from self_improve import choice
from self_improve.config import load_params
from self_improve.engines.ct2 import CT2Sampler
from self_improve.evaluation import model_metrics
from self_improve.quality import binomial_se
from self_improve.stage import derive_seed
from self_improve.tasks import answer_stop, task_for


def answers_with_views(workdir: Path, iteration: str, base: bool) -> pd.DataFrame:
    """The iteration's EVAL rows of the test-time problems in both wordings (and with `base`, the base
    model's samples of both), answered by its kept engine as the evaluate stage would."""
    params = load_params(workdir / "params.yaml")
    task = task_for(params.task)  # its `view`: the second wording evaluate now answers
    ttt = pd.read_parquet(workdir / "data" / "task" / "ttt.parquet")
    ttt = ttt[ttt["variant"] == 0] if "variant" in ttt else ttt
    sampler = CT2Sampler(workdir / "data" / iteration / "engine", params.sample.ct2, params.security)
    rows: list = []
    model_metrics(sampler, ttt.iloc[:0], ttt, params.evaluate, derive_seed(params.seed, "evaluate"), task,
                  progress=False, answers=rows, base_samples=base,
                  stop_at=answer_stop(task, params.sample.stop_at_answer))
    return pd.DataFrame(rows)


def study(workdir: Path, finished: Path) -> dict:
    kept = json.loads(finished.read_text())
    its = sorted(kept["metrics"], key=lambda it: int(it[2:]))
    frames = {}
    for it in its:
        if not (workdir / "data" / it / "engine").is_dir():  # the loop had stopped: the model passed on
            frames[it] = frames[its[its.index(it) - 1]]
            continue
        frames[it] = answers_with_views(workdir, it, base=it == "it0")
    history = []
    for it in its:
        sig = choice.signals(frames[it], None if it == "it0" else frames["it0"])
        history.append({"iteration": it, **{k: v for k, v in kept["metrics"][it].items()
                                            if not k.startswith("lf_")}, **sig})
    with_views = choice.recommend(history)
    recorded = choice.recommend([{"iteration": it, **kept["metrics"][it]} for it in its])
    acc = {it: kept["metrics"][it]["accuracy"] for it in its}
    return {"run": finished.stem, "heldout": acc, "heldout_n": kept["metrics"]["it0"]["heldout_n"],
            "signals": {h["iteration"]: {k: h.get(k) for k in ("lf_agreement", "lf_supported_agreement",
                                                                "lf_supported_agreement_gain_lo", "lf_base_support",
                                                                "lf_base_support_gain_lo")} for h in history},
            "with_views": {"iteration": with_views["iteration"], "reason": with_views["reason"]},
            "recorded": {"iteration": recorded["iteration"], "reason": recorded["reason"]}}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workdir", type=Path, help="the loop's workspace (data/itN/engine for each iteration)")
    ap.add_argument("--finished", type=Path, required=True, help="the kept result of that loop (its .json)")
    ap.add_argument("--out", type=Path, required=True, help="a directory for <stem>.json and views.md")
    args = ap.parse_args(argv)
    r = study(args.workdir, args.finished)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{r['run']}.json").write_text(json.dumps(r, indent=1) + "\n")
    write_table(args.out)
    print(json.dumps({k: r[k] for k in ("run", "with_views", "recorded")}, indent=1))


def write_table(out: Path) -> None:
    """views.md: per run, the held-out accuracy at it0, at the best iteration, at the recorded choice (base
    support) and at the choice with the views' supported agreement."""
    lines = ["# The gym's choice with a second wording of each test-time problem", "",
             "Generated by `python -m research.gym_views WORKDIR --finished KEPT.json --out research/results/smollm2_gym_long/views`, one run at a time (its docstring). Held-out accuracy at each pick; "
             "the best iteration for comparison (read from held-out, never by a rule).", "",
             "| run | it0 | best | choice on base support | choice on supported agreement (views) | why (views) |",
             "|---|---|---|---|---|---|"]
    near = {"recorded": 0, "with_views": 0}
    runs = [json.loads(f.read_text()) for f in sorted(out.glob("*.json"))]
    for r in runs:
        acc = r["heldout"]
        best = max(acc, key=lambda it: (acc[it], -int(it[2:])))
        se = binomial_se(acc[best], r["heldout_n"])

        def cell(pick: str) -> str:
            return f"{pick} ({acc[pick]:.3f}{'' if acc[best] - acc[pick] <= se else ', not within one s.e.'})"

        for k in near:
            near[k] += acc[best] - acc[r[k]["iteration"]] <= se
        lines.append(f"| {r['run']} | {acc['it0']:.3f} | {best} ({acc[best]:.3f}) | {cell(r['recorded']['iteration'])} | "
                     f"{cell(r['with_views']['iteration'])} | {r['with_views']['reason']} |")
    lines += ["", f"Picks within one standard error of the best held-out iteration: {near['recorded']} of {len(runs)} on "
              f"base support, {near['with_views']} of {len(runs)} on the views' supported agreement."]
    (out / "views.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
