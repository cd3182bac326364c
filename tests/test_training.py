"""The train stage as a user runs it: killed part way and resumed, and under `accelerate launch`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from safetensors.torch import load_file

from stages.lib import artifacts as art
from stages.lib.models import save_model

from .conftest import ROOT, TINY, deep_merge

N = 64


@pytest.fixture
def train_inputs(tmp_path, tok, trained) -> tuple[Path, list[str]]:
    """A starting model, RAFT data, params; returns the dir and the stage's argv (no outputs)."""
    save_model(trained, tok, tmp_path / "start", {"test": True})
    prompts = [f"{a}+{b}=" for a, b in zip(range(10, 10 + N), range(50, 50 + N))]
    sft = pd.DataFrame({"iteration": "it1", "prompt_id": [f"p{i}" for i in range(N)], "prompt": prompts,
                        "response": [str(eval(p[:-1])) for p in prompts], "reward": 1.0, "correct": 1.0})
    art.write_table(sft, tmp_path / "sft.parquet", art.SFT)
    art.write_table(art.empty_table(art.PAIRS), tmp_path / "pairs.parquet", art.PAIRS)
    art.write_table(art.empty_table(art.GROUPS), tmp_path / "groups.parquet", art.GROUPS)
    params = deep_merge(TINY, {"train": {"algorithm": "raft", "epochs": 40, "batch_size": 4, "lr": 3e-3,
                                         "checkpoint_every": 25}})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    argv = ["--iteration", "it1", "--model", str(tmp_path / "start"), "--pairs", str(tmp_path / "pairs.parquet"),
            "--sft", str(tmp_path / "sft.parquet"), "--groups", str(tmp_path / "groups.parquet"),
            "--params", str(tmp_path / "params.yaml")]
    return tmp_path, argv


def _outs(d: Path, name: str) -> list[str]:
    return ["--out", str(d / name / "model"), "--metrics", str(d / name / "metrics.json"),
            "--checkpoints", str(d / name / "ckpt")]


def _weights(d: Path, name: str) -> dict[str, torch.Tensor]:
    """The weights of the stage's output: the start model with the iteration's adapter merged."""
    from stages.lib.models import load_model

    return load_model(d / name / "model", device="cpu", base=d / "start")[0].state_dict()


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def test_killed_training_resumes_from_its_checkpoint(train_inputs):
    d, argv = train_inputs
    cmd = [sys.executable, "-m", "stages.train", *argv]
    subprocess.run(cmd + _outs(d, "whole"), cwd=ROOT, env=_env(), check=True, capture_output=True)
    # the same run, SIGKILLed as soon as it has written a checkpoint
    proc = subprocess.Popen(cmd + _outs(d, "cut"), cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    state = d / "cut" / "ckpt" / "state.pt"
    deadline = time.time() + 120
    while not state.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert state.exists(), "no checkpoint was written before the run ended"
    assert not (d / "cut" / "model").exists()  # killed: no model, no metrics
    step = torch.load(state, weights_only=True)["step"]
    assert 0 < step < 40 * N // 4
    done = subprocess.run(cmd + _outs(d, "cut"), cwd=ROOT, env=_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "resuming from the checkpoint at step" in done.stderr
    metrics = art.read_json(d / "cut" / "metrics.json")
    assert metrics["train_resumed_from"] >= step
    assert metrics["train_steps"] == art.read_json(d / "whole" / "metrics.json")["train_steps"]
    whole, resumed = _weights(d, "whole"), _weights(d, "cut")
    assert all(torch.allclose(whole[k], resumed[k], atol=1e-6) for k in whole)
    assert (d / "cut" / "ckpt" / "done.json").is_file() and not state.exists()
    # a checkpoint written for other inputs or params, or a torn one, is not resumed
    from stages.lib.training import Checkpoints

    Checkpoints(d / "other", "inputs-a", 1).save({"step": 3})
    assert Checkpoints(d / "other", "inputs-a", 1).load()["step"] == 3
    assert Checkpoints(d / "other", "inputs-b", 1).load() is None
    (d / "other" / "state.pt").write_bytes(b"torn")
    assert Checkpoints(d / "other", "inputs-a", 1).load() is None


def test_accelerate_launch_runs_the_stage_on_two_processes(train_inputs):
    d, argv = train_inputs
    (d / "params.yaml").write_text(yaml.safe_dump(
        deep_merge(TINY, {"train": {"algorithm": "raft", "epochs": 2, "batch_size": 8}})))
    # `--multi_gpu` is accelerate's torchrun launcher; without a GPU each process runs on the CPU (gloo)
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
              "-m", "stages.train", *argv, *_outs(d, "ddp")]
    done = subprocess.run(launch, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "training on 2 processes" in done.stderr
    metrics = art.read_json(d / "ddp" / "metrics.json")
    assert metrics["train_processes"] == 2 and metrics["train_steps"] == 2 * N // 8
    start = load_file(d / "start" / "model.safetensors")
    after = _weights(d, "ddp")
    assert any(not torch.equal(start[k], after[k]) for k in start)


def test_a_non_finite_loss_stops_training_without_writing_a_model(train_inputs, tok, trained, capsys):
    import copy

    from stages import train

    d, argv = train_inputs
    broken = copy.deepcopy(trained)
    with torch.no_grad():
        broken.lm_head.weight[0, 0] = float("nan")
    save_model(broken, tok, d / "start", {"test": True})
    with pytest.raises(SystemExit) as exit_:
        train.main(argv + _outs(d, "nan"))
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "loss is nan at step 0" in err and "without writing a model" in err
    assert not (d / "nan" / "model").exists() and not (d / "nan" / "metrics.json").exists()


def test_no_training_data_passes_the_model_on_and_leaves_the_checkpoint_dir(train_inputs):
    from stages import train

    d, argv = train_inputs
    art.write_table(art.empty_table(art.SFT), d / "sft.parquet", art.SFT)
    train.main(argv + _outs(d, "empty"))
    assert art.read_json(d / "empty" / "metrics.json")["train_examples"] == 0
    assert (d / "empty" / "ckpt" / "done.json").is_file()  # DVC's output exists even so
    start = load_file(d / "start" / "model.safetensors")
    after = _weights(d, "empty")  # a fresh adapter (B = 0) merged: the same weights
    assert all(torch.equal(start[k], after[k]) for k in start)
