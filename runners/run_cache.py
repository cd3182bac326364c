"""The plain runner's run cache: a stage run before with the same command, the same bytes in every path it
declares as a dependency and the same values of the params it declares gets that run's outputs back
instead of running again, as DVC's run-cache gives them to `dvc repro` and `dvc exp run`.

    python -m runners.plain WORKDIR --cache DIR
    python -m research.real_loops ... --plain /tmp/loops --run-cache /tmp/loops/run-cache

Loops that differ only in their judgment (an arm and its controls at one seed) share the base stages
(prepare, engine_base, evaluate_base): the second and later ones restore them. The key also holds what
changes a stage's floating point without showing in its files: the thread counts, the CPU kernel pins,
the accelerator, the Python and torch versions. Code the stage imports is part of its deps (dvc.yaml's
code deps, read from the repository when the workspace holds no copy). Outputs are stored and restored
as hard links where the file system allows (stages write their outputs whole, through a new file, never
in place: self_improve/artifacts.py's atomic_path), copies elsewhere; an entry appears whole or not at all.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import sys
import time
import uuid
from pathlib import Path

from runners.dag import Stage, param

# what changes a stage's numbers without changing its inputs' bytes
ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA",
       "CUDA_VISIBLE_DEVICES", "SELF_IMPROVE_CPU_ISA")
SKIPPED = ("__pycache__",)  # written by Python itself, not inputs
ENTRY = "run.json"


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _put(src: Path, dst: Path) -> None:
    """`src` (a file or a folder) at `dst`, linked file by file where possible."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dst, copy_function=_link_or_copy)
    else:
        _link_or_copy(str(src), str(dst))


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


class RunCache:
    """Stage outputs under `root`, one entry per key; `work` is the workspace whose stages it keys, `code` the
    repository holding the code deps the workspace does not copy."""

    def __init__(self, root: Path, work: Path, code: Path, facts: dict | None = None):
        self.root, self.work, self.code = Path(root), Path(work), Path(code)
        self.facts = facts or {}
        self._hashes: dict[tuple, str] = {}

    def _file(self, path: Path) -> str:
        st = path.stat()
        memo = (str(path.resolve()), st.st_size, st.st_mtime_ns)
        if memo not in self._hashes:
            h = hashlib.sha256()
            with path.open("rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            self._hashes[memo] = h.hexdigest()
        return self._hashes[memo]

    def digest(self, dep: str) -> str:
        """The bytes under a dep: a file's hash, a folder's files (names and hashes), or `missing`."""
        path = self.work / dep
        if not (path.exists() or path.is_symlink()):
            path = self.code / dep
        if path.is_file():
            return self._file(path)
        if not path.is_dir():
            return "missing"
        h = hashlib.sha256()
        for base, dirs, files in os.walk(path, followlinks=True):
            dirs[:] = sorted(d for d in dirs if d not in SKIPPED)
            for name in sorted(files):
                f = Path(base, name)
                h.update(f"{f.relative_to(path).as_posix()}\0{self._file(f)}\0".encode())
        return h.hexdigest()

    def key(self, stage: Stage, params: dict) -> str:
        """What decides the stage's outputs, hashed: command, params' values, deps' bytes, the machine facts."""
        spec = {"cmd": stage.argv, "params": {k: param(params, k) for k in stage.params},
                "deps": {d: self.digest(d) for d in stage.deps}, "facts": self.facts}
        return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()

    def _entry(self, key: str) -> Path:
        return self.root / key[:2] / key

    def restore(self, stage: Stage, key: str) -> bool:
        """The stored outputs of `key` put in place of the workspace's (True), or False where none is stored."""
        entry = self._entry(key)
        try:
            kept = json.loads((entry / ENTRY).read_text())["outs"]
        except (OSError, ValueError, KeyError):
            return False
        for out in stage.outs:
            _remove(self.work / out)
            if out in kept:
                _put(entry / "outs" / out, self.work / out)
        return True

    def store(self, stage: Stage, key: str) -> None:
        """The stage's outputs just written, kept under `key` (once: a key stored already is left as it is).
        A store that fails (a full disk) is said on stderr and leaves no entry: the run goes on without it."""
        entry = self._entry(key)
        if entry.exists():
            return
        tmp = self.root / f".tmp-{key[:16]}-{uuid.uuid4().hex}"
        try:
            kept = [o for o in stage.outs if (self.work / o).exists()]
            for out in kept:
                _put(self.work / out, tmp / "outs" / out)
            (tmp / ENTRY).write_text(json.dumps({"stage": stage.name, "cmd": stage.argv, "outs": kept,
                                                 "stored": time.strftime("%Y-%m-%dT%H:%M:%S")}, indent=1) + "\n")
            entry.parent.mkdir(parents=True, exist_ok=True)
            os.rename(tmp, entry)  # whole or not at all; a run beside this one may have stored it first
        except OSError as err:
            if not entry.exists():
                print(f"run cache: {stage.name} not stored in {self.root}: {err}", file=sys.stderr, flush=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def machine_facts(device: dict) -> dict:
    """The run's facts that change numbers: `device` (runners.plain.device()), Python, the env of ENV."""
    return {"device": device, "python": platform.python_version(),
            "env": {k: os.environ[k] for k in ENV if k in os.environ}}
