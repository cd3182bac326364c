"""The train stage on several processes: which launcher runs it, and FSDP2 through accelerate.

`SELF_IMPROVE_ACCELERATE_CONFIG=<accelerate config>` makes `python -m stages.train ...` (dvc.yaml's
command, unchanged) re-execute itself under `accelerate launch --config_file <config>`; the
config decides DDP, FSDP or DeepSpeed and the number of processes (configs/accelerate/). The
variable is not a params key: it decides where the stage runs, not what it computes, so setting it
does not make DVC rerun anything.

FSDP on CPU: accelerate (1.x) chooses FSDP only on accelerator devices and silently trains a CPU
FSDP config as DDP. torch's FSDP2 (`fully_shard`) does run on CPU over gloo, so when the launcher
asked for FSDP and accelerate settled for MULTI_CPU, the accelerator state is switched to FSDP and
accelerate's own FSDP2 preparation, gradient clipping and state-dict gathering run as on GPUs.
That keeps one code path, the GPU one, testable on a CPU machine.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import torch

from self_improve.errors import ConfigError

log = logging.getLogger(__name__)

LAUNCH_ENV = "SELF_IMPROVE_ACCELERATE_CONFIG"


def launched() -> bool:
    """Whether this process was started by a distributed launcher (accelerate, torchrun)."""
    return "LOCAL_RANK" in os.environ or "ACCELERATE_LAUNCHED" in os.environ


def relaunch_command(module: str, argv: list[str]) -> list[str] | None:
    """The command that reruns `python -m module argv` under `accelerate launch` with the config
    named by SELF_IMPROVE_ACCELERATE_CONFIG, or None (not set, or already launched)."""
    config = os.environ.get(LAUNCH_ENV, "").strip()
    if not config or launched():
        return None
    if not Path(config).is_file():
        raise ConfigError(f"{LAUNCH_ENV}={config}: no such accelerate config file")
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", config, "-m", module, *argv]


def relaunch(module: str, argv: list[str]) -> None:
    """Replace this process by the launcher's when SELF_IMPROVE_ACCELERATE_CONFIG asks for one."""
    cmd = relaunch_command(module, argv)
    if cmd is None:
        return
    log.info("%s under accelerate launch --config_file %s", module, cmd[4])
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(cmd[0], cmd, {**os.environ, "ACCELERATE_LAUNCHED": "1"})


def make_accelerator():
    """An `accelerate.Accelerator` for training: CPU processes over gloo when there is no GPU, and
    FSDP2 when the launcher asked for it, on CPU as well."""
    from accelerate import Accelerator, PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true" and not torch.cuda.is_available():
        raise ConfigError(f"{LAUNCH_ENV}: the accelerate config asks for DeepSpeed, which accelerate runs on GPUs "
                          "only (without one it would train as DDP); use configs/accelerate/fsdp.yaml here")
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    wants_fsdp = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    if wants_fsdp and accelerator.distributed_type == DistributedType.MULTI_CPU:
        plugin = FullyShardedDataParallelPlugin()  # from the launcher's FSDP_* variables
        if plugin.fsdp_version != 2:
            raise ConfigError(f"{LAUNCH_ENV}: FSDP on CPU needs fsdp_version: 2 in the accelerate config "
                              f"(it has {plugin.fsdp_version})")
        accelerator.state.fsdp_plugin = plugin
        # both shared states: every AcceleratorState() made later copies PartialState's fields
        PartialState().distributed_type = accelerator.state.distributed_type = DistributedType.FSDP
    return accelerator


def is_fsdp(accelerator) -> bool:
    if accelerator is None:
        return False
    from accelerate.utils import DistributedType

    return accelerator.distributed_type == DistributedType.FSDP
