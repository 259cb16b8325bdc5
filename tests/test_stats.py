"""grpo.stats: what a step record computes from the trained groups, worked out by hand."""
from __future__ import annotations

import zlib

import numpy as np
import pytest
from builders import make_completion, make_group

from grpo.stats import (batch_crc32, bf16_peak_share, bf16_peak_tflops, both_busy_share, busy_rate, group_stats,
                        reward_parts, staleness)


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


def test_bf16_peak_share_by_hand():
    """6 x params x tokens over seconds x GPUs x peak (4 x with LoRA): 0.5e9 parameters, 40,000 tokens
    in 2 s on one H200 (989 TFLOP/s) is 1.2e17 / 1.978e15; on two GPUs half that; nothing without a
    peak or a time."""
    assert bf16_peak_tflops("NVIDIA H200") == 989.0 and bf16_peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert bf16_peak_tflops("NVIDIA H100 PCIe") == 756.0 and bf16_peak_tflops("NVIDIA L4") == 121.0
    assert bf16_peak_tflops("NVIDIA L40S") == 362.1 and bf16_peak_tflops("cpu") is None
    share = bf16_peak_share(500_000_000, 40_000, 2.0, 1, 989.0)
    assert share == pytest.approx(6 * 0.5e9 * 4e4 / (2 * 989e12)) and round(share, 4) == 0.0607
    assert bf16_peak_share(500_000_000, 40_000, 2.0, 2, 989.0) == pytest.approx(share / 2)
    assert bf16_peak_share(500_000_000, 40_000, 2.0, 1, 989.0, lora=True) == pytest.approx(share * 4 / 6)
    assert bf16_peak_share(1, 1, 2.0, 1, None) is None and bf16_peak_share(1, 1, 0.0, 1, 989.0) is None


def test_both_busy_share_by_hand():
    # a 4 s step: 2 s training, the sampler busy 75% (3 s): they overlap at least 2 + 3 - 4 = 1 s
    assert both_busy_share(4.0, 2.0, 0.75) == pytest.approx(0.25)
    # turns taken exactly: 2 s training and 2 s of the sampler fit side by side, no overlap forced
    assert both_busy_share(4.0, 2.0, 0.5) == 0.0
    # both busy the whole step; figures past the step are clipped to it, a zero step is no step
    assert both_busy_share(4.0, 4.0, 1.0) == 1.0 and both_busy_share(4.0, 9.0, 3.0) == 1.0
    assert both_busy_share(0.0, 1.0, 1.0) == 0.0


def test_busy_rate_between_two_statuses_by_hand():
    assert busy_rate(None, (10.0, 4.0), None) is None                # one status: no rate yet
    assert busy_rate((10.0, 4.0), (14.0, 7.0), None) == 0.75         # 3 busy seconds of 4
    assert busy_rate((14.0, 7.0), (14.0, 7.0), 0.75) == 0.75         # no newer status: the last rate
    assert busy_rate((14.0, 7.0), (16.0, 12.0), 0.75) == 1.0         # a lump of busy seconds: at most 1
