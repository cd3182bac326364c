"""vLLM's offline engine (`vllm.LLM`) in a worker process of another Python, fed over a pipe.

Run by a Python that has vLLM (`sample.vllm.server_python`, e.g. .venv-vllm/bin/python: vLLM pins other
transformers and prefect versions than the project's), so it imports nothing of the project:

    PYTHON self_improve/engines/vllm_worker.py '{"model": DIR, "dtype": "bfloat16", ...}'

It loads the model, writes `{"ready": true}` as a line on its stdout, then answers each request line
(prompts as token ids, n, temperature, top_p, max_tokens, a seed per prompt, stop ids) with one line: per prompt,
per sample, the text, whether max_tokens cut it, and its token count. vLLM's own output goes to
stderr. `LLM.generate` queues a request's prompts before its first step, so how they are batched does
not depend on timing and a seed gives the same samples again (`vllm serve` adds them while it steps).
The engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, set by the client).
"""

import json
import os
import sys


def main(argv: list[str]) -> None:
    spec = json.loads(argv[0])
    protocol = os.fdopen(os.dup(1), "w")  # the replies; anything printed goes to stderr
    os.dup2(2, 1)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=spec["model"], dtype=spec["dtype"], seed=0, max_model_len=spec["max_model_len"],
              trust_remote_code=spec.get("trust_remote_code", False), enforce_eager=spec.get("enforce_eager", True),
              enable_chunked_prefill=False, max_num_batched_tokens=spec["max_num_batched_tokens"],
              load_format=spec.get("load_format", "safetensors"))
    protocol.write(json.dumps({"ready": True}) + "\n")
    protocol.flush()
    for line in sys.stdin:
        req = json.loads(line)
        greedy = req["temperature"] == 0.0
        params = [SamplingParams(n=req["n"], temperature=req["temperature"], top_p=1.0 if greedy else req["top_p"],
                                 max_tokens=req["max_tokens"], seed=None if greedy else seed,
                                 stop_token_ids=req["stop_token_ids"], skip_special_tokens=True)
                  for seed in req["seeds"]]  # one per prompt: sample j of a request draws with its seed + j
        outs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in req["prompts"]], params, use_tqdm=False)
        reply = [[[o.text, o.finish_reason == "length", len(o.token_ids)] for o in r.outputs] for r in outs]
        protocol.write(json.dumps({"outputs": reply}) + "\n")
        protocol.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
