"""CPU kernels pinned before torch loads (imported first by `self_improve`).

The same seed must give the same
bytes on any x86 machine, but torch, MKL and oneDNN pick their kernels by the instruction set
they find: AVX-512 where it is, AVX2 elsewhere, and the two round differently, so one seed trained
a different tiny base model on each (held-out 0.460 vs 0.488 at it0 on the default), and every
figure after it inherited the difference. So on an x86 CPU with AVX2 every library is held to its
AVX2 kernels (`ATEN_CPU_CAPABILITY`, `MKL_CBWR`, `ONEDNN_MAX_CPU_ISA`), unless the environment
already sets them. `SELF_IMPROVE_CPU_ISA=native` lets each library take the fastest kernels it
finds instead (results then depend on the machine). The number of threads still matters: a
reduction split over 2 threads adds in another order than over 16.

On a machine another process keeps busy (a browser, a shared runner), OpenMP's threads, which spin
for a while before they sleep, fight it for the cores. `SELF_IMPROVE_OMP_WAIT=passive` makes them wait
passively (`OMP_WAIT_POLICY=PASSIVE`, unless the environment sets it). make bench's `busy` section
measures both policies: on 2 cores the tiny base model's training ran 3.67x slower beside one busy
process under OpenMP's default and 1.04x under the passive one, but 1.44x slower alone with it, so
the default stays OpenMP's own (docs/speed.md).
"""


from __future__ import annotations

import os
import platform


def cpu_flags() -> set[str]:
    """The CPU's feature flags (/proc/cpuinfo), empty where that cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return set()


def _has_avx2() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64") and "avx2" in cpu_flags()


PINS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
PINNED_BY = "SELF_IMPROVE_PINNED"  # set beside the pins this module set (children inherit both)


def pin_cpu_kernels() -> dict[str, str]:
    """Set the AVX2 pins (those not already set) and, when asked, OpenMP's passive wait; returns the pins in force."""
    if os.environ.get("SELF_IMPROVE_CPU_ISA", "avx2").lower() != "native" and _has_avx2():
        if "ONEDNN_MAX_CPU_ISA" not in os.environ:
            os.environ[PINNED_BY] = "1"
        for key, value in PINS.items():
            os.environ.setdefault(key, value)
    if os.environ.get("SELF_IMPROVE_OMP_WAIT", "default").lower() == "passive":
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return {key: os.environ[key] for key in PINS if key in os.environ}


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity: a container's or `taskset`'s share), not the machine's."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def unpinned_env(env: dict[str, str]) -> dict[str, str]:
    """`env` for a child process that takes the CPU's own kernels: SELF_IMPROVE_CPU_ISA=native and
    none of the pins this process set."""
    return {**{k: v for k, v in env.items() if k not in PINS and k != PINNED_BY}, "SELF_IMPROVE_CPU_ISA": "native"}


def allow_bf16_kernels() -> bool:
    """Lift this process's oneDNN pin (AVX2, where bfloat16 is emulated) so that a bfloat16 stage runs on
    the CPU's bfloat16 kernels (avx512_bf16, AMX): oneDNN reads ONEDNN_MAX_CPU_ISA at its first bfloat16
    primitive, so this works until then. Only the pin this module set is lifted; True when it was."""
    if os.environ.get("ONEDNN_MAX_CPU_ISA") != PINS["ONEDNN_MAX_CPU_ISA"] or os.environ.get(PINNED_BY) != "1":
        return False
    os.environ["ONEDNN_MAX_CPU_ISA"] = "ALL"
    return True
