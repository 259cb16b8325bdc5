"""Sampler side of liveness and backpressure.

Heartbeat: a thread with its own PUSH socket sends a status every --heartbeat-interval-s,
so the learner hears from a sampler even while it generates a long round or waits at the
high-water mark (its own pipe is fair-queued with the groups', never stuck behind them).

send_group: what a sampler does when the data socket is at its high-water mark
(--on-full): 'block' waits (logging) up to --send-timeout-s, then drops the group;
'drop' drops it at once. Either way a dropped group is counted (stats dropped_full /
dropped_send_timeout, owned here) and still counts as offered (groups_sent), so the learner's
books include it. Memory stays bounded: at most send_hwm groups wait in the socket.

Statuses: the sampler's status messages, the heartbeat's and the loop's, from one snapshot of its
counters each.

SyncInbox: the sampler's sync socket, so that the learner's stop reaches a sampler in the
middle of a round (see SyncInbox).
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable

from grpo.sampler.counters import SamplerCounters
from grpo.wire import messages as M
from grpo.wire.transport import Sender

log = logging.getLogger(__name__)

ON_FULL = ("block", "drop")


class Heartbeat:
    def __init__(self, sender: Sender, interval_s: float, status: Callable[[], M.SamplerStatus]):
        self.sender, self.interval_s, self.status = sender, interval_s, status
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def start(self) -> "Heartbeat":
        if self.interval_s > 0:
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            # Never blocks: a heartbeat that cannot leave now is stale by the next one anyway.
            if self.sender.send(self.status(), timeout_s=0):
                self.sent += 1

    def stop(self) -> None:
        """Stop sending (before the final status, so no heartbeat follows it from this side)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.sender.close(linger_s=0)


class Statuses:
    """This sampler's statuses: statuses(final) is a SamplerStatus of its counters at one instant
    (SamplerCounters.read, safe from the heartbeat thread) and the version `version()` says."""

    def __init__(self, sampler_id: int, incarnation: int, counters: SamplerCounters, version: Callable[[], int]):
        self.sampler_id, self.incarnation, self.counters, self.version = sampler_id, incarnation, counters, version
        self.t_started = time.perf_counter()   # the clock of its statuses (clock_s)

    def __call__(self, final: bool) -> M.SamplerStatus:
        version = self.version()
        groups_sent, stats = self.counters.read()
        return M.SamplerStatus(sampler_id=self.sampler_id, policy_version=version, groups_sent=groups_sent,
                               final=final,
                               # clock_s: this sampler's own seconds, so the learner can turn its busy
                               # seconds into a rate between two statuses (grpo.stats.busy_rate)
                               stats={**stats, "clock_s": time.perf_counter() - self.t_started},
                               incarnation=self.incarnation)


class SyncInbox:
    """The sampler's sync socket, used from the main thread only (a ZeroMQ socket is not thread-safe).

    Weight requests send and receive through it (it has the client's send/receive). When the
    learner finishes it sends `stop` unprompted (request_id -1) to every sampler it has answered;
    `stopped()`, called between decode chunks, reads what has arrived without waiting (at most
    every `every_s`), so a sampler in the middle of a long round learns of the stop at once.
    Answers it reads on the way are kept, in order, for the next receive (at most `keep`: the
    protocol lets answers be lost, and a sampler asks again next round).
    """

    def __init__(self, client, every_s: float = 0.1, keep: int = 8):
        self.client, self.every_s = client, every_s
        self.stop: M.Stop | None = None
        self._kept: collections.deque[M.Message] = collections.deque(maxlen=keep)
        self._next = 0.0

    def send(self, msg: M.Message, timeout_s: float | None = None) -> bool:
        return self.client.send(msg, timeout_s)

    def receive(self, timeout_s: float) -> M.Message | None:
        if self._kept:
            return self._kept.popleft()
        return self.client.receive(timeout_s)

    def stopped(self) -> bool:
        """Whether the learner has said stop (reads the socket without waiting, rate-limited)."""
        if self.stop is not None:
            return True
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + self.every_s
        for _ in range(64):   # bounded: a flood of answers cannot hold up generation
            if not self.client.poll(0):
                break
            msg = self.client.receive(0)
            if msg is None:
                continue   # refused by the codec (counted and logged there)
            self._kept.append(msg)   # request_weights still sees every answer, the stop included
            if isinstance(msg, M.Stop):
                self.stop = msg
                return True
        return False

    def peek(self) -> list[M.Message]:
        """The answers read so far and kept for the next receive, oldest first (reads what has
        arrived, as `stopped()` does and rate-limited like it; takes nothing away)."""
        self.stopped()
        return list(self._kept)

    def close(self) -> None:
        self.client.close()


def hand_group(sender: Sender, group: M.Group, on_full: str, timeout_s: float, counters: SamplerCounters,
               where: str) -> bool:
    """Offer one group to the data socket under the --on-full policy (send_group), numbered as handed
    (Group.seq): a group dropped here takes no number, so the learner sees 1, 2, 3... and can tell
    the groups a weights request's `sent` counts from those handed after it."""
    group.seq = counters.handed() + 1
    counters.add(groups_offered=1)  # offered: a group dropped at the HWM is counted too
    return send_group(sender, group, on_full, timeout_s, counters, where, f"group {counters.groups_sent}")


def send_group(sender: Sender, msg: M.Message, on_full: str, timeout_s: float, counters: SamplerCounters,
               where: str, what: str = "group") -> bool:
    """Send one group under the --on-full policy; False when it was dropped (and counted in `counters`)."""
    if on_full == "drop":
        if sender.send(msg, timeout_s=0):
            return True
        counters.add(dropped_full=1)
        n = int(counters.dropped_full)
        if n == 1 or (n <= 100 and n % 10 == 0) or n % 1000 == 0:  # a dead learner must not flood the log
            log.warning("data queue full (learner slow or absent at %s): dropped %d groups so far "
                        "(--on-full drop)", where, n)
        return False
    step = min(5.0, timeout_s) if timeout_s > 0 else 5.0  # wake every 5 s to log the wait
    t0 = time.monotonic()
    while not sender.send(msg, timeout_s=step):
        waited = time.monotonic() - t0
        if timeout_s > 0 and waited >= timeout_s:
            counters.add(dropped_send_timeout=1)
            log.warning("data queue full for %.0f s (> --send-timeout-s): dropped %s (%d so far)",
                        waited, what, int(counters.dropped_send_timeout))
            return False
        log.info("data queue full for %.0f s (learner slow or not up at %s); waiting to send %s",
                 waited, where, what)
    return True


def wait_send(sender: Sender, msg: M.Message, timeout_s: float, where: str) -> bool:
    """A status message: waits like 'block', at most timeout_s, never dropped silently."""
    ok = send_group(sender, msg, "block", timeout_s, SamplerCounters(), where, "a status")   # counted nowhere
    if not ok:
        log.warning("could not send a status to the learner at %s within %.0f s", where, timeout_s)
    return ok

