"""The fused sampling kernel's CPU cases (fused_sampling_cases.py) under Triton's interpreter, in a
process of their own: TRITON_INTERPRET must be set before Triton is imported, and in this process
it would send every engine of the other tests through the interpreter."""
from __future__ import annotations

from pathlib import Path

from interpreted import run_cases

CASES = Path(__file__).with_name("fused_sampling_cases.py")


def test_fused_sampling_cases_pass_under_the_interpreter():
    run_cases(CASES, 6)
