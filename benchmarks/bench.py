"""Where the time of a self-improvement loop goes, measured on this machine in one run.

    make bench            # = python -m benchmarks.bench --out reports/benchmark.json

1. The default loop: `dvc repro` in a fresh clone of the repo's HEAD (empty DVC cache), with each
   stage process timing itself (SELF_IMPROVE_TIMINGS). Orchestration = the loop's wall time not
   spent inside a stage process (DVC) plus MLflow logging; then a no-op `dvc repro`; then the same
   loop as a Prefect flow in a second fresh clone.
2. On the loop's own artifacts (the default base model, its first iteration's samples): sampling
   tokens/s batched vs one sequence at a time, judge log-prob scoring and RAFT training tokens/s,
   and the sample stage at four prompt counts with a fitted line. On a GPU the same sampling runs
   on CUDA, and with vLLM when it is installed.
3. A busy machine (benchmarks/busy.py): the base model's training and evaluation alone and beside one
   and two busy processes, under OpenMP's default wait policy and the passive one.

Figures go to the JSON file given by --out; the last line printed sums up the targets.

`--quick` (`make bench-quick`, what CI runs) does every step on the test suite's tiny sizes (a few
prompts, one short iteration's worth of work each; the loop and the flow with one iteration) into a temporary file: it proves the command
completes from a fresh clone, not how fast it is, so no target is checked.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# --quick: the loop at the sizes of the test suite's tiny config (params overrides of the clone)
QUICK = {"task.heldout_size": 30, "task.ttt_size": 30, "prepare.train_size": 200, "prepare.steps": 30,
         "prepare.model.hidden_size": 32, "prepare.model.num_layers": 1, "prepare.model.num_heads": 2,
         "prepare.model.intermediate_size": 64, "evolve.fresh": 6, "evolve.keep_top": 4, "sample.k": 2,
         "sample.max_new_tokens": 4, "train.epochs": 1, "evaluate.k": 2}
TARGETS = {"batched_speedup": 20.0, "orchestration_share": 0.05, "noop_repro_seconds": 5.0,
           "loop_seconds": 300.0, "linear_r2": 0.98}


def _env(work: Path, timings: Path) -> dict:
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "SELF_IMPROVE_TIMINGS": str(timings), "MLFLOW_TRACKING_URI": f"sqlite:///{work}/mlflow.db",
            "PYTHONUNBUFFERED": "1", "SELF_IMPROVE_REPOS": str(work)}  # the flow may work on the clone


def _run(args: list[str], cwd: Path, env: dict) -> float:
    start = time.perf_counter()
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"bench: {' '.join(args)} failed in {cwd}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return time.perf_counter() - start


def clone(dest: Path) -> Path:
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(dest)], check=True)
    return dest


def _read_timings(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _stage_table(rows: list[dict]) -> dict[str, dict[str, float]]:
    """{stage: {iteration: process seconds}}; evaluate_base shows as evaluate@it0."""
    table: dict[str, dict[str, float]] = defaultdict(dict)
    for r in rows:
        table[r["stage"]][r["iteration"] or "-"] = round(r["process_seconds"] or r["seconds"], 2)
    return dict(table)


def _split(rows: list[dict], wall: float, outside: str) -> dict:
    """Wall time inside stage processes vs outside them (the orchestrator), plus MLflow logging."""
    in_stages = sum(r["process_seconds"] or r["seconds"] for r in rows)
    mlflow_s = sum(r.get("tracking_seconds", 0.0) for r in rows)
    return {"stage_process_seconds": round(in_stages, 1), outside: round(wall - in_stages, 1),
            "mlflow_seconds": round(mlflow_s, 2), "orchestration_share": round((wall - in_stages + mlflow_s) / wall, 4)}


def clone_quick(dest: Path) -> Path:
    """A fresh clone whose params.yaml carries QUICK, with one iteration (every stage of the loop once)."""
    import yaml

    from self_improve import recipes

    work = clone(dest)
    raw = yaml.safe_load((work / "params.yaml").read_text())
    raw["loop"] = {"it1": {"prev": "it0", "ref": "init"}}
    (work / "params.yaml").write_text(yaml.safe_dump(recipes.apply(raw, QUICK), sort_keys=False))
    return work


def bench_loop(tmp: Path, quick: bool = False) -> tuple[dict, Path]:
    work = (clone_quick if quick else clone)(tmp / "loop")
    timings = work / "timings.jsonl"
    env = _env(work, timings)
    print("loop: dvc repro in a fresh clone ...", flush=True)
    wall = _run([sys.executable, "-m", "dvc", "repro"], work, env)
    rows = _read_timings(timings)
    noop = _run([sys.executable, "-m", "dvc", "repro"], work, {**env, "SELF_IMPROVE_TIMINGS": ""})
    out = {"loop_seconds": round(wall, 1), **_split(rows, wall, "dvc_seconds"), "noop_repro_seconds": round(noop, 2),
           "stages": _stage_table(rows)}
    return out, work


def bench_direct(work: Path) -> dict:
    """The loop's stage commands from dvc.yaml run one after another, no DVC, MLflow off
    (for a machine without them, e.g. a GPU box)."""
    from runners.dag import stage_commands

    timings = work / "timings.jsonl"
    env = {**_env(work, timings), "SELF_IMPROVE_TRACKING": "0"}
    print("loop: the stage commands of dvc.yaml, run directly ...", flush=True)
    start = time.perf_counter()
    for _, argv in stage_commands(work):
        _run([sys.executable if argv[0] == "python" else argv[0], *argv[1:]], work, env)
    wall = time.perf_counter() - start
    return {"loop_seconds": round(wall, 1), "stages": _stage_table(_read_timings(timings))}


def bench_flow(tmp: Path, quick: bool = False) -> dict:
    """The same loop as a Prefect flow in a fresh clone; the server is started before timing."""
    work = (clone_quick if quick else clone)(tmp / "flow")
    timings = work / "timings.jsonl"
    print("loop: the Prefect flow in a fresh clone ...", flush=True)
    code = ("import json, sys, time\n"
            "from prefect import flow\n"
            "from flows.loop import self_improve_loop\n"
            "@flow(name='warm-up')\ndef warm_up():\n    return None\n"
            "warm_up()  # starts the server before the clock does\n"
            "t = time.perf_counter(); stages = self_improve_loop(sys.argv[1])\n"
            "print(json.dumps({'flow_seconds': time.perf_counter() - t, 'tasks': len(stages)}))\n")
    proc = subprocess.run([sys.executable, "-c", code, str(work)], cwd=ROOT, env=_env(work, timings),
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": proc.stderr[-1500:]}
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    wall = res["flow_seconds"]
    return {"flow_seconds": round(wall, 1), "tasks": res["tasks"], **_split(_read_timings(timings), wall, "dvc_and_prefect_seconds")}


def _generated_tokens(tokenizer, outputs: list[list[str]], max_new: int) -> int:
    """Tokens a model produced: each response's tokens plus its <eos>, at most max_new."""
    return sum(min(len(tokenizer(r, add_special_tokens=False)["input_ids"]) + 1, max_new)
               for rs in outputs for r in rs)


