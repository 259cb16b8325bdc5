"""Run a file of CPU cases for the Triton kernels under Triton's interpreter, in a process of its own:
TRITON_INTERPRET must be set before Triton is imported, and in the test process it would send every
other test's engines and log-probs through the interpreter."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_cases(cases: Path, passed: int) -> None:
    """Every case of `cases` passes, and all `passed` of them ran (none skipped)."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-m", "pytest", str(cases), "-q", "-p", "no:cacheprovider", "-x"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert re.search(rf"^{passed} passed", out.stdout, re.M), out.stdout[-2000:]
