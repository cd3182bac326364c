"""A validity check that needs no gold answer: responses a vote should not count.

A self-consistency vote is fooled by answers that are easy to agree on without solving anything: a
policy that learns to restate a number of the question ("Tom has 9 marbles.") agrees with itself
on every sample while its accuracy falls (a constant answer is perfectly self-consistent). Three
signs mark a response invalid, each read from the question and the response alone:

- ``restates``: its answer equals the question's first quantity (where the story starts) and no
  calculation it writes arrives at it. Measured on `word_math`: a right answer to a one-step
  problem never equals the first quantity (each step moves the start: add/sub by >= 1, mul/div by
  >= 2) though 5% equal a later number of the question (10 - 5 = 5), so only the first counts; on
  two-step problems 4.7% of right answers do (4 + 4 - 4), and those pass when the response shows
  the calculation that ends at its answer.
  With ``judge.restates: any`` every number of the question counts: a V2 loop on SmolLM2 drifted
  into restating the second operand ("Omar loses 18 pencils."), which the first-quantity rule
  never sees; the price is the right bare answers that equal a later number (10 - 5 = 5).
- ``copies``: the sentence that gives its answer is a sentence of the question, verbatim up to
  case and spacing.
- ``false_calc``: a calculation it writes, ``a op b = c`` with op one of + - * x × / ÷, is false
  when evaluated (exactly, as fractions).
- ``shortcut`` (``judge.shortcut``): its answer is one the task rules out from the question alone
  (`ruled_out`). On `word_math`, the sum of the question's numbers where a step is not an addition:
  a loop that agrees across wordings drifted into answering that sum on every operation (0.789 of
  held-out answers at it6 of research/results/smollm2_v3_long/), and a sum is the same in every
  wording, so no vote sees it. Measured on `word_math` (numbers to 30, factors to 12), a right
  answer equals that sum in none of the one-step subtractions and 0.47% of multiplications (2 x 2),
  at most 1.8% for a two-step chain.

Invalid responses do not vote, are never chosen and are preferred as rejected (EVOL-RL gives them
the lowest reward); the share of samples the check rejects is an iteration metric.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Collection, Optional

from self_improve.tasks.answers import normalise

_NUMBER = re.compile(r"(?<![\w.])-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|(?<![\w.])-?\d+(?:\.\d+)?")
_CALC = re.compile(
    r"(?<![\w.])(-?\d[\d,]*(?:\.\d+)?)\s*([-+*x×/÷])\s*(-?\d[\d,]*(?:\.\d+)?)\s*=\s*(-?\d[\d,]*(?:\.\d+)?)(?![\d.]*\s*[-+*x×/÷]\s*\d)"
)
_SENTENCE = re.compile(r"[^.!?\n]+[.!?]?")

REASONS = ("restates", "shortcut", "copies", "false_calc")


def numbers(text: str) -> list[str]:
    """The numbers of `text` in order, normalised as answers are (``1,000`` -> ``1000``)."""
    return [normalise(m.group(0)) for m in _NUMBER.finditer(text)]


def _fraction(s: str) -> Fraction:
    return Fraction(s.replace(",", ""))


def false_calculation(response: str) -> Optional[str]:
    """The first ``a op b = c`` of `response` that is false, or None."""
    for m in _CALC.finditer(response):
        if re.search(r"[-+*x×/÷(]\s*$", response[: m.start()]):
            continue  # the tail of a longer chain (2 + 3 + 4 = 9): not a calculation of two numbers
        a, op, b, c = m.groups()
        try:
            x, y, z = _fraction(a), _fraction(b), _fraction(c)
        except (ValueError, ZeroDivisionError):
            continue
        if op in "/÷":
            if y == 0:
                return m.group(0)
            value = x / y
        else:
            value = {"+": x + y, "-": x - y, "*": x * y, "x": x * y, "×": x * y}[op]
        if value != z:
            return m.group(0)
    return None


def _arrives_at(response: str, answer: str) -> bool:
    """Whether a calculation of the response (``... = answer``) ends at `answer`."""
    return any(normalise(m.group(4)) == answer for m in _CALC.finditer(response))


def _norm(sentence: str) -> str:
    return " ".join(sentence.lower().split()).rstrip(".!? ")


def copied_sentence(question: str, response: str, answer: str) -> Optional[str]:
    """The sentence of `response` stating `answer` (its last one holding that number), if the
    question has the same sentence."""
    asked = {_norm(s) for s in _SENTENCE.findall(question) if _norm(s)}
    stating = [s for s in _SENTENCE.findall(response) if answer in numbers(s)]
    if stating and _norm(stating[-1]) in asked:
        return stating[-1].strip()
    return None


def invalid_reason(question: str, response: str, answer: Optional[str], restates: str = "first",
                   ruled_out: Collection[str] = ()) -> Optional[str]:
    """Why the response is invalid (one of REASONS), or None. A response without an answer is
    not judged here (it has nothing to vote for). `restates`: which of the question's numbers an
    answer may not be without a calculation arriving at it, `first` or `any` of them. `ruled_out`:
    the answers the task rules out for this question (judge.shortcut)."""
    if answer is None:
        return None
    given = numbers(question) if restates == "any" else numbers(question)[:1]
    if answer in given and not _arrives_at(response, answer):
        return "restates"
    if answer in ruled_out:
        return "shortcut"
    if copied_sentence(question, response, answer):
        return "copies"
    if false_calculation(response):
        return "false_calc"
    return None
