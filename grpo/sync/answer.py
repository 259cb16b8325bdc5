"""Learner side of the control channel: what every answer on the sync port carries besides its
kind's own fields (the weights, no_update, stop).

  run      the run's facts (grpo.wire.messages.RunFacts), in the first answer to each connection
           and in any answer to have_version -1, so a sampler checks it agrees before it sends
  levels   --curriculum: every task's current level, in every answer (a stop included)
  queued, budget
           the learner's queue and how many groups this sampler may generate now (grpo.rules.staleness:
           none certain to go stale, none past what the steps left to --max-steps, or the time left
           to --max-time-s, train), in every answer but a stop; -1 each when the learner gave no
           queue view
  counted  the newest of the asking process's groups (Group.seq) the budget accounts for: the
           request's `sent`, or later where groups handed after the request had already arrived

The publisher's serving thread (grpo.weights.publisher) owns the socket and calls `fields` for
every answer; this object holds the learner's side of the state those rules need.
"""
from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass
from typing import Callable

from grpo.sync.flow import gap_floor, overdue, received_among
from grpo.rules.staleness import Staleness
from grpo.wire import messages as M

MAX_CONNECTIONS = 4096   # per-connection state (the gap floor) kept for the newest this many connections
LOST_AFTER_S = 60.0      # groups counted in flight this long with nothing arriving are counted lost (flow.overdue;
                         # the learner gives its --data-timeout-s)

log = logging.getLogger(__name__)


@dataclass
class QueueView:
    """What the publisher may read of the learner's intake, from its own thread."""
    queued: Callable[[], int]           # groups waiting to be trained
    arrived: Callable[[int, int], tuple[int, int]]   # (sampler id, incarnation) -> that process's groups
                                        # received (valid or rejected), and the newest one's Group.seq (0: none)
    samplers: Callable[[], int]         # samplers alive (at least 1)
    training: Callable[[], int] = lambda: 0   # groups taken for the step being collected or trained
    max_steps: int = 0                  # the learner's --max-steps: its last version (0: none known)
    time_steps_left: Callable[[], int] = lambda: -1   # steps --max-time-s leaves time for (-1: not known)
    waiting_since: Callable[[], float | None] = lambda: None   # since when the learner waits for data
                                        # (time.monotonic; None: it is not waiting)


class SyncAnswer:
    """The control fields of the learner's answers (see the module's docstring).

    Set by the learner, read on the publisher's thread: `levels` is replaced whole (never
    mutated) by the learner's thread, so that thread reads one consistent map; `queue_view`'s
    callables only read (a length, a dict lookup).
    """

    def __init__(self, run: M.RunFacts | None = None, lost_after_s: float = LOST_AFTER_S,
                 clock: Callable[[], float] = time.monotonic):
        self.run_facts = run
        self.levels: dict[str, int] | None = None
        self.queue_view: QueueView | None = None
        self.lost_after_s, self.clock = lost_after_s, clock
        # per connection: (gap floor, groups received at the last progress, its time) (flow.gap_floor, flow.overdue)
        self._flight: collections.OrderedDict[bytes, tuple[int | None, int, float]] = collections.OrderedDict()

    def fields(self, identity: bytes, msg: M.WeightsRequest, first: bool, version: int, fresh: bool,
               stopping: bool) -> dict:
        """The control fields of the answer to `msg` on connection `identity`.

        first: this connection was never answered before; version: the newest published (0 when
        none); fresh: the answer carries that version's weights; stopping: the answer is a stop
        (which carries the facts and levels only)."""
        out = {"run": self.facts_for(first, msg), "levels": self.levels}
        if not stopping:
            out["queued"], out["budget"], counted = self.budget(identity, msg, version if fresh else msg.have_version,
                                                                version)
            if counted >= 0:
                out["counted"] = counted
        return out

    def unsolicited_stop(self) -> dict:
        """The control fields of the stop the publisher sends unprompted at the end."""
        return {"levels": self.levels}

    def facts_for(self, first: bool, msg: M.WeightsRequest) -> M.RunFacts | None:
        """The run's facts for the first answer to each connection, and to any have_version -1."""
        if self.run_facts is None:
            return None
        return self.run_facts if (first or msg.have_version < 0) else None

    def budget(self, identity: bytes, msg: M.WeightsRequest, sampler_version: int,
               version: int) -> tuple[int, int, int]:
        """(queued, budget, counted) for this answer; -1 each when the learner did not give its queue
        (counted: also when the request did not say `sent`).

        sampler_version: the version the sampler will run once it has this answer."""
        view, run = self.queue_view, self.run_facts
        if view is None or run is None or not run.groups_per_step:
            return -1, -1, -1
        # The process's arrivals first, the queue after: a group that arrives in between is counted
        # twice for this answer (on its way, and queued), never not at all; and every group up to
        # `newest` is in the queue's count (queued, taken, trained or dropped), so the sampler takes
        # off only those it handed after max(sent, newest): `counted`.
        count, newest = view.arrived(msg.sampler_id, msg.incarnation) if msg.sent >= 0 else (0, 0)
        queued = view.queued()
        in_flight, counted = 0, -1
        if msg.sent >= 0:
            counted = max(msg.sent, newest)
            floor, seen, since = self._flight.get(identity, (None, -1, 0.0))
            received, now = received_among(count, newest, msg.sent), self.clock()
            in_flight, floor = gap_floor(floor, msg.sent, received)
            late, since = overdue(in_flight, received, seen, since, now, self.lost_after_s, view.waiting_since())
            if late:
                log.warning("%d group(s) of sampler %d counted on their way have not come in %.0f s of the learner "
                            "waiting for data: counted as lost, so that its budget stops waiting for them", in_flight,
                            msg.sampler_id, self.lost_after_s)
                floor, in_flight = floor + in_flight, 0
            self._flight[identity] = (floor, received, since)
            self._flight.move_to_end(identity)
            while len(self._flight) > MAX_CONNECTIONS:   # bounded: made-up connections cannot grow it
                self._flight.popitem(last=False)
        # `version` is the newest published: the learner's steps done, so max_steps - version are left;
        # under --max-time-s, at most the steps its time left allows (the fewer of the two ends)
        steps_left = max(0, view.max_steps - version) if view.max_steps > 0 else -1
        by_time = view.time_steps_left()
        if by_time >= 0:
            steps_left = by_time if steps_left < 0 else min(steps_left, by_time)
        return queued, Staleness.of(run).budget(version, sampler_version, queued, in_flight, view.training(),
                                                view.samplers(), steps_left), counted
