"""Flow control on the sync channel: pure rules, no I/O and no state (the caller keeps it).

Each answer to a sampler says how many groups it may generate now (`budget`), so that it never
makes a group that is certain to be dropped as stale. The publisher's thread computes it from
what the learner lets it read of its queue (grpo.sync.answer.QueueView) with these rules.
"""
from __future__ import annotations


def generation_budget(version: int, sampler_version: int, queued: int, groups_per_step: int, max_staleness: int,
                      samplers: int = 1) -> int:
    """How many groups one sampler may generate now with none of them certain to be dropped as stale.

    A group made from `sampler_version` joins the learner's queue behind `queued` groups; the
    learner, at `version`, trains `groups_per_step` per step, so the group at queue position p
    (0-based) is trained at version + p // groups_per_step and is stale once that is more than
    sampler_version + max_staleness. Positions p < (max_staleness - lag + 1) * groups_per_step are
    safe (lag = version - sampler_version): AReaL's bound of (staleness + 1) x batch rollouts in
    flight, less what is queued. Samplers on one port share it evenly.
    """
    lag = max(0, version - sampler_version)
    room = (max_staleness - lag + 1) * groups_per_step - queued
    return max(0, room) // max(1, samplers)


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


def groups_ahead(queued: int, in_flight: int, training: int) -> int:
    """The groups that will reach a learner step before a group this sampler makes now: those
    queued, those of this sampler still in flight (gap_floor), and those already taken for the
    step being collected or trained (they fill its batch before any queued group)."""
    return queued + in_flight + training
