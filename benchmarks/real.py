"""Where the time and memory of a real-model iteration go: SmolLM2-135M-Instruct on this machine.

    make bench-real      # = python -m benchmarks.real --model models/smollm2-135m-instruct \
                         #       --out reports/benchmark_smollm2.json

1. The model's plain forward pass over 16 x 128 tokens: the token rate no stage can beat.
2. Sampling through the chat format: 64 prompts in one batched call vs 8 prompts one at a time
   (generated tokens/s), and log-prob scoring of those samples (tokens/s).
   The engines side by side (`engines`): hf, CTranslate2 float32 and int8 on 64 word problems of the recipe, greedy (k 1) and sampled (k 8) new tokens/s, how many greedy
   answers equal hf's, and each engine's greedy accuracy with its s.e. Log-prob scoring of k 8
   samples per problem on torch and on CTranslate2's forward pass (`scoring`, `--scoring-only`).
3. The train stage itself, as a subprocess on 64 of those samples (RAFT, LoRA): batch 64 with
   micro-batches of 8 and, for comparison, of 64; its peak RSS, training tokens/s and the bytes its
   iteration writes (the adapter) against the base model's size; and at micro-batch 8 the stage in
   float32 under the AVX2 pins, in float32 on the CPU's own kernels, and with `train.bf16` (mixed
   precision, AMX where the CPU has it) on them (`train_precision`, `--precision-only`).
4. With --loop-timings (the SELF_IMPROVE_TIMINGS file of a real-model loop) and --loop-seconds
   (its wall time): the share of the loop spent outside the stages' own work (DVC, process starts,
   MLflow). `make loop-smollm2` with SELF_IMPROVE_TIMINGS set writes such a file, and
   `research/real_loops.py` keeps one beside each result with the wall time in the result
   (`--loop-only` updates just these figures).

5. `adaptive` and `iteration` (benchmarks/iteration.py): adaptive sampling replayed on a fixed stream of
   it0's samples (samples saved, labels and pairs kept), and one V3 iteration (sample, judge, pairs, train,
   engine, evaluate) timed with today's settings and with the recipe's in the same run, and where
   .venv-vllm exists with the recipe's on vLLM's CPU build (overlay vllm-cpu): the ratios (`ratio`,
   `ratio_vllm`), each stage's share, training's share of the machine's matmul rate (`--iteration-only`
   updates just these).

The last line printed sums up the targets. `--quick` (`make bench-real-quick`, what CI runs) does
every step on a few prompts, short answers and one small training batch, into a temporary file:
that the command completes from a fresh clone, no target checked.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"iteration_ratio": 2.0, "batched_sampling_vs_forward": 0.5, "train_peak_rss_gb": 4.0, "iteration_bytes_share": 0.05,
           "orchestration_share": 0.05, "ct2_k8_vs_hf": 3.0, "ct2_float32_greedy_equal": 0.95}


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def forward_rate(model) -> float:
    """Tokens/s of the model's plain forward pass over 16 x 128 tokens: what no stage can beat."""
    import torch

    ids = torch.randint(0, model.config.vocab_size, (16, 128), generator=torch.Generator().manual_seed(0))
    ids = ids.to(next(model.parameters()).device)
    with torch.no_grad():
        model(input_ids=ids[:2, :32])  # warm-up
        _, secs = timed(lambda: (model(input_ids=ids), _sync()))
    return round(ids.numel() / secs, 1)


# the sizes of each step: the full run, and --quick's few prompts and short answers
FULL = {"prompts": 64, "singles": 8, "new_tokens": 32, "engine_new_tokens": 48, "k": 8, "micro": (8, 64),
        "batch": 64, "epochs": 2}
QUICK = {"prompts": 8, "singles": 2, "new_tokens": 8, "engine_new_tokens": 8, "k": 2, "micro": (8,),
         "batch": 8, "epochs": 1}


