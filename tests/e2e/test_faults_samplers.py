"""Fault injection on samplers, with real processes: SIGKILL + restart, and SIGSTOP past the heartbeat timeout.

One run (to keep the suite short), phases in order:
  1. learner + sampler 0 (4 rounds) + sampler 1 (unbounded); sampler 1 is SIGKILLed after its
     first round. The learner keeps training on what it has, marks sampler 1 gone after the
     heartbeat timeout, and, once sampler 0 has finished, waits, logging "no data".
  2. sampler 1 is restarted with the same --sampler-id: it is welcomed back, gets the learner's
     current weights on its first sync, and its first group carries that version.
  3. the restarted sampler is SIGSTOPped for longer than the heartbeat timeout: counted as gone,
     then welcomed back after SIGCONT; the run finishes (10 steps need its groups).
The books close: sent = trained + dropped (by reason, with lost_in_flight for the killed
process) + queued, per process as well as in total.
"""
import json
import re
import signal
import time

import pytest
from faultutil import Cluster, check_books

HB_TIMEOUT = 4.0


@pytest.mark.slow
def test_sampler_killed_restarted_and_stopped(tmp_path):
    c = Cluster(tmp_path, 2, ["--num-generations", "4", "--max-new-tokens", "8"])
    try:
        c.learner("--max-steps", "10", "--train-batch-size", "4", "--heartbeat-timeout-s", str(HB_TIMEOUT),
                  "--data-timeout-s", "1", "--shutdown-timeout-s", "60")
        hb = ["--prompts-per-round", "1", "--heartbeat-interval-s", "0.5", "--sync-timeout-s", "2"]
        c.sampler(0, *hb, "--max-rounds", "4")
        c.sampler(1, *hb)

        # 1. SIGKILL sampler 1 once its first round went out (the round log precedes the sends,
        # so wait for the second round: the first one's groups were handed to the socket).
        c.wait_log("sampler1", r"round 1 \(v\d+\)")
        killed_at_steps = len(c.steps())
        c.signal("sampler1", signal.SIGKILL)
        c.procs["sampler1"].wait(timeout=30)
        c.wait_log("learner", r"sampler 1 silent for \d+ s .* counted as gone", timeout=60)
        # Sampler 0 finishes its 4 rounds and exits cleanly; the learner trains on or waits.
        assert c.procs["sampler0"].wait(timeout=240) == 0, c.logs()
        waits_before = c.count("learner", r"no data for \d+ s")
        c.wait("the learner to train on or wait for data",
               lambda: len(c.steps()) > killed_at_steps or "no data for" in c.log("learner"))
        # a wait logged after sampler 0 left (--data-timeout-s 1: within a second of it)
        c.wait_log("learner", r"no data for \d+ s", count=waits_before + 1)
        version_before_restart = len(c.steps())

        # 2. Restart sampler 1 (same id): a new process, welcomed back.
        c.sampler(1, *hb)
        c.wait_log("learner", r"sampler 1 is back")
        c.wait_log("sampler1", r"round 0 \(v\d+\)", alive=("learner", "sampler1"))
        first = c.log("sampler1")
        got = re.search(r"now running policy version (\d+)", first)
        round0 = re.search(r"round 0 \(v(\d+)\)", first)
        assert got and round0 and got.start() < round0.start(), first[-3000:]
        assert int(round0.group(1)) == int(got.group(1)) >= max(version_before_restart, 1)

        # 3. SIGSTOP it past the heartbeat timeout: gone; SIGCONT: back.
        gone, back = c.count("learner", r"sampler 1 silent for"), c.count("learner", r"sampler 1 is back")
        assert (gone, back) == (1, 1), c.log("learner")  # only the kill so far: nothing spurious
        c.signal("sampler1", signal.SIGSTOP)
        c.wait_log("learner", r"sampler 1 silent for \d+ s", count=2, timeout=60)
        time.sleep(1.0)
        assert c.procs["learner"].poll() is None and c.procs["sampler1"].poll() is None
        c.signal("sampler1", signal.SIGCONT)
        c.wait_log("learner", r"sampler 1 is back", count=2, timeout=60)

        assert c.procs["learner"].wait(timeout=400) == 0, c.logs()
        assert c.procs["sampler1"].wait(timeout=120) == 0, c.logs()
    finally:
        c.close()

    s = c.summary()
    acc = s["groups"]
    print("\naccounting:", acc, "\nincarnations:", s["incarnations"], "\nliveness:", s["liveness"])
    check_books(acc)
    assert s["steps"] == 10 and acc["trained"] == 10
    inc = s["incarnations"]
    assert [(e["sampler_id"], e["final"]) for e in inc] == [(0, True), (1, False), (1, True)] or \
        [(e["sampler_id"], e["final"]) for e in inc] == [(1, False), (0, True), (1, True)], inc
    s0 = next(e for e in inc if e["sampler_id"] == 0)
    killed = next(e for e in inc if e["sampler_id"] == 1 and not e["final"])
    restarted = next(e for e in inc if e["sampler_id"] == 1 and e["final"])
    assert killed["incarnation"] != restarted["incarnation"]
    # The killed process sent at least its first round; what it sent but we never got is lost_in_flight.
    assert killed["received"] >= 1 and killed["sent"] == killed["received"] + killed["lost_in_flight"]
    assert acc["dropped"].get("lost_in_flight", 0) == killed["lost_in_flight"]
    # The restarted process got the then-current weights before it generated: its first group carries them.
    assert restarted["first_group_version"] == restarted["joined_at_version"] >= 1, restarted
    # Clean exits report what they sent; the learner's per-process counts agree exactly.
    r0 = json.loads((c.run_dir / "sampler0_result.json").read_text())
    r1 = json.loads((c.run_dir / "sampler1_result.json").read_text())
    assert (s0["sent"], s0["received"]) == (r0["groups_sent"], r0["groups_sent"]) and r0["rounds"] == 4
    assert (restarted["sent"], restarted["received"]) == (r1["groups_sent"], r1["groups_sent"])
    assert acc["sent"] == s0["sent"] + killed["sent"] + restarted["sent"]
    assert s["samplers_without_final_status"] == []  # the killed process was not waited for
    live = s["liveness"]
    assert live["gone"] == [] and live["finished"] == [0, 1], live
    assert live["times_gone"] == 2 and live["times_back"] == 2, live  # the kill and the SIGSTOP
    learner_log = c.log("learner")
    assert "restarted (new process)" in learner_log and "Traceback" not in learner_log
