"""The control channel's flow rule (grpo.sync.flow: the gap floor), with numbers worked by hand; the
budget itself is grpo.rules.staleness's (tests/rules/test_staleness_rules.py)."""
from __future__ import annotations

from grpo.sync.flow import gap_floor


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