def micro(model_dir: Path, size: dict = FULL) -> tuple[dict, list[str], list[str]]:
    import torch

    from self_improve.engines.hf import SamplingSpec, chat_format, generate, score
    from self_improve.models.loading import load_model, set_threads

    set_threads()
    model, tok = load_model(model_dir)  # the GPU when there is one, in model.dtype auto (bf16 there)
    chat = chat_format(model, tok)
    out: dict = {"threads": torch.get_num_threads(), "device": str(next(model.parameters()).device),
                 "dtype": str(next(model.parameters()).dtype)}
    out["forward_tokens_per_s"] = forward_rate(model)
    prompts = [f"What is {a} + {b}?" for a, b in zip(range(11, 75), range(30, 94))][:size["prompts"]]
    spec = SamplingSpec(n=1, temperature=0.7, max_new_tokens=size["new_tokens"], batch_size=64)
    generate(model, tok, prompts[:4], spec, seed=0, progress=False, chat=chat)  # warm-up
    res, secs = timed(lambda: generate(model, tok, prompts, spec, seed=1, progress=False, chat=chat))
    out["sampling_batched_tokens_per_s"] = round(res.new_tokens / secs, 1)
    out["sampling_batched_truncated_share"] = round(res.truncated_share(), 3)
    one = SamplingSpec(n=1, temperature=0.7, max_new_tokens=size["new_tokens"], batch_size=1)
    singles, secs = timed(lambda: [generate(model, tok, [p], one, seed=i, progress=False, chat=chat)
                                   for i, p in enumerate(prompts[:size["singles"]])])
    out["sampling_single_tokens_per_s"] = round(sum(g.new_tokens for g in singles) / secs, 1)
    out["batched_vs_single"] = round(out["sampling_batched_tokens_per_s"] / out["sampling_single_tokens_per_s"], 1)
    out["batched_sampling_vs_forward"] = round(out["sampling_batched_tokens_per_s"] / out["forward_tokens_per_s"], 3)
    responses = [r[0] for r in res]
    sc, secs = timed(lambda: score(model, tok, prompts, responses, batch_size=64, progress=False, chat=chat))
    out["scoring_tokens_per_s"] = round(sc.processed_tokens / secs, 1)
    return out, prompts, responses


INSTRUCTION = "Answer with the final number only."  # the SmolLM2 recipe's task.instruction


