"""Model-written rewrites of prompts: the template that asks for one, and the filter that keeps
those worth adding (the evolve step asks the model for a new instruction like a given one).

``filter_rewrites`` drops empty ones, too long ones, and near-duplicates (character n-gram Jaccard
overlap) of an existing prompt or of a rewrite already kept.
"""

from __future__ import annotations

from collections import Counter

from self_improve import templates
from self_improve.errors import ConfigError

REWRITE_TEMPLATE = templates.path(templates.REWRITE)
PLACEHOLDER = "{prompt}"


def _ngrams(text: str, n: int) -> frozenset[str]:
    s = " ".join(text.lower().split())
    if len(s) < n:
        return frozenset([s]) if s else frozenset()
    return frozenset(s[i : i + n] for i in range(len(s) - n + 1))


def _jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def near_any(texts: list[str], against: list[str], max_overlap: float = 0.6, n: int = 3) -> list[bool]:
    """For each text: does it overlap any of `against` by more than `max_overlap` (n-gram Jaccard)?"""
    grams = [_ngrams(a, n) for a in against]
    return [any(_jaccard(_ngrams(t, n), g) > max_overlap for g in grams) for t in texts]


def filter_rewrites(
    candidates: list[str], existing: list[str], max_chars: int, n: int = 3, max_overlap: float = 0.6
) -> tuple[list[str], dict[str, int]]:
    """Keep the model-written rewrites worth adding; returns them stripped, and drop counts by reason.

    A candidate is dropped when it is empty after strip ("empty"), longer than `max_chars`
    ("too_long"), or overlaps an existing prompt or an already kept candidate by more than
    `max_overlap` ("near_duplicate"). Counts hold only reasons that occurred.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    against = [_ngrams(e, n) for e in existing]
    kept: list[str] = []
    dropped: Counter[str] = Counter()
    for cand in candidates:
        text = cand.strip() if isinstance(cand, str) else ""
        if not text:
            dropped["empty"] += 1
            continue
        if len(text) > max_chars:
            dropped["too_long"] += 1
            continue
        grams = _ngrams(text, n)
        if any(_jaccard(grams, other) > max_overlap for other in against):
            dropped["near_duplicate"] += 1
            continue
        kept.append(text)
        against.append(grams)
    return kept, dict(sorted(dropped.items()))


def render_rewrite_prompt(template: str, prompt: str) -> str:
    """The template with `{prompt}` replaced by `prompt`.

    str.replace, not str.format: braces in the user's text stay as they are.
    """
    if PLACEHOLDER not in template:
        raise ConfigError(f"rewrite template: no {PLACEHOLDER} placeholder")
    return template.replace(PLACEHOLDER, prompt)
