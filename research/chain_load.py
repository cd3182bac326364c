"""Does loading an iteration's model cost more as the loop goes on? Load time, peak memory and the
model directory's size of a LoRA chain of 1 .. 6 adapters on SmolLM2-135M-Instruct.

    python -m research.chain_load WORKSPACE --out research/results/chain_load.json

WORKSPACE is a finished real-model loop (runners/plain.py's, with data/it0/model the base record and
data/it1..it3/model its trained chains). Chains of 4-6 adapters are made from it3's by adding
adapters of the same shape (LoRA on every linear layer, the loop's `train.lora`) with random
weights: merging costs the same whatever the values. Each load runs in a fresh process, as a stage
does (`load_model(itN, base=it0)`), three times; the figures are the median seconds and the peak RSS.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
import json, resource, sys, time
t = time.perf_counter()
from self_improve.models.loading import load_model
from self_improve.config import parse_params
import yaml
params = parse_params(yaml.safe_load(open(sys.argv[3])))
model, tok = load_model(sys.argv[1], device="cpu", base=sys.argv[2], model_cfg=params.model)
print(json.dumps({"seconds": time.perf_counter() - t, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def extend(work: Path, out: Path, upto: int) -> dict[int, Path]:
    """it1..it3 of the workspace and it4..`upto` made from it3's chain: {n: model dir}."""
    import torch

    from self_improve.config import parse_params
    from self_improve.models.loading import attach_lora, load_model, save_adapter_chain

    params = parse_params(yaml.safe_load((work / "params.yaml").read_text()))
    dirs = {n: work / "data" / f"it{n}" / "model" for n in (1, 2, 3)}
    base = work / "data" / "it0" / "model"
    for n in range(4, upto + 1):
        model, _ = load_model(dirs[n - 1], device="cpu", base=base, model_cfg=params.model)
        torch.manual_seed(n)
        peft = attach_lora(model, params.train.lora)
        with torch.no_grad():
            for name, p in peft.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 1e-3)
        dirs[n] = out / f"it{n}" / "model"
        save_adapter_chain(peft, dirs[n - 1], base, f"it{n}", dirs[n], {"stage": "research.chain_load"})
    return dirs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workspace", type=Path)
    ap.add_argument("--out", default="research/results/chain_load.json")
    ap.add_argument("--scratch", type=Path, default=Path("/tmp/chain_load"))
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    dirs = extend(args.workspace, args.scratch, 6)
    base = args.workspace / "data" / "it0" / "model"
    rows = []
    for n in (1, 3, 6):
        runs = [json.loads(subprocess.run([sys.executable, "-c", PROBE, str(dirs[n]), str(base),
                                           str(args.workspace / "params.yaml")], cwd=ROOT, capture_output=True,
                                          text=True, check=True).stdout.strip().splitlines()[-1])
                for _ in range(args.repeats)]
        size = sum(f.stat().st_size for f in dirs[n].rglob("*") if f.is_file())
        rows.append({"adapters": n, "load_seconds": round(statistics.median(r["seconds"] for r in runs), 2),
                     "peak_rss_mb": round(max(r["peak_rss_mb"] for r in runs)), "model_dir_mb": round(size / 2**20, 1)})
        print(rows[-1], flush=True)
    (ROOT / args.out).write_text(json.dumps({"workspace": str(args.workspace), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
