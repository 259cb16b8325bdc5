"""grpo.learner.stop in a real process: the first SIGINT or SIGTERM is only recorded (the learner
saves, then ends), and from then on either signal ends the process at once, as a second Ctrl+C
must, even if the process is in a long native call."""
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import sys, time
from grpo.learner.stop import StopRequest
stop = StopRequest()
assert stop.install()
print("ready", flush=True)
while not stop.requested():
    time.sleep(0.01)
print("asked", stop.name, flush=True)
time.sleep(60)   # a long save; the second signal must end it
print("not ended", flush=True)
"""


@pytest.mark.parametrize("first,second", [(signal.SIGTERM, signal.SIGINT), (signal.SIGINT, signal.SIGINT)])
def test_the_first_signal_is_recorded_and_the_second_ends_the_process(first, second):
    p = subprocess.Popen([sys.executable, "-c", CHILD], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "ready\n"
        p.send_signal(first)
        assert p.stdout.readline() == f"asked {first.name}\n"
        assert p.poll() is None   # still alive: it saves before it ends
        t0 = time.monotonic()
        p.send_signal(second)
        assert p.wait(timeout=30) == -second
        assert time.monotonic() - t0 < 5
    finally:
        if p.poll() is None:
            p.kill()
