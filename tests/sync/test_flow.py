"""The control channel's flow rule (grpo.sync.flow: the gap floor), with numbers worked by hand; the
budget itself is grpo.rules.staleness's (tests/rules/test_staleness_rules.py)."""
from __future__ import annotations

from grpo.sync.flow import gap_floor, overdue, received_among


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



def test_received_among_by_hand():
    # received 7 of a process, the newest numbered 9; the request said sent 8: group 9 was handed
    # after it was written, so 6 of the first 8 have come (2 are in flight, or lost)
    assert received_among(7, 9, 8) == 6
    # sent 9 or more: all 7; not numbered (last 0): all, as before numbering; sent -1: all
    assert received_among(7, 9, 9) == received_among(7, 9, 12) == received_among(7, 0, 3) == received_among(7, 9, -1) == 7
    # a request written before any of them was handed: none
    assert received_among(2, 9, 0) == 0


def test_a_group_that_overtakes_its_request_is_not_kept_as_lost():
    """The data and sync sockets race. Sampler hands 6 groups, all received; it writes a request
    saying sent 6, then hands group 7, which reaches the learner before the request is answered.
    Counted by all it received (7), the gap is -1 and the floor keeps it: from then on one group
    is always 'in flight' that never comes. Counted by seq, only those the request says."""
    # by all received: the dip becomes the floor, and a later exact count looks like one in flight
    in_flight, floor = gap_floor(0, 6, 7)
    assert (in_flight, floor) == (0, -1) and gap_floor(floor, 7, 7) == (1, -1)
    # by seq: received among the first 6 is 6, the gap 0, and the next request sees nothing in flight
    in_flight, floor = gap_floor(0, 6, received_among(7, 7, 6))
    assert (in_flight, floor) == (0, 0) and gap_floor(floor, 7, received_among(7, 7, 7)) == (0, 0)


def test_overdue_by_hand():
    # 1 in flight, received 7 = seen 7 since t = 100, after 60 s, the learner waiting since 90
    assert overdue(1, 7, 7, 100.0, 130.0, 60.0, 90.0) == (False, 100.0)
    assert overdue(1, 7, 7, 100.0, 161.0, 60.0, 90.0) == (True, 161.0)
    # the learner training (reading nothing), or waiting only since 150: not overdue yet
    assert overdue(1, 7, 7, 100.0, 161.0, 60.0, None) == (False, 100.0)
    assert overdue(1, 7, 7, 100.0, 161.0, 60.0, 150.0) == (False, 100.0)
    # progress restarts the clock: a new arrival, or nothing in flight
    assert overdue(1, 8, 7, 100.0, 161.0, 60.0, 90.0) == (False, 161.0)
    assert overdue(0, 7, 7, 100.0, 161.0, 60.0, 90.0) == (False, 161.0)