def _timer(device: str):
    """fn -> (fn(), seconds), waiting for the GPU's queued work on CUDA."""
    import torch

    def timed(fn):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        res = fn()
        if device == "cuda":
            torch.cuda.synchronize()
        return res, time.perf_counter() - start
    return timed


def _sampling_figures(model, tok, ttt: list[str], cfg, single_prompts: int, timed) -> tuple[dict, float]:
    """Batched sampling against one prompt and one sample at a time, and whether greedy answers are the
    same either way; also the batched tokens/s."""
    from self_improve.engines.hf import SamplingSpec, generate

    spec = SamplingSpec(n=cfg.k, temperature=cfg.temperature, top_p=cfg.top_p,
                        max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size)
    generate(model, tok, ttt[:8], spec, seed=0, progress=False)  # warm-up
    res, secs = timed(lambda: generate(model, tok, ttt, spec, seed=1, progress=False))
    batched = _generated_tokens(tok, res, cfg.max_new_tokens) / secs
    one = SamplingSpec(n=1, temperature=cfg.temperature, top_p=cfg.top_p,
                       max_new_tokens=cfg.max_new_tokens, batch_size=1)
    few = ttt[:single_prompts]
    res, secs = timed(lambda: [generate(model, tok, [p], one, seed=j * 10_007 + i, progress=False)[0]
                               for i, p in enumerate(few) for j in range(cfg.k)])
    single = _generated_tokens(tok, res, cfg.max_new_tokens) / secs
    greedy = SamplingSpec(n=1, greedy=True, max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size)
    same = generate(model, tok, few, greedy, 0, progress=False) == [
        generate(model, tok, [p], greedy, 0, progress=False)[0] for p in few]
    return {"batched_tokens_per_s": round(batched), "one_at_a_time_tokens_per_s": round(single),
            "batched_speedup": round(batched / single, 1), "prompts": len(ttt), "k": cfg.k,
            "one_at_a_time_prompts": len(few), "greedy_identical": same}, batched


