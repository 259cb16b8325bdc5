"""grpo.stats: what a step record computes from the trained groups, worked out by hand."""
from __future__ import annotations

import zlib

import numpy as np
import pytest
from builders import make_completion, make_group

from grpo.stats import batch_crc32, group_stats, reward_parts, staleness


def _c(ids, logps, finished, info):
    return make_completion(ids, old_log_probs=logps, reward_info=info, is_finished=finished)


def _g(version, comps):
    return make_group(comps, group_id=f"g{version}", policy_version=version)


def test_staleness_is_versions_behind_the_learner_that_trains():
    assert staleness(5, 5) == 0     # sampled by the very weights being trained
    assert staleness(5, 2) == 3
    assert staleness(0, 1) == -1    # from the future: the intake drops it as future_version


def test_group_stats_hand_worked():
    g1 = _g(3, [_c([5, 6], [-1.0, -1.0], True, {"correct": 1.0, "format": 0.2}),
                _c([7], [-2.0], False, {"correct": 0.0, "format": 0.0})])
    g2 = _g(1, [_c([8, 9, 10], [-0.5, -0.5, -0.5], True, {"correct": 1.0})])
    out = group_stats([g1, g2], version=5)    # trained at version 4 (before the step's update)
    assert out["accuracy"] == pytest.approx(2 / 3)
    assert out["staleness_mean"] == pytest.approx(((4 - 3) + (4 - 1)) / 2)  # 2.0
    assert out["staleness_max"] == 3
    assert out["reward/correct"] == pytest.approx(2 / 3)
    assert out["reward/format"] == pytest.approx(0.1)             # only the completions that have it
    assert out["reward_components"] == {"format": pytest.approx(0.1)}
    assert out["entropy"] == pytest.approx(5.5 / 6)              # (1+1+2+0.5*3) / 6 tokens
    assert out["truncated_frac"] == pytest.approx(1 / 3)
    assert out["batch_crc32"] == zlib.crc32(np.arange(5, 11, dtype=np.int32).tobytes())
    assert reward_parts([]) == {} and group_stats([], 1) == {}


def test_batch_crc32_depends_on_order_and_tokens():
    a = _g(0, [_c([1, 2], [0.0, 0.0], True, {})])
    b = _g(0, [_c([2, 1], [0.0, 0.0], True, {})])
    assert batch_crc32([a]) != batch_crc32([b]) and batch_crc32([a, b]) != batch_crc32([b, a])


def test_round_prompts_by_hand():
    from grpo.stats import round_prompts

    # 8 groups a step, every group has signal: 8 prompts fill a step
    assert round_prompts(8, 1.0) == 8
    # half the groups have signal: 16 prompts yield 8 with signal
    assert round_prompts(8, 0.5) == 16
    # 3 of 10 with signal: ceil(8 / 0.3) = ceil(26.67) = 27
    assert round_prompts(8, 0.3) == 27
    # no signal at all: floored at 1/16, so 8 * 16 = 128, then the cap of 64
    assert round_prompts(8, 0.0) == 64
    assert round_prompts(8, 0.0, cap=200) == 128
    # a budget of 6 queued groups at share 0.5 allows ceil(6 / 0.5) = 12 prompts (fewer than 16)
    assert round_prompts(8, 0.5, budget=6) == 12
    # a budget larger than a step's worth does not raise the round past one step
    assert round_prompts(8, 0.5, budget=40) == 16
    # never fewer than 1
    assert round_prompts(8, 1.0, budget=0) == 1
    # exact divisions do not round up by floating-point error: 6 / 0.75 = 8
    assert round_prompts(6, 0.75) == 8
    # the defaults' step of 2 groups (G=8), every group sent: 2 prompts, 16 rows; a floor of 8 prompts
    # (the 64-row bucket those 16 rows are padded to) fills the bucket, within the budget: with 6
    # groups of room (--max-staleness 2: 3 steps of 2) 6 prompts, with room for 10 the whole 8
    assert round_prompts(2, 1.0) == 2
    assert round_prompts(2, 1.0, min_prompts=8) == 8
    assert round_prompts(2, 1.0, budget=6, min_prompts=8) == 6
    assert round_prompts(2, 1.0, budget=10, min_prompts=8) == 8
    # at share 0.5 the budget of 3 groups allows ceil(3 / 0.5) = 6 prompts, the floor asks for 8
    assert round_prompts(2, 0.5, budget=3, min_prompts=8) == 6
    # a round already past the floor is not changed by it; the cap still bounds it
    assert round_prompts(8, 0.5, min_prompts=8) == 16
    assert round_prompts(2, 1.0, min_prompts=100) == 64


