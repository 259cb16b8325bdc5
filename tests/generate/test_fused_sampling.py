"""The fused sampling kernel's CPU cases (fused_sampling_cases.py) under Triton's interpreter, in a
process of their own: TRITON_INTERPRET must be set before Triton is imported, and in this process
it would send every engine of the other tests through the interpreter."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

CASES = Path(__file__).with_name("fused_sampling_cases.py")


def test_fused_sampling_cases_pass_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-m", "pytest", str(CASES), "-q", "-p", "no:cacheprovider", "-x"],
                         cwd=CASES.parents[2], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert re.search(r"^6 passed", out.stdout, re.M), out.stdout[-2000:]   # none skipped
