"""Final answers of free-text responses, extracted and compared the way the field does it.

Extraction tries, in order, the conventions people use for grade-school and competition maths:

1. ``gsm8k``: GSM8K's strict form, ``#### 72`` (the last one);
2. ``answer_is``: "the answer is 72", "Answer: 72", "final answer: 72" (the last one);
3. ``boxed``: ``\\boxed{...}`` (the last one, braces balanced; ``\\fbox`` too);
4. ``last_number``: the last number in the response.

The form that matched is recorded with the answer, so a run can say how its answers were read.
An answer is normalised (``1,000`` -> ``1000``, ``72.0`` -> ``72``, ``$5`` -> ``5``, ``3/4``,
``\\frac{3}{4}`` and ``0.75`` -> ``0.75``) so that equal answers have equal text and votes pool; a response with no
answer gives None, which is never right.

Equivalence: two numbers are compared exactly (as fractions); anything else goes to math-verify
(``verify(parse(gold), parse(answer))``, the gold first, as its documentation asks). math-verify
enforces its timeouts with signals, which work only in the main thread: elsewhere they are off.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

FORMS = ("gsm8k", "answer_is", "boxed", "last_number")

_NUM = r"-?\$?\s*(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?"
_GSM8K = re.compile(r"####\s*(" + _NUM + r"|[^\n]+)")
_ANSWER_IS = re.compile(
    r"(?:the\s+(?:final\s+)?answer\s+is|final\s+answer\s*[:=]|answer\s*[:=])\s*[:=]?\s*(" + _NUM + r")",
    re.IGNORECASE,
)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_NUMBER = re.compile(r"(?<![\w.])" + _NUM.replace(r"\$?\s*", "") + r"(?![\w])")
_FRAC = re.compile(r"^-?\\[dt]?frac\s*\{\s*(-?\d+)\s*\}\s*\{\s*(-?\d+)\s*\}$")
_PLAIN = re.compile(r"^(-?)(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?$")
_UNITS = re.compile(r"\s*(?:\\%|%|\\text\{[^}]*\}|\\mbox\{[^}]*\}|[a-zA-Z]+\.?)\s*$")


@dataclass(frozen=True)
class Extracted:
    answer: str | None  # normalised; None when the response states no answer
    form: str | None  # which convention matched (FORMS), None when none did


def _boxes(text: str):
    """(content start, end after the closing brace) of each \\boxed{...} whose braces balance, in order."""
    for m in _BOXED.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            yield m.end(), i


def _boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} with balanced braces."""
    last = None
    for start, end in _boxes(text):
        last = text[start: end - 1]
    return last


def as_fraction(text: str) -> Fraction | None:
    """The exact value of a plain number, a/b or \\frac{a}{b}; None for anything else."""
    t = text.strip().replace("$", "").replace(" ", "")
    m = _FRAC.match(t)
    if m:
        den = int(m.group(2))
        if den == 0:
            return None
        value = Fraction(int(m.group(1)), den)
        return -value if t.startswith("-") else value
    if "/" in t:
        num, _, den = t.partition("/")
        a, b = as_fraction(num), as_fraction(den)
        return None if a is None or b is None or b == 0 else a / b
    m = _PLAIN.match(t)
    if not m:
        return None
    sign, whole, frac = m.groups()
    value = Fraction(int(whole.replace(",", "")))
    if frac:
        value += Fraction(int(frac), 10 ** len(frac))
    return -value if sign else value


def format_number(value: Fraction) -> str:
    """72, 12.5 (a terminating decimal), or 1/3 (a reduced fraction that does not terminate)."""
    if value.denominator == 1:
        return str(value.numerator)
    d = value.denominator
    for p in (2, 5):
        while d % p == 0:
            d //= p
    if d != 1:
        return str(value)
    digits = 0
    while (value * 10**digits).denominator != 1:
        digits += 1
    return f"{float(value):.{digits}f}" if digits <= 15 else str(value)


