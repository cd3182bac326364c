"""CoMAS as a Prefect flow: the stages of comas/dvc.yaml (after the loop's base stages it reads),
each by `dvc repro -s`, in the repo or, with overrides, in a worktree that ends as a DVC experiment
(flows/loop.py's `run_flow`); comas/dvc.yaml is installed from its template first where it is
missing. Run it with `python -m flows.comas`, or serve it with `python -m flows.serve`.
"""

import sys
from pathlib import Path
from typing import Annotated, Optional

from prefect import flow
from pydantic import Field

from runners.dag import COMAS_FILE, comas_order, install_comas
from .loop import NAME_PATTERN, PATH_PATTERN, on_cancelled, run_flow

# (flow parameter, params.yaml key) for every override the form offers
OVERRIDES = {
    "agents": "agents.n",
    "rounds": "agents.rounds",
    "problems": "agents.problems",
    "seed": "seed",
}


@flow(name="self-improve-comas", log_prints=True, validate_parameters=True, on_cancellation=[on_cancelled])
def self_improve_comas(
    repo: Annotated[str, Field(pattern=PATH_PATTERN, description="the repo the run works on: the one the flow "
                                                                 "was served or deployed with")] = ".",
    recipe: Optional[Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,62}(,[A-Za-z0-9][A-Za-z0-9_.+-]{0,62}){0,3}$",
                                          description="recipes of configs/recipes/ or configs/rules/, comma-"
                                                      "separated, applied first: smollm2-gym,scpo")]] = None,
    agents: Optional[Annotated[int, Field(ge=2, le=8, description="agents.n")]] = None,
    rounds: Optional[Annotated[int, Field(ge=1, le=8, description="agents.rounds")]] = None,
    problems: Optional[Annotated[int, Field(ge=1, description="agents.problems")]] = None,
    seed: Optional[Annotated[int, Field(ge=0, description="seed")]] = None,
    experiment_name: Optional[Annotated[str, Field(pattern=NAME_PATTERN,
                                                   description="DVC experiment name")]] = None,
) -> list[str]:
    """Run every stage of a CoMAS run in dependency order; returns the stage names."""
    given = {k: v for k, v in locals().items() if k in OVERRIDES and v is not None}
    return run_flow(repo, recipe, given, experiment_name, comas_order, OVERRIDES, setup=install_comas,
                    include=(str(Path(COMAS_FILE).parent),))


if __name__ == "__main__":
    self_improve_comas(sys.argv[1] if len(sys.argv) > 1 else ".")