def engines(model_dir: Path, n_prompts: int = 64, max_new_tokens: int = 48) -> dict:
    """hf, ct2 float32, ct2 int8 and ct2 float32 with two sampling lanes (`sample.ct2.lanes: 2`) on the
    same word problems: new tokens/s greedy (k 1) and sampled (k 8, temperature 0.7), how many greedy
    answers equal hf's, and greedy accuracy on the problems (with its binomial s.e.). Where `make vllm-env` made
    .venv-vllm, vLLM's CPU build too, as recipe vllm-cpu serves it (bfloat16 where the CPU has it, no graph
    compilation): its rates leave out its start, reported beside them (`vllm_server_start_seconds`)."""
    from self_improve.config import Ct2Config, TaskConfig
    from self_improve.engines.ct2 import CT2Sampler, convert, ct2_unavailable
    from self_improve.engines.hf import SamplingSpec
    from self_improve.engines.sampler import HFSampler
    from self_improve.models.loading import load_model, set_threads
    from self_improve.quality import binomial_se
    from self_improve.tasks import task_for

    set_threads()
    task = task_for(TaskConfig(name="word_math", instruction=INSTRUCTION, heldout_size=n_prompts, ttt_size=8))
    problems = task.sets(0, 0).heldout
    prompts, gold = list(problems["prompt"]), list(problems["answer"])
    greedy = SamplingSpec(n=1, greedy=True, max_new_tokens=max_new_tokens, batch_size=64)
    sampled = SamplingSpec(n=8, temperature=0.7, max_new_tokens=max_new_tokens, batch_size=512)
    out: dict = {"prompts": len(prompts), "max_new_tokens": max_new_tokens, "task": "word_math",
                 "instruction": INSTRUCTION}
    model, tok = load_model(model_dir, device="cpu")
    out["forward_tokens_per_s"] = forward_rate(model)
    samplers = {"hf": HFSampler(model, tok)}
    tmp = tempfile.TemporaryDirectory(prefix="bench-ct2-")
    if ct2_unavailable():
        out["ct2"] = ct2_unavailable()
    else:
        (_, secs) = timed(lambda: convert(model_dir, None, Path(tmp.name) / "engine"))
        out["ct2_conversion_seconds"] = round(secs, 1)
        for compute_type in ("float32", "int8"):
            samplers[f"ct2_{compute_type}"] = CT2Sampler(Path(tmp.name) / "engine", Ct2Config(compute_type=compute_type))
        # recipe V2's sampling: two seeded single-threaded generators on alternate batches (greedy: as float32)
        samplers["ct2_float32_lanes2"] = CT2Sampler(Path(tmp.name) / "engine", Ct2Config(compute_type="float32", lanes=2))
    vllm_server = vllm_sampler(model_dir)
    if vllm_server is not None:
        (sampler, secs) = vllm_server
        out["vllm_server_start_seconds"] = round(secs, 1)
        samplers[f"vllm_{sampler.dtype}"] = sampler
    runs: dict = {}
    for name, sampler in samplers.items():
        sampler.generate(prompts[:2], greedy, 0, progress=False)  # warm-up
        res_g, secs_g = timed(lambda: sampler.generate(prompts, greedy, 0, progress=False))
        res_s, secs_s = timed(lambda: sampler.generate(prompts, sampled, 1, progress=False))
        preds = [task.extract(r[0]).answer for r in res_g]
        acc = sum(task.verify(p, a) for p, a in zip(preds, gold)) / len(gold)
        runs[name] = {"k1_new_tokens_per_s": round(res_g.new_tokens / secs_g, 1),
                      "k8_new_tokens_per_s": round(res_s.new_tokens / secs_s, 1),
                      "k1_seconds": round(secs_g, 1), "k8_seconds": round(secs_s, 1),
                      "greedy_truncated_share": round(res_g.truncated_share(), 3),
                      "greedy_accuracy": round(acc, 4), "greedy_accuracy_se": round(binomial_se(acc, len(gold)), 4),
                      "texts": [r[0] for r in res_g]}
    hf_texts = runs["hf"]["texts"]
    for r in runs.values():
        texts = r.pop("texts")
        r["greedy_equal_to_hf"] = sum(a == b for a, b in zip(texts, hf_texts))
        r["k1_speedup_vs_hf"] = round(r["k1_new_tokens_per_s"] / runs["hf"]["k1_new_tokens_per_s"], 2)
        r["k8_speedup_vs_hf"] = round(r["k8_new_tokens_per_s"] / runs["hf"]["k8_new_tokens_per_s"], 2)
    out["runs"] = runs
    out["best_k8_vs_forward"] = round(max(r["k8_new_tokens_per_s"] for r in runs.values()) / out["forward_tokens_per_s"], 3)
    if vllm_server is not None:
        vllm_server[0].close()
    tmp.cleanup()
    return out


def vllm_sampler(model_dir: Path):
    """(a sampler on `model_dir` with recipe vllm-cpu's settings, seconds it took to be ready), or None
    without .venv-vllm."""
    from benchmarks.iteration import VLLM_PYTHON, VLLM_RECIPE
    from self_improve import recipes
    from self_improve.config import VllmConfig
    from self_improve.engines.vllm_server import VLLMServer, VLLMServerSampler, VLLMWorkerSampler, server_dtype

    if not VLLM_PYTHON.is_file():
        return None
    overlay = recipes.load(VLLM_RECIPE, ROOT)
    cfg = VllmConfig(server_python=str(VLLM_PYTHON), **{k.removeprefix("sample.vllm."): v for k, v in overlay.items()
                                                        if k.startswith("sample.vllm.") and k != "sample.vllm.server_python"})
    start = time.perf_counter()
    if cfg.offline:  # the recipe's: vLLM's offline engine in a worker process
        sampler = VLLMWorkerSampler(cfg.server_python, model_dir, cfg, 1024)
    else:
        sampler = VLLMServerSampler(model_dir, cfg, server=VLLMServer(cfg.server_python, model_dir, cfg, 1024))
    sampler.dtype = server_dtype(cfg.server_dtype)
    return sampler, time.perf_counter() - start


