"""Every entry point's --help prints and exits 0: argparse formats each help string with %, so a
field's doc that says "10%" once ended run_distributed.py --help in a TypeError."""
import subprocess
import sys
from pathlib import Path

import pytest
from freshenv import child_env

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("cmd", [["run_distributed.py"], ["sampling_worker.py"], ["training_worker.py"],
                                 ["communication_test.py"], ["-m", "grpo.evaluate"], ["-m", "grpo.data"]])
def test_every_entry_point_prints_its_help(cmd):
    r = subprocess.run([sys.executable, *cmd, "--help"], cwd=ROOT, env=child_env(), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("usage:") and "Traceback" not in r.stderr


def test_a_percent_in_a_fields_doc_reaches_the_help_as_written():
    r = subprocess.run([sys.executable, "sampling_worker.py", "--help"], cwd=ROOT, env=child_env(),
                       capture_output=True, text=True, timeout=120)
    flat = " ".join(r.stdout.split())
    assert "held-out 10% of rows" in flat and "i % num_samplers" in flat, flat[:300]
