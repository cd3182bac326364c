"""Install CoMAS's pipeline: comas/dvc.yaml, from configs/pipelines/comas.dvc.yaml.

    python -m scripts.comas_pipeline      # then: dvc repro comas/dvc.yaml

CoMAS is opt-in: DVC's `dvc pull`, `dvc checkout` and `dvc exp apply` stop on a pipeline that never
ran, so the repo carries comas/dvc.yaml only where CoMAS runs (commit it with its comas/dvc.lock).
An installed file that differs from the template is left alone, with a warning.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from runners.dag import install_comas


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m scripts.comas_pipeline", description=__doc__.split("\n\n")[0])
    p.add_argument("--repo", default=".", help="the repo to install it in (default: here)")
    args = p.parse_args(argv)
    print(install_comas(Path(args.repo)))


if __name__ == "__main__":
    main()