def scoring(model_dir: Path, n_prompts: int = 64, k: int = 8, max_new_tokens: int = 48) -> dict:
    """Log-prob scoring (summed log-probs and self-certainty per response, what the judges read) on
    torch (`hf.score`) and on CTranslate2 float32's forward pass (`CT2Sampler.score`), on both
    cores, of the same k samples per word problem (drawn by ct2 at T 0.7): tokens/s of each, best
    of two timed calls after a warm-up, and the largest difference between their figures."""
    from self_improve.config import Ct2Config, TaskConfig
    from self_improve.engines.ct2 import CT2Sampler, convert, ct2_unavailable
    from self_improve.engines.hf import SamplingSpec, score
    from self_improve.models.loading import load_model, set_threads
    from self_improve.tasks import task_for

    if ct2_unavailable():
        return {"skipped": ct2_unavailable()}
    set_threads()
    task = task_for(TaskConfig(name="word_math", instruction=INSTRUCTION, heldout_size=n_prompts, ttt_size=8))
    prompts = list(task.sets(0, 0).heldout["prompt"])
    model, tok = load_model(model_dir, device="cpu")
    with tempfile.TemporaryDirectory(prefix="bench-ct2-") as tmp:
        convert(model_dir, None, Path(tmp) / "engine")
        ct2 = CT2Sampler(Path(tmp) / "engine", Ct2Config(compute_type="float32"))
        spec = SamplingSpec(n=k, temperature=0.7, max_new_tokens=max_new_tokens, batch_size=512)
        sampled = ct2.generate(prompts, spec, 1, progress=False)
        sp = [p for p, group in zip(prompts, sampled) for _ in group]
        sr = [t for group in sampled for t in group]
        runs = {"hf": lambda: score(model, tok, sp, sr, batch_size=64, progress=False),
                "ct2_float32": lambda: ct2.score(sp, sr, batch_size=64, progress=False)}
        secs: dict = {name: [] for name in runs}
        res: dict = {}
        for name, run in runs.items():
            run()  # warm-up
        for _ in range(2):  # alternated, so that a slower spell of the machine does not favour one
            for name, run in runs.items():
                res[name], t = timed(run)
                secs[name].append(t)
    hf, c = res["hf"], res["ct2_float32"]
    rate = {name: round(res[name].processed_tokens / min(secs[name]), 1) for name in runs}
    return {"responses": len(sr), "tokens": hf.processed_tokens, "hf_tokens_per_s": rate["hf"],
            "ct2_float32_tokens_per_s": rate["ct2_float32"],
            "ct2_vs_hf": round(rate["ct2_float32"] / rate["hf"], 2),
            "max_abs_logp_difference": round(max(abs(a - b) for a, b in zip(hf.logp, c.logp)), 5),
            "max_abs_self_certainty_difference": round(
                max(abs(a - b) for a, b in zip(hf.self_certainty, c.self_certainty)), 5)}


# The peak is the stage's own: VmHWM belongs to the memory the stage's process maps after exec, where
# Linux carries ru_maxrss over from the parent at the fork (this bench's parent holds the models of
# the steps above: every child read 7.92 GB that way, 3.28 on its own); ru_maxrss where /proc is not.
_MEASURED_TRAIN = (
    "import resource, runpy, sys\n"
    "sys.argv = ['stages.train'] + sys.argv[1:]\n"
    "try:\n    runpy.run_module('stages.train', run_name='__main__')\n"
    "finally:\n"
    "    try:\n"
    "        kb = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:'))\n"
    "    except (OSError, StopIteration):\n"
    "        kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
    "    print('PEAK_RSS_KB', kb, file=sys.stderr)\n"
    "    import torch\n"
    "    if torch.cuda.is_available():\n"
    "        print('PEAK_GPU_BYTES', torch.cuda.max_memory_allocated(), file=sys.stderr)\n")


