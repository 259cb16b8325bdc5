"""bench/staleness_replay.py on hand-written logs: the groups and steps it reads, and its replay of a
queue first come first served against oldest version first."""
import json

from benchload import load_bench

sr = load_bench("staleness_replay")


def test_replay_by_hand():
    # two groups arrive in second 0, version 3 before version 2; one group a step, --max-staleness 4;
    # steps collect at 1 s (judged at version 6) and 2 s (version 7)
    arrivals, steps = [(0, 3), (0, 2)], [(1.0, 2, 7), (2.0, 3, 8)]
    # first come: step 1 trains 3 (3 old), step 2 meets 2 at 5 old: stale, and has nothing else
    assert sr.replay(arrivals, steps, 4, 1, oldest_first=False) == {"trained": 1, "stale": 1, "queued": 0}
    # oldest first: 2 at 4 old, then 3 at 4 old
    assert sr.replay(arrivals, steps, 4, 1, oldest_first=True) == {"trained": 2, "stale": 0, "queued": 0}
    # a step with an empty queue takes the next arrival whenever it came (the learner waited for it)
    assert sr.replay([(5, 6)], [(1.0, 2, 7)], 4, 1, oldest_first=False) == {"trained": 1, "stale": 0, "queued": 0}


def test_logs_are_read_as_groups_with_signal_steps_and_spans(tmp_path):
    (tmp_path / "sampler0.log").write_text(
        "16:11:05 sampler0 INFO round 1 (v8): 16 completions, 2967 tokens in 2.09 s (1423 tok/s) (swapped in flight: "
        "tokens of v8-v11); log-probs 0.00 s, rewards 0.00 s; reward mean 0.9, 0 of 1 groups zero-signal | gpu\n"
        "16:11:06 sampler0 INFO round 1 (v9): 32 completions, 6948 tokens in 0.16 s (43947 tok/s); log-probs 0.00 s, "
        "rewards 0.01 s; reward mean 0.500, 1 of 2 groups zero-signal | gpu\n"
        "16:11:06 sampler0 INFO now running policy version 10\n")
    (tmp_path / "learner0.log").write_text(
        "16:11:07 learner0 INFO step 10 v10: loss 0.03 reward 0.4 acc 0.4 kl - clip 0.000 | 33737 tok, 1.11 s "
        "(wait 0.55, train 0.50, publish 0.25) | 103.3 samples/s\n")
    arrivals, steps, chunks = sr.read(tmp_path)
    assert arrivals == [(58265, 8), (58266, 9)]          # 16:11:05 is second 58,265 of the day
    assert steps == [(58266.25, 58267, 10)] and chunks == [[(1, 1), (1, 2)]]
    assert sr.spans(tmp_path) == {0: 1, 3: 1}             # v8-v11; the second chunk took no swap
    # the mean reciprocal share after each chunk: 1/1, then 2/3 -> (1 + 1.5) / 2 over both windows
    assert sr.share_bias(chunks[0]) == {"run": 1.5, "last_4_chunks": 1.25, "last_64_groups": 1.25}
    out = tmp_path / "out.json"
    assert sr.main([f"{tmp_path}:4", "--per-step", "1", "--out", str(out)]) == 0
    got = json.loads(out.read_text())["runs"][tmp_path.name]
    assert got["replay_arrival_order"] == {"trained": 1, "stale": 0, "queued": 1} and got["bound"] == 4
