"""GSM8K answer extraction and the 0/1 correctness reward.

Rewards are computed inside sampler/learner worker threads, so nothing here may rely on
signal.alarm (math_verify's default timeout), which only works in the main thread. Instead every
completion is judged within a bound by construction: the answer regex is linear in the text, an
answer longer than MAX_ANSWER_CHARS is compared as text alone, and math_verify only sees two short
plain numbers that exact rationals could not decide.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from fractions import Fraction

__all__ = [
    "RewardResult",
    "extract_gsm8k_answer",
    "gsm8k_correct",
    "normalize_number",
]

# A number-like token: optional "-" directly before an optional "$", digits with optional
# thousands separators ("1,200"), optional decimals, or a simple fraction ("3/4").
# The look-behind stops "5-3" from reading as "-3" and "v2" / "1.2.3" tails from matching;
# a sign is only taken when it is glued to the number, so "16 - 3" ends in "3", not "-3".
_NUMBER_RE = re.compile(
    r"(?<![\w.])"
    r"(?P<sign>[-\u2212])?(?:\$\s?)?"
    r"(?P<num>\d+(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?(?:/\d+)?|\.\d+)"
    r"(?![\d/])"
)

_ANSWER_MARKER = "####"


def normalize_number(sign: str | None, number: str) -> str:
    """Canonical text of a matched number: no "$", no thousands commas, "-" kept, ".5" -> "0.5"."""
    text = number.replace(",", "")
    if text.startswith("."):
        text = "0" + text
    # Unicode minus (U+2212) shows up in model output copied from formatted text.
    if sign in ("-", "\u2212") and text.strip("0./") != "":
        text = "-" + text
    return text


def _numbers(text: str) -> list[str]:
    return [normalize_number(m.group("sign"), m.group("num")) for m in _NUMBER_RE.finditer(text)]


def extract_gsm8k_answer(text: str) -> str | None:
    """The final answer of a completion or a GSM8K reference solution, normalised.

    The first number after the last "####" wins (GSM8K's own convention, which the prompt asks
    for); without a marker, or with nothing numeric after it, the last number in the text is the
    answer. Units, "$", trailing "." and thousands commas are dropped. None if there is no number.
    """
    if not text:
        return None
    marker = text.rfind(_ANSWER_MARKER)
    if marker >= 0:
        after = _numbers(text[marker + len(_ANSWER_MARKER) :])
        if after:
            return after[0]
    found = _numbers(text)
    return found[-1] if found else None


class _DropTimeoutWarning(logging.Filter):
    """Hide math_verify's 'Timeout is disabled' warning: disabling it is deliberate here."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutWarning())


def _math_verify_equal(reference: str, prediction: str) -> bool:
    # Imported lazily: math_verify pulls in sympy, which costs ~1 s at import.
    from math_verify import ExprExtractionConfig, parse, verify  # here: math_verify brings sympy (~1 s at import)

    # Both sides are already short plain numbers, so the plain-expression extractor suffices, and
    # the timeouts can be None: that disables math_verify's signal.alarm, which raises outside the
    # main thread, and parsing a bare number cannot hang.
    config = [ExprExtractionConfig()]
    gold = parse(reference, extraction_config=config, parsing_timeout=None, raise_on_error=True)
    pred = parse(prediction, extraction_config=config, parsing_timeout=None, raise_on_error=True)
    if not gold or not pred:
        raise ValueError(f"math_verify could not parse {reference!r} / {prediction!r}")
    return bool(verify(gold, pred, timeout_seconds=None, raise_on_error=True))


# math_verify takes numbers within about 1e-6 of each other (relative) as equal: 0.333333 is 1/3 there.
# Answers further apart than this are unequal without asking it (see _numeric_verdict). A Fraction,
# not a float: a product with a float turns the other side into a float, and a number of more than
# 308 digits then raises OverflowError.
CLEARLY_APART = Fraction(1, 10_000)

# An extracted answer longer than this (digits, separators, a point, a sign) is equal to the
# reference only as the same text: no GSM8K answer comes near it, exact rationals of such numbers
# cost time that grows with their length, and Python refuses int() of more than 4300 digits.
MAX_ANSWER_CHARS = 100


def _numeric_verdict(reference: str, prediction: str) -> bool | None:
    """Two extracted answers (decimals or simple fractions) compared as exact rationals: True when
    equal, False when they differ by more than CLEARLY_APART of the larger (and of 1), None when
    they are closer than that but not equal, or do not parse (a zero denominator): math_verify's
    to judge. An answer longer than MAX_ANSWER_CHARS is equal only as the same text. Its verdict agrees with math_verify's everywhere it is given (tests/data/test_gsm8k.py),
    without sympy's parsing, which is most of a round's scoring time when math_verify judges every
    differing pair; scoring is on the path to each round's groups."""
    if max(len(reference), len(prediction)) > MAX_ANSWER_CHARS:
        return reference == prediction
    try:
        a, b = Fraction(reference), Fraction(prediction)
    except (ValueError, ZeroDivisionError):
        return None
    if a == b:
        return True
    if abs(a - b) > CLEARLY_APART * max(1, abs(a), abs(b)):
        return False
    return None


def gsm8k_correct(completion: str, reference_answer: str) -> bool:
    """Whether the completion's final answer equals the reference's (full solution or bare answer)."""
    reference = extract_gsm8k_answer(reference_answer)
    prediction = extract_gsm8k_answer(completion)
    if reference is None or prediction is None:
        return False
    if reference == prediction:
        return True  # the common case needs no sympy
    if (verdict := _numeric_verdict(reference, prediction)) is not None:
        return verdict
    try:
        return _math_verify_equal(reference, prediction)
    except Exception:  # noqa: BLE001 - a math_verify failure must not kill a rollout
        # What is left here is not equal as text nor as rationals (those were decided above): a close
        # call math_verify could not make, or a zero denominator. Either way, not the same answer.
        return False


@dataclass
class RewardResult:
    """A scalar reward plus per-sample diagnostics that the metrics code averages."""

    reward: float
    info: dict[str, float] = field(default_factory=dict)
