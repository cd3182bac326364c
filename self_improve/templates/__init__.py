"""The prompt templates, shipped as package data and read through `importlib.resources`.

Params name a template by its repo path (`self_improve/templates/judge_rubric.txt`, which is also
what dvc.yaml tracks) or by any other file of the user's; `resolve` takes the user's file where it
exists and the packaged copy otherwise, so an installed wheel runs without the source tree.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

JUDGE_RUBRIC = "judge_rubric.txt"  # llm_judge: the 5-point rubric of Self-Rewarding LMs
JUDGE_CORRECT = "judge_correct.txt"  # llm_judge yes_logprob: "is this answer correct?"
REWRITE = "rewrite_prompt.txt"  # eva: a new problem like this one
PARAPHRASE = "paraphrase_prompt.txt"  # co_reward: this problem in other words


def path(name: str) -> Path:
    """A packaged template by file name."""
    found = files(__name__) / name
    if not found.is_file():
        raise FileNotFoundError(f"no packaged template {name!r} in {__name__}")
    return Path(str(found))


def read(name: str) -> str:
    return path(name).read_text(encoding="utf-8")


def resolve(value: str | Path) -> Path:
    """The file a params value names: the file itself where it exists, else the packaged template of
    that name when the value is one (`self_improve/templates/<name>` or `<name>`), else the value as
    given (its reader then names the missing file)."""
    given = Path(value)
    if given.is_file():
        return given
    if given.parent.as_posix() in (".", "self_improve/templates") and (files(__name__) / given.name).is_file():
        return path(given.name)
    return given