def _train_inputs(work: Path, model_dir: Path, prompts: list[str], responses: list[str], train: dict) -> None:
    """A train stage's inputs in `work`: the base's record, RAFT rows of the prompts and responses, empty
    pairs and groups, and params.yaml with `train` (the bench's batch, epochs, precision) over the defaults."""
    import pandas as pd
    import yaml

    from self_improve import artifacts as art
    from self_improve.config import ModelConfig
    from self_improve.models.base import resolve_base
    from self_improve.models.loading import write_base_record

    work.mkdir(parents=True)
    write_base_record(resolve_base(ModelConfig(base=str(model_dir))), work / "it0", {"bench": True})
    n = len(prompts)
    sft = pd.DataFrame({"iteration": "it1", "prompt_id": [f"p{i}" for i in range(n)], "prompt": prompts,
                        "response": responses, "reward": 1.0, "correct": None})
    art.write_table(sft, work / "sft.parquet", art.SFT)
    art.write_table(art.empty_table(art.PAIRS), work / "pairs.parquet", art.PAIRS)
    art.write_table(art.empty_table(art.GROUPS), work / "groups.parquet", art.GROUPS)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["model"].update(base=str(model_dir), max_length=256)
    params["train"].update(algorithm="raft", checkpoint_every=0, **train)
    (work / "params.yaml").write_text(yaml.safe_dump(params))


def train_stage(model_dir: Path, prompts: list[str], responses: list[str], micro_batch: int, tmp: Path,
                bf16: bool = False, native: bool = False, batch: int = 64, epochs: int = 2) -> dict:
    """The train stage as a user runs it, in its own process: peak RSS, tokens/s, bytes written.
    `bf16`: train.bf16 (mixed precision); `native`: SELF_IMPROVE_CPU_ISA=native (no AVX2 pins)."""
    from self_improve.cpu import unpinned_env
    from self_improve.engines.hf import chat_format
    from self_improve.models.loading import load_model

    work = tmp / f"train-micro{micro_batch}{'-bf16' if bf16 else ''}{'-native' if native else ''}"
    _train_inputs(work, model_dir, prompts, responses,
                  dict(epochs=epochs, batch_size=batch, micro_batch_size=micro_batch, bf16=bf16))
    timings = work / "timings.jsonl"
    cmd = [sys.executable, "-c", _MEASURED_TRAIN, "--iteration", "it1", "--model", str(work / "it0"),
           "--base", str(work / "it0"), "--pairs", str(work / "pairs.parquet"), "--sft", str(work / "sft.parquet"),
           "--groups", str(work / "groups.parquet"), "--out", str(work / "it1"),
           "--metrics", str(work / "metrics.json"), "--params", str(work / "params.yaml")]
    env = {**os.environ, "SELF_IMPROVE_TIMINGS": str(timings), "SELF_IMPROVE_TRACKING": "0"}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=unpinned_env(env) if native else env)
    if proc.returncode != 0:
        sys.exit(f"bench: the train stage failed:\n{proc.stderr[-3000:]}")
    rss_kb = int(next(line.split()[1] for line in proc.stderr.splitlines() if line.startswith("PEAK_RSS_KB")))
    gpu = [int(line.split()[1]) for line in proc.stderr.splitlines() if line.startswith("PEAK_GPU_BYTES")]
    metrics = json.loads((work / "metrics.json").read_text())
    model, tok = load_model(work / "it0", device="cpu")
    chat = chat_format(model, tok)
    tokens = sum(len(chat.prompt_ids(p)) + len(chat.response_ids(r)) for p, r in zip(prompts, responses))
    stage_seconds = json.loads(timings.read_text().splitlines()[-1])["seconds"]
    written = sum(f.stat().st_size for f in (work / "it1").rglob("*") if f.is_file())
    base_bytes = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    return {"micro_batch_size": micro_batch, "batch_size": batch, "rows": len(prompts), "epochs": epochs,
            "bf16": bf16, "cpu_isa": "native" if native else "pinned",
            "loss_first": round(metrics["train_loss_first"], 5),
            "train_steps": metrics["train_steps"], "peak_rss_gb": round(rss_kb / 2**20, 2),
            **({"peak_gpu_gb": round(gpu[0] / 2**30, 2)} if gpu else {}),
            "stage_seconds": round(stage_seconds, 1),
            "train_tokens_per_s": round(epochs * tokens / stage_seconds, 1),  # includes loading: a lower bound
            "iteration_bytes": written, "base_bytes": base_bytes, "iteration_bytes_share": round(written / base_bytes, 4)}


