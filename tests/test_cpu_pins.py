"""Importing `self_improve` (and so any stage) holds torch to its AVX2 kernels on x86, so a seed gives the same bytes on an
AVX2 and an AVX-512 machine; `SELF_IMPROVE_CPU_ISA=native` opts out."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from self_improve.cpu import _has_avx2

from .conftest import ROOT

PINS = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "SELF_IMPROVE_CPU_ISA")
PROBE = "import stages, torch; print(torch.backends.cpu.get_cpu_capability())"


def _capability(**env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in PINS}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env={**clean, **env}, capture_output=True,
                         text=True, check=True)
    return out.stdout.strip()


@pytest.mark.skipif(not _has_avx2(), reason="an x86 CPU with AVX2 only")
def test_stages_pin_torch_to_avx2_unless_told_otherwise():
    assert _capability() == "AVX2"
    assert _capability(ATEN_CPU_CAPABILITY="default") == "DEFAULT"  # the user's own setting wins
    native = _capability(SELF_IMPROVE_CPU_ISA="native")
    assert native in {"AVX2", "AVX512"}


def test_an_unpinned_child_gets_native_and_none_of_the_pins():
    from self_improve.cpu import PINS, unpinned_env

    env = unpinned_env({**PINS, "PATH": "/bin", "SELF_IMPROVE_CPU_ISA": "avx2"})
    assert env == {"PATH": "/bin", "SELF_IMPROVE_CPU_ISA": "native"}


@pytest.mark.parametrize("asked, preset, want", [
    (None, None, None), ("default", None, None), ("passive", None, "PASSIVE"), ("passive", "ACTIVE", "ACTIVE")])
def test_openmp_waits_passively_only_when_asked(asked, preset, want):
    """SELF_IMPROVE_OMP_WAIT=passive sets OMP_WAIT_POLICY=PASSIVE before torch loads; by default, and
    over the user's own OMP_WAIT_POLICY, OpenMP keeps its own (make bench's busy section)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "SELF_IMPROVE_OMP_WAIT")}
    env |= {k: v for k, v in (("SELF_IMPROVE_OMP_WAIT", asked), ("OMP_WAIT_POLICY", preset)) if v}
    out = subprocess.run([sys.executable, "-c", "import os, self_improve; print(os.environ.get('OMP_WAIT_POLICY'))"],
                         cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(want)


def test_thread_counts_follow_the_cpus_the_process_may_run_on():
    from self_improve.cpu import usable_cpus

    assert usable_cpus() == len(os.sched_getaffinity(0))
    if len(os.sched_getaffinity(0)) > 1 and shutil.which("taskset"):  # one CPU granted: one thread
        out = subprocess.run(["taskset", "-c", "0", sys.executable, "-c",
                              "from self_improve.cpu import usable_cpus; print(usable_cpus())"],
                             cwd=ROOT, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == "1"
