"""GSM8K answer extraction and correctness, on hand-picked strings and a real reference."""

import json
import threading
from pathlib import Path

import pytest

from grpo.data.formats import Problem
from grpo.data.gsm8k import RewardResult, extract_gsm8k_answer, gsm8k_correct
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
        except Exception as exc:  # noqa: BLE001 - surfaced by the assert below
            results.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(timeout=30)
    assert results == [True, True, False]


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
