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
for a while before they sleep, fight it for the cores: on 2 cores the tiny base model's training ran
3.67x slower beside one busy process under OpenMP's own wait policy, 1.04x under the passive one; but
alone the passive one was 1.44x slower (make bench's `busy` section, docs/speed.md). So by default
(`SELF_IMPROVE_OMP_WAIT=auto`) each process looks, before torch loads, at how busy its CPUs are
(/proc/stat over 0.1 s, its own time left out): where other processes keep half a CPU or more busy its
threads wait passively (`OMP_WAIT_POLICY=PASSIVE`), elsewhere OpenMP keeps its own policy. The wait
policy changes no result, only the time; the thread count, which would, is left alone.
`SELF_IMPROVE_OMP_WAIT=openmp` or `passive` fixes the policy; a user's own OMP_WAIT_POLICY wins.
"""


from __future__ import annotations

import os
import platform
import time


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


WAITS = ("auto", "openmp", "passive")  # SELF_IMPROVE_OMP_WAIT
WAIT_SET_BY = "SELF_IMPROVE_OMP_WAIT_SET"  # the OMP_WAIT_POLICY this module set: a child decides afresh
BUSY_CPUS = 0.5  # CPUs other processes keep busy from which `auto` waits passively
WAIT_DECISION: dict = {}  # this process's: the policy asked, the busy CPUs seen, OMP_WAIT_POLICY in force


def pin_cpu_kernels() -> dict[str, str]:
    """Set the AVX2 pins (those not already set) and, once per process, OpenMP's wait policy; returns the pins in force."""
    if os.environ.get("SELF_IMPROVE_CPU_ISA", "avx2").lower() != "native" and _has_avx2():
        if "ONEDNN_MAX_CPU_ISA" not in os.environ:
            os.environ[PINNED_BY] = "1"
        for key, value in PINS.items():
            os.environ.setdefault(key, value)
    if not WAIT_DECISION:
        WAIT_DECISION.update(set_wait_policy())
    return {key: os.environ[key] for key in PINS if key in os.environ}


def set_wait_policy() -> dict:
    """OpenMP's wait policy for this process, as SELF_IMPROVE_OMP_WAIT asks (module docstring): passive
    where asked, or under `auto` where other processes keep BUSY_CPUS or more of this process's CPUs
    busy. A parent's choice (WAIT_SET_BY) is dropped and made again; a user's OMP_WAIT_POLICY is kept."""
    asked = os.environ.get("SELF_IMPROVE_OMP_WAIT", "auto").lower()
    if asked not in WAITS:
        raise ValueError(f"SELF_IMPROVE_OMP_WAIT: {asked!r} is not one of {', '.join(WAITS)}")
    if WAIT_SET_BY in os.environ and os.environ.get("OMP_WAIT_POLICY") == os.environ[WAIT_SET_BY]:
        del os.environ["OMP_WAIT_POLICY"]
    os.environ.pop(WAIT_SET_BY, None)
    busy = None
    if "OMP_WAIT_POLICY" not in os.environ:
        if asked == "auto" and usable_cpus() > 1:
            busy = others_busy()
        if asked == "passive" or (busy or 0.0) >= BUSY_CPUS:
            os.environ["OMP_WAIT_POLICY"] = os.environ[WAIT_SET_BY] = "PASSIVE"
    return {"asked": asked, "others_busy": None if busy is None else round(busy, 2),
            "omp_wait": os.environ.get("OMP_WAIT_POLICY", "openmp")}


def others_busy(window: float = 0.1) -> float | None:
    """How many CPUs' worth of this process's CPUs other processes kept busy over `window` seconds:
    /proc/stat's counters of those CPUs less this process's own time. None where they cannot be read."""
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    first, own = _cpu_ticks(cpus), os.times()
    if first is None:
        return None
    time.sleep(window)
    last, own_after = _cpu_ticks(cpus), os.times()
    if last is None or last[1] <= first[1]:
        return None
    busy, total, n = last[0] - first[0], last[1] - first[1], last[2]
    elapsed = total / n / os.sysconf("SC_CLK_TCK")  # seconds each CPU's counters advanced
    mine = (own_after.user + own_after.system - own.user - own.system) / elapsed
    return max(0.0, busy / (total / n) - mine)


def _cpu_ticks(cpus: set[int] | None) -> tuple[int, int, int] | None:
    """(busy, total, count) clock ticks of `cpus` (None: all) from /proc/stat; None where it cannot be read."""
    busy = total = count = 0
    try:
        with open("/proc/stat", encoding="ascii") as f:
            for line in f:
                name, *fields = line.split()
                if not name.startswith("cpu") or name == "cpu" or (cpus is not None and int(name[3:]) not in cpus):
                    continue
                ticks = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal
                total, busy, count = total + sum(ticks), busy + sum(ticks) - ticks[3] - ticks[4], count + 1
    except (OSError, ValueError, IndexError):
        return None
    return (busy, total, count) if count else None


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
