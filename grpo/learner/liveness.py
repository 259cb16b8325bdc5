"""Which samplers are alive, as the learner sees them (heartbeats), and who may speak for which id.

Samplers send a status message every --heartbeat-interval-s from a thread of their own
(grpo/sampler/heartbeat.py), and every group, status or weights request counts as a sign of life.
A sampler silent for longer than --heartbeat-timeout-s is *gone*: logged once, and no
longer waited for (final status at shutdown). When it speaks again it is welcomed back
(logged). A final status means the sampler left on purpose: it is not waited for either.

Both tables are bounded: sampler ids must be below --max-samplers, and the sync port
remembers a bounded number of connections, so a peer making up ids cannot grow memory.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)


class Liveness:
    """Per-sampler last-seen times. Thread-safe: the data loop and the weight-sync thread both report."""

    def __init__(self, timeout_s: float, max_samplers: int, clock: Callable[[], float] = time.monotonic):
        self.timeout_s, self.max_samplers, self.clock = timeout_s, max_samplers, clock
        self.last_seen: dict[int, float] = {}
        self.gone: set[int] = set()
        self.finished: set[int] = set()
        self.events: collections.Counter[str] = collections.Counter()  # gone, back
        self._lock = threading.Lock()

    def valid_id(self, sampler_id: int) -> bool:
        return 0 <= sampler_id < self.max_samplers

    def seen(self, sampler_id: int, final: bool | None = False) -> bool:
        """Record a sign of life; False (and nothing recorded) for an id out of range.

        final: True for a final status; False for any other data message, which from a finished
        id means a new process under it (a restart); None for a request on the sync port, which
        says nothing of that: a sampler's last request can reach the learner's sync thread after
        its final status reached the data thread (a stop the learner sent unasked crossed it)."""
        if not self.valid_id(sampler_id):
            return False
        now = self.clock()
        with self._lock:
            if sampler_id in self.gone:
                self.gone.discard(sampler_id)
                self.events["back"] += 1
                log.warning("sampler %d is back after %.0f s of silence", sampler_id,
                            now - self.last_seen.get(sampler_id, now))
            self.last_seen[sampler_id] = now
            if final:
                self.finished.add(sampler_id)
            elif final is not None:
                self.finished.discard(sampler_id)  # a restart under the same id
        return True

    def check(self) -> list[int]:
        """Mark samplers silent for longer than the timeout as gone; returns the newly gone ones."""
        now = self.clock()
        newly = []
        with self._lock:
            for sid, t in self.last_seen.items():
                if sid not in self.gone and sid not in self.finished and now - t > self.timeout_s:
                    self.gone.add(sid)
                    newly.append(sid)
        for sid in newly:
            self.events["gone"] += 1
            log.warning("sampler %d silent for %.0f s (> --heartbeat-timeout-s %.0f): counted as gone, "
                        "not waited for", sid, now - self.last_seen[sid], self.timeout_s)
        return newly

    def alive(self) -> set[int]:
        """Samplers that spoke within the timeout and have not sent a final status."""
        self.check()
        with self._lock:
            return set(self.last_seen) - self.gone - self.finished

    def count_alive(self) -> int:
        """Samplers heard from and not gone or finished, without judging silence now (any thread)."""
        with self._lock:
            return len(set(self.last_seen) - self.gone - self.finished)

    def snapshot(self) -> dict:
        now = self.clock()
        with self._lock:
            return {"alive": sorted(set(self.last_seen) - self.gone - self.finished), "gone": sorted(self.gone),
                    "finished": sorted(self.finished),
                    "silent_s": {sid: round(now - t, 1) for sid, t in sorted(self.last_seen.items())},
                    "times_gone": self.events["gone"], "times_back": self.events["back"]}


class SyncPeers:
    """Binds each sync connection (its ROUTER identity) to the sampler id it first used.

    A weights_request naming another id on the same connection is refused, so one peer
    cannot speak for (or keep alive) other samplers; the table keeps the newest
    `max_peers` connections (a restarted sampler connects anew; the old entry ages out).
    """

    def __init__(self, liveness: Liveness, max_peers: int):
        self.liveness, self.max_peers = liveness, max_peers
        self._ids: collections.OrderedDict[bytes, int] = collections.OrderedDict()

    def bound(self, identity: bytes) -> int | None:
        """The sampler id this connection first spoke for, if any."""
        return self._ids.get(identity)

    def accept(self, identity: bytes, sampler_id: int) -> str | None:
        """None if the request may be answered, else the reason to refuse it."""
        if not self.liveness.valid_id(sampler_id):
            return "bad_sampler_id"
        first = self._ids.get(identity)
        if first is None:
            self._ids[identity] = sampler_id
            while len(self._ids) > self.max_peers:
                self._ids.popitem(last=False)
        elif first != sampler_id:
            return "sampler_id_mismatch"
        else:
            self._ids.move_to_end(identity)
        self.liveness.seen(sampler_id, final=None)
        return None
