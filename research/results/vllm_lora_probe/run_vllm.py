"""Greedy held-out answers on vLLM (bfloat16): the merged model, or the base with the chain as one LoRA."""
import json, sys, time
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

mode, model, lora, prompts_file, out = sys.argv[1:6]
limit = int(sys.argv[6]) if len(sys.argv) > 6 else None
spec = json.load(open(prompts_file))
if mode == "lorafast":  # one adapter: a matmul instead of a per-token gather of its weights
    import torch
    from vllm.lora.ops.torch_ops import lora_ops
    from vllm.lora.punica_wrapper import punica_cpu
    orig = {n: getattr(lora_ops, n) for n in ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")}
    def one(w, idx):
        if idx.numel() and bool((idx == 0).all()) and w.shape[0] == 1:
            return w.reshape(w.shape[-2], w.shape[-1])
        return None
    def shrink(inputs, w, out, idx, scaling=1.0):
        W = one(w, idx)
        if W is None:
            return orig["bgmv_shrink"](inputs, w, out, idx, scaling)
        o = inputs.to(out.dtype) @ W.to(out.dtype).T
        out[:, : o.shape[1]] = scaling * o
    def expand(inputs, w, out, idx, add_inputs=True):
        W = one(w, idx)
        if W is None:
            return orig["bgmv_expand"](inputs, w, out, idx, add_inputs)
        o = inputs.to(out.dtype) @ W.to(out.dtype).T
        n = min(o.shape[1], out.shape[1])
        if add_inputs:
            out[:, :n] += o[: out.shape[0], :n]
        else:
            out[:, :n] = o[: out.shape[0], :n]
    def expand_slice(inputs, w, out, idx, off, size, add_inputs=True):
        W = one(w, idx)
        if W is None:
            return orig["bgmv_expand_slice"](inputs, w, out, idx, off, size, add_inputs)
        o = inputs.to(out.dtype) @ W.to(out.dtype).T
        if add_inputs:
            out[:, off:off + size] += o
        else:
            out[:, off:off + size] = o
    for mod in (lora_ops, punica_cpu):
        for n, f in (("bgmv_shrink", shrink), ("bgmv_expand", expand), ("bgmv_expand_slice", expand_slice)):
            if hasattr(mod, n):
                setattr(mod, n, f)
kw = dict(enable_lora=True, max_lora_rank=32, max_loras=1) if mode.startswith("lora") else {}
llm = LLM(model=model, dtype="bfloat16", seed=0, max_model_len=1024, enforce_eager=True,
          enable_chunked_prefill=False, max_num_batched_tokens=2048, **kw)
req = None
if mode.startswith("lora"):
    from vllm.lora.request import LoRARequest
    req = LoRARequest("chain", 1, lora)
params = SamplingParams(n=1, temperature=0.0, max_tokens=128, stop_token_ids=spec["stop"], skip_special_tokens=True)
prompts = [TokensPrompt(prompt_token_ids=i) for i in spec["prompts"][:limit]]
t = time.perf_counter()
outs = llm.generate(prompts, params, use_tqdm=False, lora_request=req)
secs = time.perf_counter() - t
toks = sum(len(o.outputs[0].token_ids) for o in outs)
json.dump({"mode": mode, "seconds": secs, "new_tokens": toks, "rate": toks / secs,
           "texts": [o.outputs[0].text for o in outs]}, open(out, "w"))
print(mode, round(secs, 1), toks, round(toks / secs, 1), file=sys.stderr)