def test_bucket_prompts_by_hand():
    from grpo.config import ROW_BUCKETS
    from grpo.stats import bucket_prompts

    assert bucket_prompts(ROW_BUCKETS, 8) == 8      # 64 rows / 8
    assert bucket_prompts(ROW_BUCKETS, 16) == 4
    assert bucket_prompts(ROW_BUCKETS, 3) == 22     # ceil(64 / 3)
    assert bucket_prompts((), 8) == 1               # no buckets (hf, eager): no floor


def test_largest_round_prompts_by_hand():
    """The most prompts a round can take (the memory plan's KV cache): round 0 (8 groups at share 1/3
    under the filter, 1 without) or a later round at share 1/16 (1 without) within the largest
    budget, (max_staleness + 1) x groups a step over the samplers, whichever is larger."""
    from grpo.stats import largest_round_prompts
    from grpo.sync.flow import generation_budget

    # the defaults (G=8, 16 rows a step: 2 groups; --max-staleness 2), a floor of 8 prompts (the
    # 64-row bucket): round 0 max(8, 8) = 8; later rounds min(max(2, 8), budget 6) = 6. So 8.
    assert largest_round_prompts(2, 2, False, 64, min_prompts=8) == 8
    # the same under --filter-zero-signal: round 0 ceil(8 / (1/3)) = 24; later ceil(2 x 16) = 32,
    # within ceil(6 x 16) = 96. So 32.
    assert largest_round_prompts(2, 2, True, 64, min_prompts=8) == 32
    # the benchmark's (G=16, 128 rows: 8 groups a step, floor 4): later 8 x 16 = 128, capped at 64
    assert largest_round_prompts(8, 2, True, 64, min_prompts=4) == 64
    # without the filter, a step of 8 groups: round 0 and later rounds both 8
    assert largest_round_prompts(8, 2, False, 64, min_prompts=4) == 8
    # --max-staleness 0 and two samplers on the port, no filter, step of 4: budget 4 // 2 = 2, so
    # later rounds take 2 (the floor of 8 is bounded by it), round 0 takes 8
    assert largest_round_prompts(4, 0, False, 64, min_prompts=8, samplers=2) == 8
    # a step of 16 groups, two samplers, no floor: later rounds min(16, budget 16 // 2 = 8) = 8, round 0
    # 8 too; with --max-staleness 1 the budget is 32 // 2 = 16, so later rounds take 16
    assert largest_round_prompts(16, 0, False, 64, samplers=2) == 8
    assert largest_round_prompts(16, 1, False, 64, samplers=2) == 16
    # the budget here is the learner's for an empty queue and a sampler at its version
    for gps, stale, n in [(2, 2, 1), (8, 0, 2), (5, 3, 3)]:
        assert generation_budget(7, 7, 0, gps, stale, n) == (stale + 1) * gps // n


def test_zero_signal_alarm_by_hand():
    from grpo.stats import zero_signal_alarm

    assert zero_signal_alarm(255, 255) is None              # too few groups to judge
    assert zero_signal_alarm(300, 269) is None              # 89.7% < 90%
    line = zero_signal_alarm(300, 270)                      # 90%: 30 with signal, 300 / 30 = 10 per one
    assert line.startswith("90% of the last 300 groups had zero signal") and "(about 10 generated for each one trained," in line
    assert "about 11 generated" in zero_signal_alarm(1000, 909)   # 1000 / 91 = 10.99
    assert "(none trained," in zero_signal_alarm(256, 256)
    assert zero_signal_alarm(10, 10, min_groups=8) is not None and zero_signal_alarm(0, 0, min_groups=0) is None


def test_the_learner_names_a_spinning_run_about_once_a_window():
    """Learner._zero_signal_alarm on the books of successive steps: it looks at the groups sent
    since its last look, once 256 have come, and starts again when the books go back (resume)."""
    from types import SimpleNamespace

    from grpo.learner.loop import Learner

    me = SimpleNamespace(_zero_signal_mark=(0, 0))

    def look(sent, zero):
        return Learner._zero_signal_alarm(me, {"sent": sent, "dropped": {"sampler_zero_signal": zero}})

    assert look(200, 190) is None and me._zero_signal_mark == (0, 0)      # 200 < 256: not yet
    assert look(300, 280).startswith("93% of the last 300 groups")       # 280 / 300
    assert me._zero_signal_mark == (300, 280)
    assert look(500, 480) is None                                         # 200 more: not yet
    assert look(600, 500) is None and me._zero_signal_mark == (600, 500)  # 220 / 300 = 73%: quiet, moves on
    assert look(100, 95) is None and me._zero_signal_mark == (100, 95)    # restored books: start again
    assert look(400, 390).startswith("98% of the last 300 groups")        # 295 / 300
