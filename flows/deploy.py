"""Deploy the loop to a Prefect work pool, for workers on other machines (or this one) to run.

    prefect server start                                          # API and UI, http://127.0.0.1:4200
    PREFECT_API_URL=http://127.0.0.1:4200/api python -m flows.deploy          # pool + deployment
    PREFECT_API_URL=http://127.0.0.1:4200/api make worker                     # a worker that runs them

`flows.serve` runs the deployment inside the serving process; this registers it with a `process`
work pool instead, so any worker polling that pool runs it, in its own process, on its own machine
(where the repo is checked out at `--repo`, with the same DVC cache or remote). A run started from
the UI's form (or the API) with overrides works in its own git worktree as a DVC experiment, like a
served one. A GPU machine gets its own pool (`--pool self-improve-gpu`) and worker; see the README.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .loop import REPOS_ENV, self_improve_loop

DEPLOYMENT = "self-improve"
POOL = "self-improve-cpu"


def ensure_pool(name: str) -> bool:
    """Create the `process` work pool `name` unless it exists; True when it was created."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            pool = client.read_work_pool(name)
        except ObjectNotFound:
            client.create_work_pool(WorkPoolCreate(name=name, type="process"))
            return True
    if pool.type != "process":
        raise SystemExit(f"work pool {name!r} is of type {pool.type!r}, not 'process'; pick another --pool")
    return False


def deploy(repo: Path, pool: str, name: str = DEPLOYMENT, limit: int | None = 2) -> str:
    """The loop as deployment `self-improve-loop/<name>` on `pool`; returns its id."""
    from prefect.deployments.runner import EntrypointType

    ensure_pool(pool)
    repo = repo.resolve()
    # to_deployment + apply registers it as `flow.deploy` would, without deploy's image handling
    deployment = self_improve_loop.to_deployment(
        name=name,
        work_pool_name=pool,
        parameters={"repo": str(repo)},
        # the worker's flow process starts in the repo, and may work on it (flows/loop.py: allowed_repos)
        job_variables={"working_dir": str(repo), "env": {REPOS_ENV: str(repo)}},
        entrypoint_type=EntrypointType.MODULE_PATH,  # flows.loop, importable where the repo is installed
        concurrency_limit=limit,
        description="The self-improvement loop: every DVC stage of every iteration as a task.",
        tags=["self-improve"],
    )
    deployment_id = deployment.apply()
    return str(deployment_id)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m flows.deploy", description=__doc__.split("\n\n")[0])
    p.add_argument("--repo", default=".", help="the repo the runs work on, as the worker's machine sees it")
    p.add_argument("--pool", default=POOL, help=f"the process work pool (default {POOL}; created if missing)")
    p.add_argument("--name", default=DEPLOYMENT, help=f"the deployment's name (default {DEPLOYMENT})")
    p.add_argument("--limit", type=int, default=2, help="runs of the deployment at once")
    args = p.parse_args(argv)
    deployment_id = deploy(Path(args.repo), args.pool, args.name, args.limit)
    print(f"deployment self-improve-loop/{args.name} ({deployment_id}) on work pool {args.pool}; "
          f"start a worker: prefect worker start --pool {args.pool} --type process")


if __name__ == "__main__":
    main()
