"""A learner that is absent, then slow: bounded queues on both sides, and every group in the books.

Real processes. Two samplers start before the learner exists, with --send-hwm 2. A sampler sends
nothing before it has the run's facts from the learner's first answer, so a stand-in for the
learner's sync side (in this process) gives them those, and leaves before the learner starts:
  sampler 0 --on-full drop: queues exactly 2 groups, drops the rest (counted), peak memory flat;
  sampler 1 --on-full block: queues 2 groups and waits on the third (logged), generating nothing more.
Then the learner starts with --buffer-size 2: the backlog arrives while it loads its model, so its
FIFO overflows (oldest dropped, counted as buffer_full), and it stops after its one step with groups
of that backlog still queued, which are counted as queued, not vanished.
"""
import json
import re
from pathlib import Path

import pytest
from faultutil import Cluster, check_books, peak_rss_kb
from scripted import ScriptedLearner

from grpo.model.zoo import resolve_model
from grpo.wire import messages as M

HWM = 2


@pytest.mark.slow
def test_absent_then_slow_learner_bounded_queues_and_books(tmp_path):
    c = Cluster(tmp_path, 2, ["--num-generations", "4", "--max-new-tokens", "8"])
    opts = ["--prompts-per-round", "4", "--send-hwm", str(HWM), "--sync-timeout-s", "1",
            "--heartbeat-interval-s", "1"]
    samplers = ("sampler0", "sampler1")
    # the model's vocabulary (its embedding rows) from its config: no model (nor transformers) loaded here
    vocab_size = json.loads((Path(resolve_model("tiny-random")) / "config.json").read_text())["vocab_size"]
    facts = M.RunFacts(schema=M.SCHEMA_VERSION, model="tiny-random", vocab_size=vocab_size,
                       dtype="float32", num_generations=4, max_new_tokens=8, max_prompt_tokens=4096, temperature=1.0,
                       needs_ref_logprobs=True, max_staleness=4)
    stand_in = ScriptedLearner(c.sync_port, facts)   # answers no_update, with the facts first
    stand_in.start()
    try:
        c.sampler(0, *opts, "--on-full", "drop")
        c.sampler(1, *opts, "--on-full", "block")
        # Sampler 0's peak resident memory once warm (10 drops) and 20 drops later: flat, since
        # what it cannot send it drops instead of queueing (each group is ~10 kB here, so this
        # bounds the process, not the groups; the queue bound itself is exact, see sampler 1).
        c.wait_log("sampler0", r"dropped 10 groups so far", alive=samplers)
        pid = c.procs["sampler0"].pid
        rss = [peak_rss_kb(pid)]
        c.wait_log("sampler0", r"dropped 30 groups so far", alive=samplers)
        rss.append(peak_rss_kb(pid))
        c.wait_log("sampler1", rf"data queue full for \d+ s .* waiting to send group {HWM + 1}\b", alive=samplers)
        blocked_log = c.log("sampler1")
        # Blocked on group HWM+1: it has not gone on to generate and queue more.
        assert not re.search(rf"waiting to send group (?!{HWM + 1}\b)\d+", blocked_log), blocked_log[-2000:]
        assert len(re.findall(r"round \d+ \(v0\)", blocked_log)) == 1  # 4 groups per round: blocked in round 0

        stand_in.done.set()   # the sync port is the learner's from now on
        stand_in.join(timeout=10)
        # One step of one group: the backlog, made under the stand-in's answers (which set no budget),
        # is more than it trains, so groups are still queued at its end. (From the learner's first
        # answer on, the budget stops at what its steps left train: a longer run would leave none.)
        c.learner("--max-steps", "1", "--train-batch-size", "4", "--buffer-size", "2", "--max-staleness", "8",
                  "--heartbeat-timeout-s", "60", "--shutdown-timeout-s", "60")
        assert c.procs["learner"].wait(timeout=400) == 0, c.logs()
        for n in samplers:
            assert c.procs[n].wait(timeout=120) == 0, c.logs()
    finally:
        stand_in.done.set()
        c.close()

    growth_mb = (max(rss) - rss[0]) / 1024
    s = c.summary()
    acc = s["groups"]
    r0 = json.loads((c.run_dir / "sampler0_result.json").read_text())
    r1 = json.loads((c.run_dir / "sampler1_result.json").read_text())
    print(f"\nsampler 0 peak RSS {rss[0] / 1024:.0f} MB at its 10th drop, {rss[1] / 1024:.0f} MB at its 30th; "
          f"accounting: {acc}")
    assert growth_mb < 128, (growth_mb, rss)  # a sanity bound: the peak follows prompt length, not drops
    check_books(acc)
    assert s["steps"] == 1 and acc["trained"] == 1
    # Sampler-side drops are in the books, exactly as the samplers counted them.
    assert r0["dropped_full"] >= 30 and acc["dropped"]["sampler_full"] == r0["dropped_full"]
    assert r1["dropped_full"] == 0 and r1["dropped_send_timeout"] == 0
    assert acc["sent"] == r0["groups_sent"] + r1["groups_sent"]
    # The learner's FIFO held at most 2: the backlog overflowed it, and what is left is counted.
    assert acc["dropped"].get("buffer_full", 0) >= 1 and 1 <= acc["queued"] <= 2, acc
    assert "learner bound data 127.0.0.1" in c.log("learner")
