"""GSM8K *train* problems by difficulty, as --dataset-transform functions.

    python run_distributed.py ... --dataset-transform bench/gsm8k_curriculum.py:at_most_2_steps

A GSM8K reference solution writes one reasoning step per line before its "#### answer" line,
so the line count is the problem's number of steps (train split: 1,961 two-step problems,
2,149 three-step, 3,363 with four to nine). SmolLM2-135M solves about 1.5% of sampled
completions overall, so 85% of its groups carry no signal (README, "Learning runs 4 and 5");
training on the fewest-step problems is the easy-sample curriculum that small-model GRPO
studies use to get signal where the model can already sometimes succeed.

Transforms apply to the training data only: the evaluation subset (the first N *test*
problems) is loaded without them, so the test problems scored before and after are unchanged.
"""
from __future__ import annotations

__all__ = ["at_most_2_steps", "at_most_3_steps", "solution_steps"]


def solution_steps(answer: str) -> int:
    """Reasoning steps of a GSM8K reference solution: its non-empty lines before '####'."""
    body = answer.rsplit("####", 1)[0]
    return sum(1 for line in body.splitlines() if line.strip())


def _at_most(row: dict, n: int) -> dict | None:
    answer = row.get("answer")
    if not isinstance(answer, str) or "####" not in answer:
        return row   # not a GSM8K reference solution: leave it to the normal row checks
    return row if solution_steps(answer) <= n else None


def at_most_2_steps(row: dict) -> dict | None:
    """Keep problems whose reference solution has at most two steps."""
    return _at_most(row, 2)


def at_most_3_steps(row: dict) -> dict | None:
    """Keep problems whose reference solution has at most three steps."""
    return _at_most(row, 3)
