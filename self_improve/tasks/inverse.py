"""Inverse problems: a problem asked backwards, with a proposed answer given and one of the
question's numbers hidden. A policy that solves the inverse back to the hidden number confirms the
answer without any gold (self-verification by inverse problems; label-free, since the hidden
number is in the question). A policy that answers a shortcut (the sum of the numbers) to a
subtraction proposes an answer whose inverse does not come back: `34 - 21 = 55` asks
`x - 21 = 55`, whose answer 76 is not 34.

Each task that can pose its problems backwards gives `inverse(prompt, answer) -> [(prompt, hidden)]`;
these are the procedural ones for an expression of two numbers.
"""

from __future__ import annotations

import re
from fractions import Fraction

_CHAIN = re.compile(r"(?<![\w.])-?\d+(?:\s*[-+*/]\s*-?\d+)+")  # numbers joined by operators
_TWO = re.compile(r"^(-?\d+)\s*([-+*/])\s*(-?\d+)$")
_NUMBER = re.compile(r"^-?\d+(?:\.\d+)?$")


def expression_inverse(question: str, answer: str | None) -> list[tuple[str, str]]:
    """`a op b` (the question's only two-number expression) with `answer` proposed: `x op b = answer`,
    hiding a. [] for a question with no such expression, several, or an answer that is not a number."""
    chains = _CHAIN.findall(question)
    two = _TWO.match(chains[0]) if len(chains) == 1 else None
    if two is None or not isinstance(answer, str) or not _NUMBER.match(answer.strip()):
        return []
    a, op, b = two.groups()
    c = Fraction(answer.strip())
    shown = str(c.numerator) if c.denominator == 1 else answer.strip()
    return [(f"Find the number x such that x {op} {b} = {shown}.", a)]
