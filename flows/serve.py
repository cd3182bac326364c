"""Serve the loop flow and the CoMAS flow as deployments, so the Prefect UI can trigger them with
their parameter forms.

    prefect server start                      # the API and UI, http://127.0.0.1:4200
    PREFECT_API_URL=http://127.0.0.1:4200/api python -m flows.serve

`--limit` caps how many runs of the deployment go at once (runs with overrides each get their own
worktree; runs without share the repo and take turns on its lock).
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path

from prefect import serve

from .comas import self_improve_comas
from .loop import REPOS_ENV, self_improve_loop

DEPLOYMENT = "self-improve"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m flows.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--repo", default=".", help="the repo the runs work on (default: here)")
    p.add_argument("--limit", type=int, default=2, help="runs of the deployment at once")
    args = p.parse_args(argv)
    # Ctrl-C stops it as SIGTERM does (Prefect's graceful shutdown: deployments paused, runs cancelled): a
    # KeyboardInterrupt raised inside the runner's loop was at times left pending for tens of seconds
    signal.signal(signal.SIGINT, lambda *_: os.kill(os.getpid(), signal.SIGTERM))
    repo = {"repo": str(Path(args.repo).resolve())}
    # the served runs (this process's children) may work on this repo: no caller can add another
    os.environ[REPOS_ENV] = os.pathsep.join(filter(None, [os.environ.get(REPOS_ENV), repo["repo"]]))
    serve(
        self_improve_loop.to_deployment(
            name=DEPLOYMENT, parameters=repo, tags=["self-improve"],
            description="The self-improvement loop: every DVC stage of every iteration as a task."),
        self_improve_comas.to_deployment(
            name=DEPLOYMENT, parameters=repo, tags=["self-improve", "comas"],
            description="CoMAS: agents that solve, evaluate and score each other (comas/dvc.yaml)."),
        limit=args.limit,
    )


if __name__ == "__main__":
    main()
