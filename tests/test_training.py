"""The train stage as a user runs it: killed part way and resumed, and under `accelerate launch`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
import torch
import yaml
from safetensors.torch import load_file

from self_improve import artifacts as art
from self_improve.models.loading import save_model

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
    from self_improve.models.loading import load_model

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
    from self_improve.training.loop import Checkpoints

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


def _under(config: str, d: Path, argv: list[str], name: str, **popen) -> subprocess.CompletedProcess | subprocess.Popen:
    """dvc.yaml's command as it is, `python -m stages.train ...`, with SELF_IMPROVE_ACCELERATE_CONFIG
    naming one of configs/accelerate/: the stage relaunches itself under `accelerate launch`."""
    env = {**_env(), "SELF_IMPROVE_ACCELERATE_CONFIG": str(ROOT / "configs" / "accelerate" / config)}
    cmd = [sys.executable, "-m", "stages.train", *argv, *_outs(d, name)]
    if popen:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, **popen)
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_fsdp_on_two_cpu_processes_trains_the_weights_ddp_trains(train_inputs, lora):
    d, argv = train_inputs
    (d / "params.yaml").write_text(yaml.safe_dump(deep_merge(
        TINY, {"train": {"algorithm": "raft", "epochs": 2, "batch_size": 8, "lora": {"enabled": lora}}})))
    fsdp = _under("fsdp.yaml", d, argv, "fsdp")
    assert fsdp.returncode == 0, fsdp.stderr[-3000:]
    assert "training on 2 processes (DistributedType.FSDP)" in fsdp.stderr
    ddp = _under("ddp.yaml", d, argv, "ddp")
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert "training on 2 processes (DistributedType.MULTI_CPU)" in ddp.stderr
    m_fsdp, m_ddp = (art.read_json(d / name / "metrics.json") for name in ("fsdp", "ddp"))
    assert m_fsdp["train_processes"] == m_ddp["train_processes"] == 2
    assert m_fsdp["train_steps"] == m_ddp["train_steps"] == 2 * N // 8
    assert m_fsdp["train_loss"] == pytest.approx(m_ddp["train_loss"], rel=1e-5)
    # the sharded run wrote whole weights (gathered on the main process) equal to DDP's
    fsdp_w, ddp_w = _weights(d, "fsdp"), _weights(d, "ddp")
    assert fsdp_w.keys() == ddp_w.keys()
    assert all(torch.allclose(fsdp_w[k], ddp_w[k], atol=1e-5) for k in fsdp_w)
    start = load_file(d / "start" / "model.safetensors")
    assert any(not torch.equal(start[k], fsdp_w[k]) for k in start)
    if lora:
        assert (d / "fsdp" / "model" / "adapters" / "it1" / "adapter_model.safetensors").is_file()


@pytest.mark.e2e  # three two-process launches, one SIGKILLed: with the other kill tests in `make test-e2e`
def test_fsdp_training_killed_part_way_resumes_from_its_gathered_checkpoint(train_inputs):
    d, argv = train_inputs
    (d / "params.yaml").write_text(yaml.safe_dump(deep_merge(
        TINY, {"train": {"algorithm": "raft", "epochs": 6, "batch_size": 8, "checkpoint_every": 4,
                         "lora": {"r": 8}}})))
    steps = 6 * N // 8
    whole = _under("fsdp.yaml", d, argv, "whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    # the same run, every process of it SIGKILLed as soon as a checkpoint is written
    proc = _under("fsdp.yaml", d, argv, "cut", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                  start_new_session=True)
    state = d / "cut" / "ckpt" / "state.pt"
    deadline = time.time() + 240
    while not state.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.002)
    # the launcher's workers run in sessions of their own: kill the whole tree, as a crash would
    tree = psutil.Process(proc.pid).children(recursive=True)
    os.killpg(proc.pid, signal.SIGKILL)
    for child in tree:
        child.kill()
    proc.wait()
    psutil.wait_procs(tree, timeout=30)
    assert state.exists(), "no checkpoint was written before the run ended"
    assert not (d / "cut" / "model").exists()
    saved = torch.load(state, weights_only=True)
    assert saved["sharded"] and 0 < saved["step"] < steps
    # whole LoRA tensors, by name: any number of processes can resume from them
    lora_a = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight"
    assert saved["trainable"][lora_a].shape == (8, 32)
    done = _under("fsdp.yaml", d, argv, "cut")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resuming from the checkpoint at step" in done.stderr
    assert art.read_json(d / "cut" / "metrics.json")["train_resumed_from"] >= saved["step"]
    whole_w, cut_w = _weights(d, "whole"), _weights(d, "cut")
    assert all(torch.allclose(whole_w[k], cut_w[k], atol=1e-6) for k in whole_w)


def test_a_launcher_config_that_does_not_exist_is_refused_before_training(train_inputs):
    d, argv = train_inputs
    done = _under("no-such.yaml", d, argv, "missing")
    assert done.returncode == 2
    assert "SELF_IMPROVE_ACCELERATE_CONFIG=" in done.stderr and "no-such.yaml: no such accelerate config file" in done.stderr
    assert not (d / "missing").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="DeepSpeed is refused only without a GPU")
def test_deepspeed_without_a_gpu_is_refused_not_trained_as_ddp(monkeypatch):
    from self_improve.distributed import make_accelerator
    from self_improve.errors import ConfigError

    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")  # what `accelerate launch` sets for a DeepSpeed config
    with pytest.raises(ConfigError, match="asks for DeepSpeed, which accelerate runs on GPUs only"):
        make_accelerator()


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
