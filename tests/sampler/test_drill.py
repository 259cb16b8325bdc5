"""The fault drill that kills a sampler mid-swap (GRPO_DRILL_DIE_IN_SWAP), in a real process."""
import os
import signal
import subprocess
import sys
from pathlib import Path

from grpo.sampler.drill import drill_due

ROOT = Path(__file__).resolve().parents[2]


def test_drill_due_at_the_nth_version_and_never_for_a_file_without_a_number():
    assert [drill_due("3\n", n) for n in (1, 2, 3, 4)] == [False, False, True, True]
    assert drill_due("", 9) is False and drill_due("soon", 9) is False


def test_the_drill_kills_its_process_once_at_the_nth_apply_and_removes_its_file(tmp_path):
    drill = tmp_path / "die"
    drill.write_text("2")
    code = ("import sys; from grpo.sampler.drill import maybe_die\n"
            "for n in (1, 2, 3):\n"
            "    maybe_die(n); print('applied', n, flush=True)\n")
    env = {**os.environ, "GRPO_DRILL_DIE_IN_SWAP": str(drill)}
    first = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == -signal.SIGKILL and first.stdout == "applied 1\n", (first.stdout, first.stderr)
    assert "dying in the middle of a weight swap, at the 2-th version" in first.stderr
    assert not drill.exists()
    # the restarted process finds no drill file: it runs on
    again = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and again.stdout == "applied 1\napplied 2\napplied 3\n"
