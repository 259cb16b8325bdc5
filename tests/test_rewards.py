"""GSM8K answer extraction and correctness, on hand-picked strings and a real reference."""

import json
import threading
from pathlib import Path

import pytest

from grpo.rewards import RewardResult, extract_gsm8k_answer, gsm8k_correct, gsm8k_reward

GSM8K_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gsm8k"


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
    assert gsm8k_reward("#### 72", "72") == RewardResult(1.0, {"correct": 1.0, "has_answer": 1.0})
    assert gsm8k_reward("#### 7", "72") == RewardResult(0.0, {"correct": 0.0, "has_answer": 1.0})
    assert gsm8k_reward("no idea", "72") == RewardResult(0.0, {"correct": 0.0, "has_answer": 0.0})