BF16_FLAGS = {"amx_bf16", "avx512_bf16"}  # the CPU instructions that compute in bfloat16


def precision(model_dir: Path, prompts: list[str], responses: list[str], tmp: Path, size: dict = FULL,
              bf16: bool = False, pinned: dict | None = None) -> dict:
    """The train stage at micro-batch 8 in float32 under the AVX2 pins (the default), in float32 with
    the CPU's own kernels, and with train.bf16 on them (AMX where the CPU has it): seconds, speed-up
    over the default, and each run's first loss (mixed precision should leave it near float32's).
    The full bf16 run is skipped, and said so, on a CPU-only machine without bfloat16 instructions (`bf16` runs it
    anyway): emulated there, it measures nothing a user would choose and takes most of the command.
    `pinned`: a run of the same stage already made at micro-batch size["micro"][0] (the memory step's
    first), taken as the float32 pinned run instead of training it again."""
    import torch

    from self_improve.cpu import cpu_flags

    flags = cpu_flags()
    variants = [("pinned_float32", False, False), ("native_float32", False, True)]
    skipped = {}
    # quick: every path, at sizes where emulation costs little; a GPU trains the stage in bf16 itself
    if bf16 or size is QUICK or BF16_FLAGS & flags or torch.cuda.is_available():
        variants.append(("native_bf16", True, True))
    else:  # emulated: 24x float32's time on an AVX2-only CPU (docs/speed.md)
        skipped["native_bf16"] = f"no bfloat16 instructions in this CPU ({' / '.join(sorted(BF16_FLAGS))}); --bf16 runs it"
    runs = {name: dict(pinned) if name == "pinned_float32" and pinned is not None else
            train_stage(model_dir, prompts, responses, size["micro"][0], tmp, bf16=use_bf16, native=native,
                        batch=size["batch"], epochs=size["epochs"])
            for name, use_bf16, native in variants}
    base = runs["pinned_float32"]["stage_seconds"]
    for run in runs.values():
        run["speedup_vs_pinned_float32"] = round(base / run["stage_seconds"], 2)
    return {"amx_bf16": "amx_bf16" in flags, "runs": runs, **({"skipped": skipped} if skipped else {})}


# the timed iteration at --quick's size: a few problems, short answers
QUICK_ITERATION = {"task.heldout_size": 12, "task.ttt_size": 6, "task.dev_size": 6, "evolve.fresh": 2, "sample.k": 4,
                   "sample.max_new_tokens": 16, "evaluate.max_new_tokens": 16, "train.epochs": 1}


def iteration_figures(model_dir: Path, size: dict, seed: int = 0) -> dict:
    """`adaptive` and `iteration` (benchmarks/iteration.py), at --quick's sizes when `size` is QUICK."""
    from benchmarks.iteration import adaptive_stream, iteration

    quick = size is QUICK
    sets = {"evaluate.support_k": 0} | (QUICK_ITERATION if quick else {})  # the base support is not the iteration's
    with tempfile.TemporaryDirectory(prefix="bench-iteration-") as tmp:
        timed_run = iteration(model_dir, Path(tmp), seed=seed, sets=sets)
    return {"adaptive": adaptive_stream(model_dir, problems=4 if quick else 64, seed=seed, without_stop=not quick),
            "iteration": timed_run}


