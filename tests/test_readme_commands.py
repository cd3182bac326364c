"""Every command the README gives works as written, as far as it can run in a test: `make` targets
as a dry run (`make -n`, the recipes' shell calls included), `self-improve exp` with `--dry-run` (its
recipes read and checked), every other `self-improve`, `python -m` and `dvc` command's `--help`."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT

PREFIXES = ("make ", "self-improve ", "python -m ", "dvc ")


def readme_commands(text: str) -> list[str]:
    """The commands of README.md: inline code and code blocks, each `&&` part on its own, comments cut."""
    spans = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S) + re.findall(r"`([^`\n]+)`", text)
    out: list[str] = []
    for span in spans:
        for line in span.splitlines():
            for part in line.split("&&"):
                cmd = part.split("  #")[0].split(" # ")[0].strip()
                if cmd.startswith(PREFIXES) and cmd not in out:
                    out.append(cmd)
    return out


def check_argv(cmd: str) -> list[str]:
    """The argv that checks `cmd` without running its work."""
    argv = shlex.split(cmd)
    bindir = Path(sys.executable).parent
    if argv[0] == "make":
        return ["make", "-n", *argv[1:]]
    if argv[0] == "self-improve":
        if len(argv) > 1 and argv[1] == "exp":
            return [str(bindir / "self-improve"), *argv[1:], "--dry-run"]
        return [str(bindir / "self-improve"), *[a for a in argv[1:2] if a != "--help"], "--help"]
    if argv[:2] == ["python", "-m"]:
        return [sys.executable, "-m", argv[2], "--help"]
    return [str(bindir / "dvc"), *[a for a in argv[1:] if not a.startswith("-")][:2], "--help"]


COMMANDS = readme_commands((ROOT / "README.md").read_text())


def test_the_readme_gives_commands():
    assert "make loop" in COMMANDS and "make test" in COMMANDS and len(COMMANDS) >= 10


@pytest.mark.parametrize("cmd", COMMANDS)
def test_a_readme_command_works_as_written(cmd):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(check_argv(cmd), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{cmd}: {proc.stdout[-1500:]}\n{proc.stderr[-1500:]}"
