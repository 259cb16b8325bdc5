"""The control channel's flow rules (grpo.sync.flow), with numbers worked by hand."""
from __future__ import annotations

from grpo.sync.flow import gap_floor, generation_budget, groups_ahead


def test_generation_budget_by_hand():
    # staleness 4, 2 groups a step, nothing queued, sampler current: (4 + 1) * 2 = 10 groups
    assert generation_budget(version=7, sampler_version=7, queued=0, groups_per_step=2, max_staleness=4) == 10
    # 6 queued ahead: positions 6..9 are still trained by version 7 + 4 = 11
    assert generation_budget(7, 7, 6, 2, 4) == 4
    # the sampler's weights are 3 versions old: only (4 - 3 + 1) * 2 - 0 = 4 positions are safe
    assert generation_budget(7, 4, 0, 2, 4) == 4
    assert generation_budget(7, 2, 0, 2, 4) == 0          # 5 behind: nothing it makes now can be trained
    assert generation_budget(7, 7, 11, 2, 4) == 0         # more queued than it can ever train in time
    assert generation_budget(7, 7, 0, 2, 4, samplers=3) == 3   # 10 shared by three samplers
    # staleness 0: only the next step's batch, and a step in progress (2 ahead) leaves no room
    assert generation_budget(0, 0, 0, 2, 0) == 2 and generation_budget(0, 0, 2, 2, 0) == 0


def test_gap_floor_by_hand():
    # first request on a connection: sent 40, received 10, so a gap of 30 and no floor yet; the
    # first gap is the floor (taken as lost with an earlier learner), so nothing is in flight
    assert gap_floor(None, 40, 10) == (0, 30)
    # sent 42, received still 10: gap 32 over the floor 30, 2 groups in flight, floor stays 30
    assert gap_floor(30, 42, 10) == (2, 30)
    # those 2 arrived (received 12): gap 30 again, nothing in flight
    assert gap_floor(30, 42, 12) == (0, 30)
    # a smaller gap than ever (sent 45, received 20: 25) lowers the floor: in flight 0, floor 25
    assert gap_floor(30, 45, 20) == (0, 25)
    # a fresh learner and sampler: sent 3, received 3, floor 0; then sent 5, received 3: 2 in flight
    assert gap_floor(None, 3, 3) == (0, 0) and gap_floor(0, 5, 3) == (2, 0)
    # sent -1 (the sampler did not say): nothing in flight, floor untouched (None stays None)
    assert gap_floor(30, -1, 10) == (0, 30) and gap_floor(None, -1, 10) == (0, None)


def test_groups_ahead_by_hand():
    # 1 queued, 2 of this sampler in flight, 2 taken for the step being collected: 5 ahead
    assert groups_ahead(1, 2, 2) == 5
    assert groups_ahead(0, 0, 0) == 0
