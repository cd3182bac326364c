"""Shared fixtures: a tiny config that runs the whole loop in seconds."""

from __future__ import annotations

import ast
import copy
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

TINY = {
    "seed": 0,
    "task": {"min_operand": 10, "max_operand": 99, "heldout_size": 30, "ttt_size": 30},
    "prepare": {
        "model": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64},
        "train_size": 200, "steps": 30, "batch_size": 32, "warmup_steps": 5,
    },
    "evolve": {"fresh": 6, "keep_top": 4, "rewrites": 2},
    "sample": {"backend": "hf", "k": 2, "max_new_tokens": 4, "batch_size": 256},  # as params.yaml
    "judge": {"method": "co_reward"},
    "train": {"epochs": 1, "batch_size": 32},
    "evaluate": {"k": 2, "batch_size": 256},
    "tracking": {"enabled": False},
    "loop": {"it1": {"prev": "it0", "ref": "init"}, "it2": {"prev": "it1", "ref": "it0"},
             "it3": {"prev": "it2", "ref": "it1"}},
}


def deep_merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def tiny_full() -> dict:
    """The repo's params.yaml with the tiny overrides: every section DVC expects is present."""
    return deep_merge(yaml.safe_load((ROOT / "params.yaml").read_text()), TINY)


@pytest.fixture(scope="session")
def tok():
    from self_improve.models.loading import build_char_tokenizer

    return build_char_tokenizer()


@pytest.fixture(scope="session")
def trained(tok):
    """A tiny model trained a little so its greedy outputs depend on the prompt (do not train it further)."""
    from self_improve.config import ModelShape
    from self_improve.models.loading import build_tiny_model
    from self_improve.training.loop import Schedule
    from self_improve.training.trainers import RunContext, SFTTrainer

    model = build_tiny_model(ModelShape(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), tok, 0)
    prompts = [f"{a}+{b}=" for a in range(10, 40) for b in range(10, 20)]
    SFTTrainer(RunContext(tok, Schedule(3e-3, 60), 32)).train(model, prompts, [str(eval(p[:-1])) for p in prompts])
    return model


@pytest.fixture
def tiny_raw() -> dict:
    return copy.deepcopy(TINY)


@pytest.fixture
def tiny_params_file(tmp_path, tiny_raw) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(tiny_raw))
    return path


# Fixed names and dates: two copies of the same files get the same commit, hence the same
# provenance (git sha) in their artifacts.
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@localhost",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@localhost",
           "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}


def git_copy(dest: Path, params: dict, env: dict) -> None:
    """A fresh git repo at `dest` holding the repo's tracked files and `params` as params.yaml."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split("\0")
    for rel in filter(None, files):
        if (ROOT / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)
    (dest / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    for cmd in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"], ["git", "commit", "-qm", "tiny"]):
        subprocess.run(cmd, cwd=dest, env={**env, **GIT_ENV}, check=True)


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def build_bpe_chat_model(path: Path, seed: int = 0) -> Path:
    """A small 'pretrained' HF model directory built here, no download: a byte-level BPE tokenizer
    trained on arithmetic text, a ChatML chat template whose end of turn is <|im_end|>, a
    generation config with two eos ids, and a tiny Llama with random weights."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    corpus = [f"user\n{a}+{b}=\nassistant\nThe answer is {a + b}." for a in range(0, 100, 3) for b in range(0, 100, 7)]
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = CHATML
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                         eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
                         pad_token_id=tok.pad_token_id, bos_token_id=None, tie_word_embeddings=True)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=[tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")],
        pad_token_id=tok.pad_token_id)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def bpe_model_dir(tmp_path_factory) -> Path:
    return build_bpe_chat_model(tmp_path_factory.mktemp("pretrained") / "bpe-chat")


def defines_something(path: Path) -> bool:
    """False for a package's __init__.py that holds only its docstring: importing it runs nothing."""
    body = ast.parse(path.read_text()).body
    return any(not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)) for n in body)


# The in-process loop: every stage's main() with the arguments dvc.yaml gives, in DAG order.
def stage_modules() -> dict:
    from stages import (
        bstar,
        check_params,
        engine,
        evaluate,
        evolve,
        judge,
        pairs,
        prepare,
        report,
        sample,
        train,
    )

    return {m.__name__.split(".")[-1]: m for m in (check_params, prepare, engine, evolve, bstar, sample, judge,
                                                    pairs, train, evaluate, report)}


def stage_commands() -> list[list[str]]:
    """The stage commands of dvc.yaml, in DAG order, with `foreach` unrolled."""
    from runners.dag import stage_commands as dag_commands

    return [argv for _, argv in dag_commands(ROOT)]


def stage_argv(name: str) -> list[str]:
    """One stage's arguments as dvc.yaml gives them (after `python -m stages.<module>`)."""
    from runners.dag import stage_commands as dag_commands

    return next(argv[3:] for stage, argv in dag_commands(ROOT) if stage == name)


def run_all(workdir: Path, params: Path, monkeypatch) -> None:
    modules = stage_modules()
    monkeypatch.chdir(workdir)
    for cmd in stage_commands():
        assert cmd[:2] == ["python", "-m"]
        modules[cmd[2].split(".")[1]].main(cmd[3:] + ["--params", str(params)])


# Tiers: `unit` (pure functions and single stages, seconds), `loop` (whole loops in-process on tiny
# models, the bulk of `make test`'s time), `e2e` (real dvc, MLflow, Prefect, a killed FSDP launch) and `slow` (SmolLM2).
LOOP_FIXTURES = {"variant_run", "pretrained_loop"}  # fixtures that run whole loops


def pytest_collection_modifyitems(config, items):
    for item in items:
        if LOOP_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.loop)
        if not any(item.get_closest_marker(m) for m in ("loop", "e2e", "slow")):
            item.add_marker(pytest.mark.unit)
