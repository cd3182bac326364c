"""The label-free choice's base support for loops kept before evaluate recorded it.

    python -m scripts.base_support WORKDIR... --out reports/base_support_smollm2.md

A WORKDIR is a loop's directory after its run (data/task/ttt.parquet, data/it0/model and every
iteration's data/itN/eval.parquet). For each, the base model's samples of every test-time problem
in both wordings are drawn as the evaluate stage of it0 now draws them (`evaluate.support_k` at
`evaluate.temperature`, the run's own seed, task, evaluate and sampling params as its it0
eval.parquet's provenance records them; `--backend ct2` to draw them with CTranslate2 where the
run used another engine), and every iteration's label-free signals are
computed again against them (`choice.signals`). The table sets the rule's recommendation without
the base support (plain agreement, as when the run was kept) and with it (supported agreement and
the support veto) beside held-out accuracy, which the rule never reads. Runs of one seed
share it0 and its test-time problems, so their samples are drawn once. Writes the table (`--out`)
and the same numbers as JSON beside it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import yaml

from self_improve import artifacts as art
from self_improve.choice import SUPPORT_FACTOR, recommend, signals, vetoes
from self_improve.cli import derive_seed
from self_improve.config import parse_params
from self_improve.engines.sampler import open_sampler
from self_improve.errors import PipelineError
from self_improve.evaluation import rewritten, support_samples
from self_improve.models.loading import set_threads
from self_improve.tasks import task_for

ROOT = Path(__file__).resolve().parents[1]
PROVENANCE = b"self_improve.provenance"


def run_params(work: Path, backend: str | None):
    """The params the run's it0 evaluate read (its provenance), over the repository's defaults."""
    meta = pq.read_schema(work / "data/it0/eval.parquet").metadata or {}
    if PROVENANCE not in meta:
        raise SystemExit(f"{work}/data/it0/eval.parquet: no provenance, cannot tell the run's params")
    recorded = json.loads(meta[PROVENANCE])["params"]
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    for key, value in recorded.items():
        node, *path = key.split(".")
        if not path:
            raw[node] = value if not isinstance(value, dict) else {**raw.get(node, {}), **value}
            continue
        tree = raw.setdefault(node, {})
        for part in path[:-1]:
            tree = tree.setdefault(part, {})
        tree[path[-1]] = value
    if backend:
        raw["sample"]["backend"] = backend
    return parse_params(raw, f"{work}/data/it0/eval.parquet (provenance)")


def draw(work: Path, params, cache: dict) -> pd.DataFrame:
    """it0's sampled answers (EVAL rows of the base support) to the run's test-time problems."""
    task = task_for(params.task)
    ttt = art.read_table(work / "data/task/ttt.parquet", art.PROMPTS)
    ttt = ttt[ttt["answer"].notna()]
    seed = derive_seed(params.seed, "evaluate")
    ev = params.evaluate
    key = hashlib.sha256(json.dumps([params.seed, ev.support_k, ev.temperature, ev.max_new_tokens, str(params.model.base),
                                     list(ttt["prompt"])]).encode()).hexdigest()
    if key not in cache:
        sampler = open_sampler(work / "data/it0/model", params.sample, params.security, None, params.model)
        rows = support_samples(sampler, ttt, params.evaluate, seed, task, desc="ttt base samples")
        rows += support_samples(sampler, rewritten(task, ttt, seed), params.evaluate, seed, task,
                                desc="ttt_view base samples")
        cache[key] = pd.DataFrame(rows)
    return cache[key]


def check(work: Path, drawn: pd.DataFrame) -> dict:
    """Every iteration's signals against the base support, and the rule with and without it."""
    evals = sorted(work.glob("data/it*/eval.parquet"), key=lambda p: int(p.parent.name[2:]))
    base = art.read_table(evals[0], art.EVAL)
    base = pd.concat([base[base["set"] != "ttt_sample"], drawn.assign(iteration="it0")], ignore_index=True)
    history = []
    for path in evals:
        it = path.parent.name
        now = base if it == "it0" else art.read_table(path, art.EVAL)
        row = {"iteration": it, **signals(now, None if it == "it0" else base)}
        held = now[now["set"] == "heldout"]
        row["accuracy"] = float(held["correct"].mean())
        history.append(row)
    without = [{k: v for k, v in r.items() if not k.startswith(("lf_base_support", "lf_supported_agreement"))}
               for r in history]
    return {"run": work.name, "history": history, "recommended_without": recommend(without)["iteration"],
            "recommended": recommend(history)["iteration"],
            "vetoes": {r["iteration"]: vetoes(r, history[0]) for r in history[1:]}}


def markdown(results: list[dict]) -> str:
    lines = ["# The base support on loops kept before evaluate recorded it", "",
             ("Generated by `python -m scripts.base_support` (its doc says how). Base support: the share of "
              "test-time problems whose greedy answer is among the base model's own sampled answers to it "
              f"(both wordings); the veto: under 1/{SUPPORT_FACTOR:g} of it0's, beyond noise. Held-out accuracy "
              "is the truth the rule never reads."), "",
             ("| run | iteration | held-out acc | agreement (gain 95% low end) | supported agreement (gain 95% low end) | "
              "base support (paired gain [95%]) | veto |"),
             "|---|---|---|---|---|---|---|"]
    for res in results:
        for r in res["history"]:
            gain = (f" ({r['lf_base_support_gain']:+.3f} [{r['lf_base_support_gain_lo']:+.3f}, "
                    f"{r['lf_base_support_gain_hi']:+.3f}])" if "lf_base_support_gain" in r else "")
            lo = f" ({r['lf_agreement_gain_lo']:+.3f})" if "lf_agreement_gain_lo" in r else ""
            slo = f" ({r['lf_supported_agreement_gain_lo']:+.3f})" if "lf_supported_agreement_gain_lo" in r else ""
            veto = "; ".join(v for v in res["vetoes"].get(r["iteration"], []) if v.startswith("base support"))
            lines.append(f"| {res['run']} | {r['iteration']} | {r['accuracy']:.3f} | {r.get('lf_agreement', float('nan')):.3f}"
                         f"{lo} | {r.get('lf_supported_agreement', float('nan')):.3f}{slo} | "
                         f"{r.get('lf_base_support', float('nan')):.3f}{gain} | {veto} |")
    lines += ["", "| run | recommended without the base support | with it |", "|---|---|---|"]
    lines += [f"| {r['run']} | {r['recommended_without']} | {r['recommended']} |" for r in results]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workdirs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True, help="the table (markdown); the JSON goes beside it")
    ap.add_argument("--backend", default=None,
                    help="the engine that draws the samples (sample.backend; default: the run's own)")
    args = ap.parse_args(argv)
    set_threads()
    for work in args.workdirs:
        if not (work / "data/it0/eval.parquet").is_file() or not (work / "data/task/ttt.parquet").is_file():
            raise SystemExit(f"{work}: not a loop's directory (no data/it0/eval.parquet or data/task/ttt.parquet)")
    cache: dict = {}
    results, failed = [], []
    for work in args.workdirs:
        try:
            results.append(check(work, draw(work, run_params(work, args.backend), cache)))
        except PipelineError as err:  # its base cannot be loaded here, say: the others still count
            failed.append(f"{work.name}: {err}")
    text = markdown(results)
    if failed:
        text += "\nNot replayed:\n\n" + "".join(f"- {f}\n" for f in failed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=1, default=float) + "\n")
    print(text)
    if failed:
        raise SystemExit(f"{len(failed)} of {len(args.workdirs)} not replayed (listed in {args.out})")


if __name__ == "__main__":
    main()
