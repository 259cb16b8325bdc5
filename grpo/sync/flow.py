"""Flow control on the sync channel: pure rules, no I/O and no state (the caller keeps it).

Each answer to a sampler says how many groups it may generate now (`budget`, the rule of
grpo.rules.staleness), so that it never makes a group that is certain to be dropped as stale. The
publisher's thread computes it from what the learner lets it read of its queue
(grpo.sync.answer.QueueView) and from how many of this sampler's groups are still on their way,
which this module estimates.
"""
from __future__ import annotations


def gap_floor(prev_floor: int | None, sent: int, received: int) -> tuple[int, int | None]:
    """(in_flight, new_floor): how many of a sampler's groups are still on their way to the learner.

    `sent`: the groups the sampler says it has handed to its data socket (-1: it did not say);
    `received`: the groups of that sampler id the learner has received (valid or rejected).
    The gap sent - received is the groups not yet arrived, but it also holds groups that will
    never arrive (lost with an earlier learner process, whose counts this one never had), and
    that part never shrinks. So the smallest gap seen on the connection so far (the floor) is
    taken as lost, and only the excess over it as in flight:

        gap = sent - received;  new_floor = min(prev_floor, gap) (gap itself when there was none);
        in_flight = gap - new_floor

    A request that does not say `sent` counts nothing in flight and leaves the floor as it was.
    """
    if sent < 0:
        return 0, prev_floor
    gap = sent - received
    floor = gap if prev_floor is None else min(prev_floor, gap)
    return gap - floor, floor

