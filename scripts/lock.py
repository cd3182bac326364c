"""requirements.lock: the version of every package `make install` installs, so installs reproduce.

    python -m scripts.lock           # write requirements.lock from this environment (make lock: a fresh one)
    python -m scripts.lock --check   # exit 1 when pyproject.toml changed since, or this environment differs

The lock holds every distribution the project needs, found by walking the `Requires-Dist` of
self-improve (with its `dev` extra) and of each requirement in turn, with the markers of this Python
and platform, as `name==version` (torch without its local `+cpu` tag, so the same lock serves a CUDA
build of the same release). `make install` passes it to pip as constraints (`-c`), so every package
the project needs installs at the locked version. Its first line is the digest of pyproject.toml's
dependency lists: `--check` fails when they changed and the lock was not made again (`make lock`),
or when an installed version differs from the lock (an install that did not use it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements.lock"
PROJECT = "self-improve"
EXTRAS = ("dev",)
HEADER = "# pyproject.toml dependencies sha256: "


def pyproject_digest(root: Path = ROOT) -> str:
    """The digest of what the lock answers to: the dependencies and optional dependencies."""
    project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    deps = {"dependencies": project.get("dependencies", []), "optional": project.get("optional-dependencies", {})}
    return hashlib.sha256(json.dumps(deps, sort_keys=True).encode()).hexdigest()


def closure(project: str = PROJECT, extras: tuple[str, ...] = EXTRAS) -> dict[str, str]:
    """{canonical name: installed version} of every distribution `project[extras]` needs here."""
    seen: dict[str, str] = {}
    todo: list[tuple[str, frozenset[str]]] = [(project, frozenset(extras))]
    done: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, wanted = todo.pop()
        if (name, wanted) in done:
            continue
        done.add((name, wanted))
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise SystemExit(f"scripts.lock: {name} is required but not installed here; run make install") from None
        key = canonicalize_name(dist.metadata["Name"])
        if key != canonicalize_name(project):
            seen[key] = dist.version
        for text in dist.requires or []:
            req = Requirement(text)
            envs = [{"extra": e} for e in wanted] or [{"extra": ""}]
            if req.marker is None or any(req.marker.evaluate(env) for env in envs):
                todo.append((req.name, frozenset(req.extras)))
    return seen


def pinned(versions: dict[str, str]) -> list[str]:
    return [f"{name}=={version.split('+')[0] if name == 'torch' else version}" for name, version in sorted(versions.items())]


def render(versions: dict[str, str], digest: str) -> str:
    return (f"{HEADER}{digest}\n# made by `make lock` (python -m scripts.lock); make install installs with it as "
            "constraints\n" + "\n".join(pinned(versions)) + "\n")


def check(lock: Path = LOCK, root: Path = ROOT) -> list[str]:
    """What is stale: the lock against pyproject.toml, and this environment against the lock."""
    if not lock.exists():
        return [f"{lock.name} is missing: run make lock"]
    lines = lock.read_text(encoding="utf-8").splitlines()
    problems = []
    if not lines or lines[0] != HEADER + pyproject_digest(root):
        problems.append(f"{lock.name} was made for other dependencies than pyproject.toml's: run make lock")
    want = dict(line.split("==", 1) for line in lines if line and not line.startswith("#"))
    have = dict(p.split("==", 1) for p in pinned(closure()))
    for name in sorted(set(want) | set(have)):
        if want.get(name) != have.get(name):
            problems.append(f"{name}: locked {want.get(name, '(absent)')}, installed {have.get(name, '(absent)')}")
    return problems


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the lock or this environment is stale")
    ap.add_argument("--out", type=Path, default=LOCK)
    args = ap.parse_args(argv)
    if args.check:
        problems = check(args.out)
        if problems:
            sys.exit("requirements.lock is stale:\n  " + "\n  ".join(problems))
        print(f"{args.out.name}: up to date ({len(closure())} packages)")
        return
    args.out.write_text(render(closure(), pyproject_digest()), encoding="utf-8")
    print(f"{args.out}: {len(closure())} packages")


if __name__ == "__main__":
    main()
