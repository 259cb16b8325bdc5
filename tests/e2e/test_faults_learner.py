"""The learner SIGKILLed after a checkpoint and resumed with --resume latest, its sampler running on throughout.

The sampler keeps its sockets: its weight requests go unanswered (logged) and its sends wait
at the high-water mark while no learner is up, and ZeroMQ reconnects it on its own. The
resumed learner continues at the step after its checkpoint (no step repeated or skipped from
there), carries the checkpoint's books over, and closes them for the whole run: groups the
dead learner had queued or received after the checkpoint, or that were in flight to it, are
dropped as lost_in_learner_queue / lost_with_learner, not vanished.
"""
import json
import signal
import time

import pytest
from faultutil import Cluster, check_books


@pytest.mark.slow
def test_learner_killed_and_resumed_sampler_keeps_running(tmp_path):
    c = Cluster(tmp_path, 1, ["--num-generations", "4", "--max-new-tokens", "8"])
    learner = ["--max-steps", "6", "--train-batch-size", "4", "--save-every", "2", "--shutdown-timeout-s", "60"]
    try:
        c.learner(*learner)
        c.sampler(0, "--prompts-per-round", "1", "--heartbeat-interval-s", "1", "--sync-timeout-s", "2")
        state = c.run_dir / "checkpoints" / "step_2" / "trainer_state.json"
        # a tight poll: a tiny model's steps take tens of milliseconds, so the 0.2 s of c.wait
        # let the learner run on to step 4 (and its save) before the kill, on a quiet machine
        deadline = time.monotonic() + 120
        while not state.exists():
            assert time.monotonic() < deadline and c.procs["learner"].poll() is None, c.logs()
            time.sleep(0.002)
        c.signal("learner", signal.SIGKILL)
        c.procs["learner"].wait(timeout=30)
        first_steps = [r["step"] for r in c.steps()]
        sampler_pid = c.procs["sampler0"].pid
        c.wait_log("sampler0", r"no answer from the learner", alive=("sampler0",))  # it noticed, and runs on
        c.learner(*learner, "--resume", "latest")
        assert c.procs["learner"].wait(timeout=400) == 0, c.logs()
        assert c.procs["sampler0"].wait(timeout=120) == 0, c.logs()
        assert c.procs["sampler0"].pid == sampler_pid  # the same process throughout
    finally:
        c.close()

    steps = [r["step"] for r in c.steps()]
    assert first_steps[:2] == [1, 2] and len(first_steps) <= 3, first_steps  # killed right after step_2 was saved
    assert steps == first_steps + [3, 4, 5, 6], steps       # resumed at 3: nothing after the checkpoint reused
    assert "continuing at step 3" in c.log("learner")
    s = c.summary()
    acc = s["groups"]
    print("\naccounting over both learners:", acc)
    check_books(acc)
    assert s["steps"] == 6 and acc["trained"] == 6          # 2 restored from the checkpoint + 4 after it
    r0 = json.loads((c.run_dir / "sampler0_result.json").read_text())
    assert acc["sent"] == r0["groups_sent"]                 # one sampler process, all of its groups in the books
    inc = s["incarnations"]
    assert len(inc) == 1 and inc[0]["final"] and inc[0]["sent"] == r0["groups_sent"]
