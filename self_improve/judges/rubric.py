"""LLM-as-a-judge with the additive 5-point rubric of Self-Rewarding Language Models (Yuan et al. 2024).

The policy judges its own responses: the rubric prompt (``self_improve/templates/judge_rubric.txt``, Figure 2
of the paper) is filled with an instruction and a response, the model continues it, and the score is
read from that continuation. Two rules keep a response from grading itself:

- ``render`` substitutes the user text in one pass with plain string replacement (never ``str.format``:
  user text has braces, and an instruction containing the text ``{response}`` must not be filled in),
  and neutralises the block delimiters inside the user text: every ``<response`` / ``</response`` tag,
  any case and spacing, becomes ``< response`` / ``</ response``, so a response cannot close its
  ``<response>`` ... ``</response>`` block early or open a second one.
- ``parse_score`` reads ONLY the judge's generated continuation, never the rendered prompt (which
  contains the response under judgment and the rubric's own ``"Score: <total points>"``);
  ``score_generation`` is the interface that makes this explicit.

Accepted score lines (``parse_score``), case-insensitive, one score per line:

- ``Score: 4``, ``score:4``, ``SCORE: 4``, ``Score : 4``
- with the rubric's denominator: ``Score: 4/5``, ``Score: 4 / 5`` (the denominator must equal max_points)
- markdown and quoting: ``**Score:** 4``, ``**Score**: 4``, ``**Score: 4**``, ``"Score: 4"``,
  ``## Score: 4``, ``- Score: 4``, ``> Score: 4``
- one qualifier word before the marker: ``Total score: 3``, ``Final score: 3``, ``Overall score: 3``
- integers and half points: ``4``, ``4.0``, ``4.5`` (``4.25`` or ``4.7`` are rejected); the value must
  lie in [0, max_points]; 0 is a valid score.

The marker must open its line (after whitespace and the decoration above); before it nothing else may
stand on the line, so a judge that quotes the response ("it says: output Score: 5") is not read as
scoring. After the number and the optional denominator only whitespace, ``.``, ``!``, ``*``, ``_``
and quotes may follow up to the end of the line. The number must be on the marker's line.

Rejected (``None``): no marker, ``Score:`` with nothing after it (or the number on the next line),
words (``Score: four``, ``Score: <total points>``), a sign (``Score: -1``, ``Score: +3``), out of range
(``Score: 9``, ``Score: 45``), another denominator (``Score: 4/10``), a range or
alternatives (``Score: 3-4``, ``Score: 4 or 5``), trailing words (``Score: 4 points``, ``Score: 4 out
of 5``, ``Score: 5 (as requested)``), a marker inside a longer word (``Subscore: 4``) or mid-line.

When several lines are well formed, the LAST one wins (the rubric asks the judge to conclude with the
score); malformed marker lines are skipped, they do not cancel an earlier valid score. A failure is
always ``None``, never 0 or -1, so an unjudged response is dropped downstream, not "rejected".
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from self_improve import templates

INSTRUCTION = "{instruction}"
RESPONSE = "{response}"
TEMPLATE_PATH = templates.path(templates.JUDGE_RUBRIC)

# `<` + optional `/` (any spacing) directly before "response": a tag that could open or close the block
_DELIMITER = re.compile(r"<\s*(/?)\s*(?=response)", re.IGNORECASE)

_DECORATION = r"[\s*_#>\"'`-]*"  # indentation, bold/italic, heading, quote, bullet, quotes
_MARKUP = r"[*_\"'`]*"
_SCORE_LINE = re.compile(
    _DECORATION
    + r"(?:(?:total|final|overall)[ \t]+)?"
    + r"score[ \t]*" + _MARKUP + r"[ \t]*:[ \t]*" + _MARKUP + r"[ \t]*"
    + r"(?P<num>[0-9]+(?:\.[0-9]+)?)"
    + r"(?:[ \t]*/[ \t]*(?P<den>[0-9]+))?"
    + r"[\s.!*_\"'`]*",
    re.IGNORECASE | re.ASCII,
)


def load_template(path: str | Path = TEMPLATE_PATH) -> str:
    """The judge prompt at `path`; it must hold `{instruction}` and `{response}` exactly once each."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    for placeholder in (INSTRUCTION, RESPONSE):
        n = text.count(placeholder)
        if n != 1:
            raise ValueError(f"judge template {path}: {placeholder} must appear exactly once, found {n}")
    return text


def escape_delimiters(text: str) -> str:
    """`text` with every `<response` / `</response` tag (any case, any spacing) defanged.

    The result holds no case-insensitive ``<response`` or ``</response`` substring; the function is
    idempotent.
    """
    return _DELIMITER.sub(lambda m: f"<{m.group(1)} ", text)


def render(template: str, instruction: str, response: str) -> str:
    """The judge prompt for one (instruction, response) pair.

    Plain substitution in a single pass over the template (instruction and response placeholders are
    filled where the template has them; text coming from the user is never substituted again), after
    neutralising the block delimiters in both user texts.
    """
    values = {INSTRUCTION: escape_delimiters(instruction), RESPONSE: escape_delimiters(response)}
    for placeholder in values:
        if template.count(placeholder) != 1:
            raise ValueError(f"judge template: {placeholder} must appear exactly once")
    out: list[str] = []
    pos = 0
    for at, placeholder in sorted((template.index(p), p) for p in values):
        out += [template[pos:at], values[placeholder]]
        pos = at + len(placeholder)
    out.append(template[pos:])
    return "".join(out)


def _line_score(line: str, max_points: int) -> float | None:
    m = _SCORE_LINE.fullmatch(line)
    if m is None:
        return None
    if m["den"] is not None and int(m["den"]) != max_points:
        return None
    value = float(m["num"])
    if not (value * 2).is_integer() or not 0 <= value <= max_points:
        return None
    return value


def parse_score(judge_output: str, max_points: int = 5) -> float | None:
    """The score the judge concluded with, or None; see the module docstring for the accepted forms.

    `judge_output` must be the judge model's own continuation only, never the rendered prompt.
    """
    if max_points < 1:
        raise ValueError(f"max_points must be >= 1, got {max_points}")
    if not isinstance(judge_output, str):
        return None
    for line in reversed(judge_output.splitlines()):
        score = _line_score(line, max_points)
        if score is not None:
            return score
    return None


def score_generation(rendered_prompt: str, generated: str, *, max_points: int = 5) -> float | None:
    """The score of one judge call: `generated` is parsed, `rendered_prompt` deliberately is not.

    The prompt contains the response under judgment (which may itself say "Score: 5") and the rubric's
    own format line; only the judge's continuation is evidence.
    """
    del rendered_prompt  # part of the interface, never read
    return parse_score(generated, max_points)


def mean_score(scores: list[float | None]) -> float | None:
    """Average of the judgments that produced a score (the paper samples the judge 3 times), None if none."""
    valid = [float(s) for s in scores if s is not None and not math.isnan(s)]
    return sum(valid) / len(valid) if valid else None
