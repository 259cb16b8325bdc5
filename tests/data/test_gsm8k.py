"""GSM8K answer extraction and correctness, on hand-picked strings and a real reference."""

import json
import random
import subprocess
import sys
import threading
from fractions import Fraction
from pathlib import Path

import pytest

from grpo.data.formats import Problem
from grpo.data.gsm8k import RewardResult, _math_verify_equal, _numeric_verdict, extract_gsm8k_answer, gsm8k_correct
from grpo.data.rewards import score_correctness

GSM8K_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("#### 72", "72"),
        ("#### 1,200", "1200"),
        ("#### $5", "5"),
        ("#### -3", "-3"),
        ("#### 0.5", "0.5"),
        ("The answer is 42.", "42"),  # no marker: the last number, trailing "." dropped
        ("no number here", None),
        ("", None),
        ("#### 72\nThe answer is: 3", "72"),  # the marker's answer wins over later numbers
        ("#### 18 eggs.", "18"),  # units dropped
        ("So 16 - 3 = 13", "13"),  # a spaced minus is an operator, not a sign
        ("She pays -$4.50 in total", "-4.50"),
        ("#### $1,000,000 dollars", "1000000"),
        ("first #### 5 then #### 6", "6"),  # the last marker counts
        ("#### none\nso 9", "9"),  # nothing numeric after the marker: last number overall
    ],
)
def test_extract(text, expected):
    assert extract_gsm8k_answer(text) == expected


def test_extract_real_reference_solution():
    train = GSM8K_DIR / "train.jsonl"
    if not train.is_file():
        pytest.skip(f"{train} is missing")
    with train.open(encoding="utf-8") as lines:
        row = json.loads(next(lines))
    # Natalia's clips: "... 48+24 = <<48+24=72>>72 clips ...\n#### 72"
    assert row["answer"].rstrip().endswith("#### 72")
    assert extract_gsm8k_answer(row["answer"]) == "72"
    assert gsm8k_correct("She sold 72 clips in all.\n#### 72", row["answer"])


def test_chance_baselines_on_the_evaluation_subset():
    """The reference points docs/benchmarks.md sets SmolLM2's greedy 0.024 against, on the first 500 test
    problems: always answering "4" (the train split's most common answer, 210 times) is right 15
    times (0.030); the gold answer is a number of the question 30 times (0.06), its last number 9
    times (0.018)."""
    from collections import Counter

    from grpo.data.gsm8k import _numbers
    from grpo.data.sources import load_problems

    if not (GSM8K_DIR / "train.jsonl").is_file():
        pytest.skip(f"{GSM8K_DIR} is missing")
    train = [extract_gsm8k_answer(p.answer) for p in load_problems(str(GSM8K_DIR), "train")]
    test = load_problems(str(GSM8K_DIR), "test", limit=500)
    golds, numbers = [extract_gsm8k_answer(p.answer) for p in test], [_numbers(p.question) for p in test]
    assert Counter(train).most_common(1) == [("4", 210)]
    assert sum(g == "4" for g in golds) == 15
    assert sum(g in n for g, n in zip(golds, numbers)) == 30
    assert sum(bool(n) and n[-1] == g for g, n in zip(golds, numbers)) == 9


@pytest.mark.parametrize(
    ("completion", "reference", "expected"),
    [
        ("#### 72", "72", True),
        ("#### 72.0", "72", True),
        ("The total is 72.00 dollars.", "Work...\n#### 72", True),
        ("#### 1200", "1,200", True),
        ("#### 1,200", "Thus 1200\n#### 1200", True),
        ("#### $0.50", "0.5", True),
        ("#### 1/2", "0.5", True),
        ("#### -3", "-3", True),
        ("#### 3", "-3", False),
        ("#### 73", "72", False),
        ("#### 72\nThe answer is: 3", "3", False),
        ("I don't know", "72", False),
        ("#### 72", "no answer in reference", False),
    ],
)
def test_correct(completion, reference, expected):
    assert gsm8k_correct(completion, reference) is expected


def test_correct_works_off_the_main_thread():
    # math_verify's default timeout uses signal.alarm, which raises in any other thread.
    results: list[object] = []

    def worker() -> None:
        try:
            results.append(gsm8k_correct("#### 72.0", "#### 72"))
            results.append(gsm8k_correct("#### 1/2", "0.5"))
            results.append(gsm8k_correct("#### 71", "#### 72"))
            results.append(gsm8k_correct("#### 0.333333", "1/3"))   # close, not equal: math_verify's call
        except Exception as exc:  # noqa: BLE001 - surfaced by the assert below
            results.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(timeout=30)
    assert results == [True, True, False, True]