def _raft_figures(work: Path, device: str, tok, tcfg, timed) -> dict:
    """One epoch of RAFT's fine-tuning with LoRA on it1's best samples: tokens/s."""
    import torch

    from self_improve import artifacts as art
    from self_improve.engines.hf import encode_for_training
    from self_improve.models.loading import attach_lora, load_model
    from self_improve.training.loop import Schedule, steps_for
    from self_improve.training.trainers import RunContext, SFTTrainer

    sft = art.read_table(work / "data/it1/sft.parquet", art.SFT)
    steps = steps_for(len(sft), tcfg.batch_size, 1)
    enc = encode_for_training(tok, list(sft["prompt"]), list(sft["response"]))
    per_example = float(enc["attention_mask"].sum()) / len(sft)
    torch.manual_seed(0)
    lora_model = attach_lora(load_model(work / "data/it0/model", device=device)[0], tcfg.lora)
    ctx = RunContext(tok, Schedule(tcfg.lr, steps), tcfg.batch_size, 0, max_grad_norm=tcfg.max_grad_norm)
    _, secs = timed(lambda: SFTTrainer(ctx).train(lora_model, list(sft["prompt"]), list(sft["response"])))
    return {"tokens_per_s": round(steps * tcfg.batch_size * per_example / secs), "steps": steps}