def orchestration(timings: Path, wall: float) -> dict:
    rows = [json.loads(line) for line in timings.read_text().splitlines() if line.strip()]
    work = sum(r["seconds"] for r in rows)  # the stages' own work, after their imports
    mlflow_s = sum(r.get("tracking_seconds", 0.0) for r in rows)
    stages: dict[str, float] = {}
    for r in rows:
        key = f"{r['stage']}@{r['iteration']}" if r["iteration"] else r["stage"]
        stages[key] = round(r["seconds"], 1)
    return {"loop_seconds": round(wall, 1), "stage_work_seconds": round(work, 1),
            "orchestration_share": round((wall - work + mlflow_s) / wall, 4), "stages": stages}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.real", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="models/smollm2-135m-instruct", help="a local HF model directory")
    p.add_argument("--out", default=None, help="JSON file for the figures (default reports/benchmark_smollm2.json; "
                                               "with --quick a temporary file)")
    p.add_argument("--quick", action="store_true",
                   help="every step on a few prompts: that the command completes, no target checked (CI)")
    p.add_argument("--loop-timings", help="SELF_IMPROVE_TIMINGS file of a real-model loop")
    p.add_argument("--loop-seconds", type=float, help="that loop's wall time")
    p.add_argument("--loop-only", action="store_true",
                   help="only the orchestration share: update the `loop` figures of --out, keep the rest")
    p.add_argument("--engines-only", action="store_true",
                   help="only the engines' comparison: update the `engines` figures of --out, keep the rest")
    p.add_argument("--scoring-only", action="store_true",
                   help="only log-prob scoring on torch and ct2: update the `scoring` figures of --out, keep the rest")
    p.add_argument("--bf16", action="store_true",
                   help="run the train stage in bf16 even on a CPU without bfloat16 instructions (emulated: slow)")
    p.add_argument("--iteration-only", action="store_true",
                   help="only the adaptive replay and the timed V3 iteration: update those figures of --out")
    p.add_argument("--vllm-iteration-only", action="store_true",
                   help="only the V3 iteration with today's settings and with the fast ones on vLLM's CPU build "
                   "(make vllm-env), timed in one run: the `iteration_vllm` figures of --out")
    p.add_argument("--seed", type=int, default=0, help="the timed iteration's seed")
    p.add_argument("--precision-only", action="store_true",
                   help="only the train stage in float32 / float32 unpinned / bf16: update the `train_precision` figures")
    return p


def _one_section(args: argparse.Namespace, size: dict, parser: argparse.ArgumentParser) -> bool:
    """The --*-only modes: measure one section and replace it in --out, keeping the rest; False for none."""
    from self_improve.artifacts import write_json

    def update(key: str, figures: dict) -> dict:
        out = Path(args.out)
        result = json.loads(out.read_text()) if out.exists() else {}
        result[key] = figures
        write_json(result, out, sort_keys=False)
        return figures

    model = Path(args.model)
    if args.iteration_only:
        for key, figures in iteration_figures(model, size, args.seed).items():
            print(json.dumps(update(key, figures), indent=1), flush=True)
    elif args.vllm_iteration_only:
        from benchmarks.iteration import VLLM_PYTHON, iteration

        if not VLLM_PYTHON.is_file():
            raise SystemExit(f"--vllm-iteration-only: {VLLM_PYTHON} does not exist (make vllm-env)")
        with tempfile.TemporaryDirectory(prefix="bench-iteration-") as tmp:
            figures = iteration(model, Path(tmp), seed=args.seed, sets={"evaluate.support_k": 0},
                                only=("today", "fast_vllm"))
        print(json.dumps(update("iteration_vllm", figures), indent=1), flush=True)
    elif args.precision_only:
        _, prompts, responses = micro(model)
        with tempfile.TemporaryDirectory() as tmp:
            figures = precision(model, prompts, responses, Path(tmp), bf16=args.bf16)
        print(json.dumps(update("train_precision", figures), indent=1))
    elif args.scoring_only:
        print(json.dumps(update("scoring", scoring(model)), indent=1))
    elif args.engines_only:
        print(json.dumps(update("engines", engines(model)), indent=1))
    elif args.loop_only:
        if not (args.loop_timings and args.loop_seconds):
            parser.error("--loop-only needs --loop-timings and --loop-seconds")
        loop = update("loop", orchestration(Path(args.loop_timings), args.loop_seconds))
        share = loop["orchestration_share"]
        print(json.dumps({k: v for k, v in loop.items() if k != "stages"}))
        print(f"targets: orchestration_share {'met' if share <= TARGETS['orchestration_share'] else 'MISSED'}")
    else:
        return False
    return True