@pytest.mark.parametrize(
    ("reference", "prediction", "verdict"),
    [
        ("72", "72.0", True),        # equal rationals
        ("0.5", "1/2", True),
        ("-3", "3", False),
        ("71", "72", False),          # 1 apart: far more than 1e-4 of 72
        ("0", "0.001", False),        # 1e-3 apart, and the scale is at least 1
        ("1000000", "1000000.5", None),    # 5e-7 of the larger: too close to call here...
        ("0.333333", "1/3", None),    # ...and so is this, which math_verify takes as equal
        ("1/0", "5", None),           # no rational: math_verify's (then the plain rule's)
    ],
)
def test_numeric_verdict_by_hand(reference, prediction, verdict):
    assert _numeric_verdict(reference, prediction) is verdict


def test_numeric_verdict_agrees_with_math_verify():
    # Wherever the fast rule decides, math_verify decides the same: integers, cents, simple
    # fractions, and numbers 1e-12 to 1e-2 apart around the boundary of math_verify's tolerance.
    rng = random.Random(0)

    def number() -> str:
        kind = rng.random()
        if kind < 0.4:
            return str(rng.randint(-50, 300))
        if kind < 0.7:
            return f"{rng.randint(0, 99)}.{rng.randint(0, 99):02d}"
        return f"{rng.randint(1, 12)}/{rng.randint(1, 12)}"

    pairs = [(number(), number()) for _ in range(400)]
    for base in ("1", "3", "72", "0.5", "1/3", "2/7", "123456", "0.001"):
        for k in range(2, 13):
            b = float(Fraction(base)) * (1 + 10.0 ** -k)
            pairs.append((base, f"{b:.14f}".rstrip("0")))
    decided = 0
    for reference, prediction in pairs:
        verdict = _numeric_verdict(reference, prediction)
        if verdict is not None:
            decided += 1
            assert verdict == _math_verify_equal(reference, prediction), (reference, prediction)
    assert decided >= 400   # the common pairs never reach sympy


def test_plain_answers_are_scored_without_math_verify():
    # In a fresh process: numbers that are equal or clearly apart never import math_verify (and
    # sympy); only a close call does.
    code = ("import sys; from grpo.data.gsm8k import gsm8k_correct as c; "
            "r = [c('#### 7', '6'), c('#### 1/2', '0.5'), c('#### 1,200', '1200'), c('#### 71', '#### 72')]; "
            "before = 'math_verify' in sys.modules; r.append(c('#### 0.333333', '1/3')); "
            "print(r, before, 'math_verify' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2]).stdout.split("\n")[-2]
    assert out == "[False, True, True, False, True] False True"


def test_reward():
    """GSM8K rows are scored by the final-number rule (what evaluation and training both read)."""
    got = score_correctness([Problem("q", "72")] * 3, ["#### 72", "#### 7", "no idea"])
    assert got == [RewardResult(1.0, {"correctness": 1.0, "correct": 1.0, "has_answer": 1.0}),
                   RewardResult(0.0, {"correctness": 0.0, "correct": 0.0, "has_answer": 1.0}),
                   RewardResult(0.0, {"correctness": 0.0, "correct": 0.0, "has_answer": 0.0})]


# Issue #3's reward-parsing list (commas, dollars, negatives, decimals, percent, missing answers),
# beyond the cases above.
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("#### 25%", "25"),  # percent sign dropped
        ("The discount is 12.5%.", "12.5"),  # percent then sentence end, no marker
        ("#### -$5", "-5"),  # sign before the dollar
        ("#### $1,234.56", "1234.56"),  # dollars, thousands comma and cents together
        ("It is 1,234,567 total", "1234567"),
        ("#### 1,000.", "1000"),  # sentence-final "." after a comma number
        ("a loss of \u22127 dollars", "-7"),  # Unicode minus sign
        ("#### -0.75", "-0.75"),
        ("#### .5", "0.5"),  # bare leading decimal point
        ("#### 3.50", "3.50"),  # kept as written; equality is numeric (below)
        ("#### ", None),  # a marker with nothing after it, and no number anywhere
        ("####", None),
        ("Total: -0", "0"),  # negative zero is zero
    ],
)
def test_extract_more_forms(text, expected):
    assert extract_gsm8k_answer(text) == expected


@pytest.mark.parametrize(
    ("completion", "reference", "expected"),
    [
        ("#### 25%", "25", True),
        ("#### 3.50", "#### 3.5", True),
        ("#### -$5", "-5", True),
        ("#### $1,234.56", "1234.56", True),
        ("#### 1,234.5", "1234.56", False),
        ("#### 0.1", "#### 1", False),
        ("#### -0.75", "0.75", False),
        ("#### ", "#### 5", False),  # missing answer
        ("#### 5", "#### ", False),  # reference without an answer never matches
    ],
)
def test_correct_more_forms(completion, reference, expected):
    assert gsm8k_correct(completion, reference) is expected