def normalise(text: str | None) -> str | None:
    """One text per value: numbers as integers or reduced fractions, other answers trimmed."""
    if text is None:
        return None
    t = text.strip().strip(".").strip()
    t = re.sub(r"^\\text\{(.*)\}$", r"\1", t)
    t = t.replace("\\!", "").replace("\\,", "").replace("\\$", "$").strip()
    if t.startswith("$") and t.endswith("$") and len(t) > 1:
        t = t.strip("$").strip()
    stripped = _UNITS.sub("", t) if re.search(r"\d", t) else t
    value = as_fraction(stripped)
    if value is None:
        value = as_fraction(t)
    if value is not None:
        return format_number(value)
    return t or None


def extract(response: str | None) -> Extracted:
    """The stated final answer of a free-text response, and the convention it was written in."""
    if not response:
        return Extracted(None, None)
    for form, finder in (("gsm8k", _GSM8K), ("answer_is", _ANSWER_IS)):
        hits = finder.findall(response)
        if hits:
            got = normalise(hits[-1])
            if got is not None:
                return Extracted(got, form)
    boxed = _boxed(response)
    if boxed is not None and normalise(boxed) is not None:
        return Extracted(normalise(boxed), "boxed")
    numbers = _NUMBER.findall(response)
    if numbers:
        return Extracted(normalise(numbers[-1]), "last_number")
    return Extracted(None, None)


# Where a stated answer is complete: its number is followed by the end of a line, the end of a sentence
# (". " or ".\n") or a word, so no digit, decimal or fraction of it can still follow.
_DONE = r"(?:\.?[ \t]*\n|\.\s|[ \t]+[A-Za-z])"
_GSM8K_DONE = re.compile(r"####[ \t]*(" + _NUM + r")" + _DONE)
_ANSWER_IS_DONE = re.compile(
    r"(?:the\s+(?:final\s+)?answer\s+is|final\s+answer\s*[:=]|answer\s*[:=])[ \t]*[:=]?[ \t]*(" + _NUM + r")" + _DONE,
    re.IGNORECASE,
)


def answer_end(response: str) -> int | None:
    """Where the first complete stated answer of `response` ends (the answer kept, the rest cut), or
    None while it states none: `#### 72` or "the answer is 72" followed by a line end, a sentence end
    or a word, or a closed `\\boxed{...}`. A bare last number is never complete (another may follow).
    The engines stop a response there (`sample.stop_at_answer`); the cut keeps a sentence's period."""
    ends = []
    for finder in (_GSM8K_DONE, _ANSWER_IS_DONE):
        m = finder.search(response)
        if m:
            end = m.end(1)
            ends.append(end + 1 if response[end:end + 1] == "." else end)
    first_box = next(_boxes(response), None)
    if first_box is not None:
        ends.append(first_box[1])
    return min(ends) if ends else None


def gold_answer(text: str | None) -> str | None:
    """A gold answer as data sets write it: after ``####``, inside ``\\boxed{}``, or as written."""
    if text is None or not str(text).strip():
        return None
    text = str(text)
    hits = _GSM8K.findall(text)
    if hits:
        return normalise(hits[-1])
    boxed = _boxed(text)
    if boxed is not None:
        return normalise(boxed)
    return normalise(text)


logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns on every call with timeouts off


@lru_cache(maxsize=65536)
def _math_verify(answer: str, gold: str) -> bool:
    from math_verify import parse, verify

    timeout = 5 if threading.current_thread() is threading.main_thread() else None

    def parsed(text: str):
        latex = text if "$" in text else f"${text}$"
        return parse(latex, parsing_timeout=timeout)

    try:
        g, a = parsed(gold), parsed(answer)
        if not g or not a:
            return False
        return bool(verify(g, a, timeout_seconds=timeout))
    except Exception:  # math-verify raises on some malformed latex: not equivalent
        return False


def equivalent(answer: str | None, gold: str | None) -> bool:
    """Does `answer` state the same value as `gold`? Numbers exactly, the rest by math-verify."""
    if not isinstance(answer, str) or not isinstance(gold, str):  # None (or a missing value) is never right
        return False
    if answer == gold:
        return True
    a, g = as_fraction(answer), as_fraction(gold)
    if a is not None and g is not None:
        return a == g
    return _math_verify(answer, gold)
