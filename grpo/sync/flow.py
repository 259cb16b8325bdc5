"""Flow control on the sync channel: pure rules, no I/O and no state (the caller keeps it).

Each answer to a sampler says how many groups it may generate now (`budget`, the rule of
grpo.rules.staleness), so that it never makes a group that is certain to be dropped as stale. The
publisher's thread computes it from what the learner lets it read of its queue
(grpo.sync.answer.QueueView) and from how many of this sampler's groups are still on their way,
which this module estimates.
"""
from __future__ import annotations


def received_among(count: int, last_seq: int, sent: int) -> int:
    """How many of the first `sent` groups a sampler process handed the learner has received, from
    `count`, all it has received of that process, and `last_seq`, the newest one's Group.seq (0:
    its groups are not numbered).

    The data and sync sockets are two connections with no order between them: a group handed after
    a request was written (so not in its `sent`) may reach the learner before that request is
    answered. Counted as received, it would make the gap sent - received one too small, and
    gap_floor would keep that dip as lost for good: one group always in flight that never comes,
    and a budget of 0 once the steps left want exactly it. One process's groups arrive in the order
    they were handed, so those numbered past `sent` are the newest last_seq - sent received:

        received among the first sent = count - max(0, last_seq - sent)

    Received 7, the newest numbered 9, sent 8: 7 - 1 = 6. Numbered 8 or less: all 7. Not numbered
    (last_seq 0): all `count`, as before numbering.
    """
    return max(0, count - max(0, last_seq - sent)) if sent >= 0 else count


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



def overdue(in_flight: int, received: int, seen: int, since: float, now: float, after_s: float,
            waiting_since: float | None) -> tuple[bool, float]:
    """(whether the groups counted in flight are overdue, the new `since`). Groups on their way over
    one connection arrive within seconds of the learner reading its socket, so an estimate that stays
    above 0 while the learner waits for data and nothing of the process arrives has counted groups
    that will not come (lost in a way gap_floor could not see). Left in, they would hold the budget
    down for good, and at a run's last step hold it at 0: the sampler waits for room, the learner
    for data. So they are overdue once, for `after_s`, the count of the process's groups received
    (`received`, against `seen`, the count at the last progress, at time `since`) has not moved
    while `in_flight` > 0, and the learner has been waiting for data as long (`waiting_since`; None:
    it is training, reading nothing, and what it has not read is not overdue). The caller adds them
    to the floor (counts them lost); a group that does come later lowers the floor again by
    gap_floor's rule. Progress (nothing in flight, or a new arrival) restarts the clock:

        in flight 0, or received != seen: (False, now)
        else: late = now - since >= after_s and waiting_since is not None and now - waiting_since >= after_s
              (late, now if late else since)

    1 in flight, received 7 = seen 7 since t = 100, after_s 60, the learner waiting since 90: at 130,
    (False, 100); at 161, (True, 161); at 161 with the learner training (None), (False, 100).
    """
    if in_flight <= 0 or received != seen:
        return False, now
    late = now - since >= after_s and waiting_since is not None and now - waiting_since >= after_s
    return late, now if late else since
