"""Stage `check_params`: validate the whole params file before any other stage runs.

DVC deletes a stage's outputs before it runs the stage. A stage that refused a bad params value
itself would therefore already have lost its outputs (and a bad `task` value would take the base
model and the task sets with it). Every stage depends on this stage's marker, so `dvc repro` runs
it first whenever params.yaml changed: a bad file stops the whole run here, naming the key, with
the workspace untouched. The marker's bytes never depend on the params, so a valid change
invalidates only the stages whose own params changed. Its output persists: a failed check does
not delete it either.
"""

from __future__ import annotations

import argparse

from self_improve import artifacts as art
from self_improve.config import Params, SecScope
from self_improve.stage import Arg, Declaration, Run, derive_seed, run_stage
from self_improve.tasks import task_for
from self_improve.tasks.base import check_scope

MARKER = "params.yaml passed self_improve/config's checks; its bytes never depend on the params\n"


DECLARATION = Declaration(
    args=(Arg("--out", "out", "the marker every other stage depends on", required=True, persist=True,
              note="constant bytes: a valid change invalidates nothing through it"),),
    params=None,  # the whole file, declared as a dep
    runs=(Run("check_params", {"--out": "data/params.ok"}, deps=("params.yaml",),
              note="the whole params file, checked before any stage deletes its outputs"),),
)


def _body(args: argparse.Namespace, params: Params) -> None:
    # run_stage has validated the whole file by now (load_params); only a valid one gets here
    task = None
    if params.task.entry.check_sets:  # reasoning_gym's datasets refuse their own bad names and values,
        # and sets too small to be disjoint are found here rather than after prepare lost its outputs
        task = task_for(params.task)
        task.sets(derive_seed(params.seed, "split"), params.prepare.train_size)
    if params.evolve.sec_scope == SecScope.mix:  # a mix only a task that draws fresh problems can steer
        check_scope(task or task_for(params.task), params.evolve)
    with art.atomic_path(args.out) as tmp:
        tmp.write_text(MARKER, encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    run_stage("check_params", DECLARATION.add_args, _body, argv)


if __name__ == "__main__":
    main()