def _scaling_figures(work: Path, model, tok, params, timed) -> dict:
    """The sample stage's time over growing numbers of prompts: a line's slope, intercept and fit."""
    import numpy as np

    from self_improve import artifacts as art
    from self_improve.engines.sampler import HFSampler
    from self_improve.sampling import sample
    from self_improve.tasks import task_for

    prompts = art.read_table(work / "data/it1/prompts.parquet", art.PROMPTS)
    sampler = HFSampler(model, tok)
    sizes = [n for n in (250, 500, 1000, 2000) if n <= len(prompts)] or [  # a quick run's few prompts
        max(1, len(prompts) * i // 4) for i in (1, 2, 3, 4)]
    task = task_for(params.task)
    times = [timed(lambda n=n: sample(sampler, prompts.head(n), params.sample, 0, task, progress=False))[1]
             for n in sizes]
    slope, intercept = np.polyfit(sizes, times, 1)
    pred = np.polyval([slope, intercept], sizes)
    r2 = 1 - float(np.sum((np.array(times) - pred) ** 2) / np.sum((np.array(times) - np.mean(times)) ** 2))
    return {"prompts": sizes, "seconds": [round(t, 3) for t in times],
            "seconds_per_1000_prompts": round(1000 * slope, 3), "intercept_seconds": round(intercept, 3),
            "r2": round(r2, 4)}


def bench_compute(work: Path, device: str, single_prompts: int) -> dict:
    from self_improve import artifacts as art
    from self_improve.config import load_params
    from self_improve.engines.hf import SamplingSpec, score
    from self_improve.engines.sampler import VLLMSampler, vllm_unavailable
    from self_improve.models.loading import load_model, set_threads

    set_threads()
    params = load_params(work / "params.yaml")
    cfg = params.sample
    model, tok = load_model(work / "data/it0/model", device=device)
    ttt = list(art.read_table(work / "data/task/ttt.parquet", art.PROMPTS)["prompt"])
    timed = _timer(device)
    out: dict = {"device": device}
    out["sampling"], batched = _sampling_figures(model, tok, ttt, cfg, single_prompts, timed)
    samples = art.read_table(work / "data/it1/samples.parquet", art.SAMPLES)
    sc, secs = timed(lambda: score(model, tok, list(samples["prompt"]), list(samples["response"]),
                                   batch_size=cfg.batch_size, progress=False))
    out["judge_scoring"] = {"tokens_per_s": round(sc.processed_tokens / secs), "sequences": len(samples)}
    out["train_raft"] = _raft_figures(work, device, tok, params.train, timed)
    out["scaling"] = _scaling_figures(work, model, tok, params, timed)
    reason = vllm_unavailable()
    if device == "cuda" and not reason:
        spec = SamplingSpec(n=cfg.k, temperature=cfg.temperature, top_p=cfg.top_p,
                            max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size)
        v = VLLMSampler(work / "data/it0/model", cfg.gpu_memory_utilization)
        v.generate(ttt[:8], spec, 0, progress=False)
        res, secs = timed(lambda: v.generate(ttt, spec, 1, progress=False))
        vtps = _generated_tokens(tok, res, cfg.max_new_tokens) / secs
        out["vllm"] = {"tokens_per_s": round(vtps), "vs_hf_batched": round(vtps / batched, 2)}
    else:
        out["vllm"] = {"skipped": reason or "no GPU"}
    return out


def summary_line(res: dict) -> str:
    checks = []

    def check(label: str, value, target, ok: bool, fmt: str) -> None:
        checks.append(f"{label} {fmt.format(value)} ({'ok' if ok else 'MISSED'}, target {target})")

    comp = res.get("cpu", {})
    if "sampling" in comp:
        s = comp["sampling"]["batched_speedup"]
        check("batched/one-at-a-time", s, ">= 20x", s >= TARGETS["batched_speedup"], "{}x")
    if "loop" in res:
        lp = res["loop"]
        check("orchestration", 100 * lp["orchestration_share"], "<= 5%",
              lp["orchestration_share"] <= TARGETS["orchestration_share"], "{:.1f}%")
        check("no-op repro", lp["noop_repro_seconds"], "<= 5 s",
              lp["noop_repro_seconds"] <= TARGETS["noop_repro_seconds"], "{} s")
        check("loop", lp["loop_seconds"] / 60, "<= 5 min", lp["loop_seconds"] <= TARGETS["loop_seconds"], "{:.1f} min")
    if "scaling" in comp:
        r2 = comp["scaling"]["r2"]
        check("linear in prompts R^2", r2, ">= 0.98", r2 >= TARGETS["linear_r2"], "{}")
    if "cuda" in res:
        g = res["cuda"]
        checks.append(f"GPU sampling {g['sampling']['batched_tokens_per_s']} tok/s, vllm: "
                      + (f"{g['vllm']['vs_hf_batched']}x hf" if "vs_hf_batched" in g["vllm"] else g["vllm"]["skipped"]))
    return "targets: " + " | ".join(checks)


def _git_sha() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True).stdout.strip() or None
    except OSError:
        return None


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="JSON file for the figures (default reports/benchmark.json; "
                                               "with --quick a temporary file)")
    p.add_argument("--quick", action="store_true",
                   help="every step at the tiny sizes: that the command completes, no target checked (CI)")
    p.add_argument("--workdir", help="reuse a repo where the loop has run (skips the loop benchmarks)")
    p.add_argument("--no-flow", action="store_true", help="skip the Prefect flow run")
    p.add_argument("--direct", action="store_true",
                   help="run the loop's stage commands without DVC, Prefect or MLflow (in --workdir)")
    p.add_argument("--single-prompts", type=int, default=32, help="prompts sampled one sequence at a time")
    args = p.parse_args(argv)

    import torch

    from self_improve.artifacts import write_json

    res: dict = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                             "torch": torch.__version__,
                             "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None},
                 "git_sha": _git_sha()}
    out = Path(args.out or (Path(tempfile.gettempdir()) / "benchmark_quick.json" if args.quick
                            else "reports/benchmark.json"))
    res["quick"] = args.quick

    def save() -> None:  # after every section, so a later failure keeps what was measured
        write_json(res, out, sort_keys=False)

    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        if args.direct:
            work = Path(args.workdir).resolve() if args.workdir else clone(Path(tmp) / "direct")
            res["loop_direct"] = bench_direct(work)
        elif args.workdir:
            work = Path(args.workdir).resolve()
        else:
            res["loop"], work = bench_loop(Path(tmp), args.quick)
            save()
            if not args.no_flow:
                res["loop"]["prefect"] = bench_flow(Path(tmp), args.quick)
        save()
        print("compute: sampling, scoring, training, scaling on the default model ...", flush=True)
        single = min(args.single_prompts, 2) if args.quick else args.single_prompts
        res["cpu"] = bench_compute(work, "cpu", single)
        save()
        if torch.cuda.is_available():
            res["cuda"] = bench_compute(work, "cuda", single)
            save()
        if not args.direct:  # a stage beside busy processes, in a clone of its own
            from benchmarks.busy import bench_busy

            res["busy"] = bench_busy(clone(Path(tmp) / "busy"), args.quick)
            save()
    print(json.dumps(res, indent=2))
    print(f"figures written to {out}")
    if args.quick:
        if "error" in res.get("loop", {}).get("prefect", {}):
            sys.exit(f"bench: the Prefect flow failed: {res['loop']['prefect']['error']}")
        print("quick: every step completed; the tiny sizes make no target meaningful, none checked")
        return
    print(summary_line(res))


if __name__ == "__main__":
    main()
