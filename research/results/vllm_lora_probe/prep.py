"""Prompts of a workspace's held-out set as chat ids, and its itN adapter chain as one LoRA."""
import json, sys
from pathlib import Path
import pandas as pd, torch
from safetensors.torch import load_file, save_file
from self_improve.chat import ChatFormat

ws, it, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
out.mkdir(parents=True, exist_ok=True)
base = Path("models/smollm2-135m-instruct")
chat = ChatFormat.from_dir(base, False)
held = pd.read_parquet(ws / "data/task/heldout.parquet")
json.dump({"prompts": [chat.prompt_ids(p) for p in held["prompt"]], "stop": chat.stop_ids},
          open(out / "prompts.json", "w"))
chain = json.loads((ws / f"data/{it}/model/chain.json").read_text())
As, Bs = {}, {}
for name in chain["adapters"]:
    d = ws / f"data/{it}/model/adapters/{name}"
    cfg = json.loads((d / "adapter_config.json").read_text())
    s = cfg["lora_alpha"] / cfg["r"]
    w = load_file(d / "adapter_model.safetensors")
    for k, v in w.items():
        mod = k.rsplit(".lora_", 1)[0]
        if ".lora_A." in k:
            As.setdefault(mod, []).append(v.float() * s)
        else:
            Bs.setdefault(mod, []).append(v.float())
merged = {}
for mod in As:
    merged[f"{mod}.lora_A.weight"] = torch.cat(As[mod], 0).contiguous()
    merged[f"{mod}.lora_B.weight"] = torch.cat(Bs[mod], 1).contiguous()
r = next(iter(merged.values())).shape[0]
cfg["r"], cfg["lora_alpha"] = r, r
(out / "lora").mkdir(exist_ok=True)
save_file(merged, out / "lora/adapter_model.safetensors")
(out / "lora/adapter_config.json").write_text(json.dumps(cfg, indent=1))
# check: the combined delta equals the sum of the chain's deltas on one module
mod = next(iter(As))
full = sum(b @ a for a, b in zip(As[mod], Bs[mod]))
one = merged[f"{mod}.lora_B.weight"] @ merged[f"{mod}.lora_A.weight"]
print("rank", r, "modules", len(As), "max diff", float((full - one).abs().max()), "norm", float(full.norm()))