def _every_section(args: argparse.Namespace, size: dict) -> dict:
    """Every section measured in one run, printed as it ends."""
    model_dir = Path(args.model)
    result: dict = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "model": str(model_dir)}}
    result["quick"] = args.quick
    sampling, prompts, responses = micro(model_dir, size)
    result["inference"] = sampling
    print(json.dumps(sampling), flush=True)
    result["engines"] = engines(model_dir, size["prompts"], size["engine_new_tokens"])
    print(json.dumps(result["engines"]), flush=True)
    result["scoring"] = scoring(model_dir, size["prompts"], size["k"], size["engine_new_tokens"])
    print(json.dumps(result["scoring"]), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        result["train"] = [train_stage(model_dir, prompts, responses, m, Path(tmp), batch=size["batch"],
                                       epochs=size["epochs"]) for m in size["micro"]]
        # its own folder: the memory runs above already used train-micro8 in this one
        result["train_precision"] = precision(model_dir, prompts, responses, Path(tmp) / "precision", size,
                                               bf16=args.bf16, pinned=result["train"][0])
    print(json.dumps(result["train"]), flush=True)
    print(json.dumps(result["train_precision"]), flush=True)
    if args.loop_timings and args.loop_seconds:
        result["loop"] = orchestration(Path(args.loop_timings), args.loop_seconds)
    result |= iteration_figures(model_dir, size, args.seed)
    print(json.dumps({k: result[k] for k in ("adaptive", "iteration")}), flush=True)
    return result


def targets_met(result: dict) -> dict[str, bool]:
    """Each target of TARGETS the figures reach (or miss)."""
    t8 = result["train"][0]
    runs = result["engines"]["runs"]
    checks = {"batched_sampling_vs_forward":
              result["inference"]["batched_sampling_vs_forward"] >= TARGETS["batched_sampling_vs_forward"]}
    if "ct2_float32" in runs:
        checks.update({
            "ct2_k8_vs_hf": max(runs[k]["k8_speedup_vs_hf"] for k in runs) >= TARGETS["ct2_k8_vs_hf"],
            "best_k8_vs_forward": result["engines"]["best_k8_vs_forward"] >= TARGETS["batched_sampling_vs_forward"],
            "ct2_float32_greedy_equal": runs["ct2_float32"]["greedy_equal_to_hf"]
            >= TARGETS["ct2_float32_greedy_equal"] * result["engines"]["prompts"],
        })
    checks.update({
        "train_peak_rss_gb": t8["peak_rss_gb"] <= TARGETS["train_peak_rss_gb"],
        "iteration_bytes_share": t8["iteration_bytes_share"] <= TARGETS["iteration_bytes_share"],
    })
    # the fast settings on either engine: ct2 (`ratio`) or vLLM's CPU build where .venv-vllm exists (`ratio_vllm`)
    runs = (result["iteration"], result.get("iteration_vllm") or {})
    best = max(run.get(k) or 0 for run in runs for k in ("ratio", "ratio_vllm"))
    checks["iteration_ratio"] = best >= TARGETS["iteration_ratio"]
    if "loop" in result:
        checks["orchestration_share"] = result["loop"]["orchestration_share"] <= TARGETS["orchestration_share"]
    return checks


def main(argv: list[str] | None = None) -> None:
    from self_improve.artifacts import write_json

    parser = _parser()
    args = parser.parse_args(argv)
    size = QUICK if args.quick else FULL
    args.out = args.out or (str(Path(tempfile.gettempdir()) / "benchmark_smollm2_quick.json") if args.quick
                            else "reports/benchmark_smollm2.json")
    if _one_section(args, size, parser):
        return
    result = _every_section(args, size)
    write_json(result, args.out, sort_keys=False)
    if args.quick:
        print(f"figures written to {args.out}")
        print("quick: every step completed; at these sizes no target is meaningful, none checked")
        return
    checks = targets_met(result)
    print("targets: " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in checks.items()))


if __name__ == "__main__":
    main()
