"""Sampler side of liveness and backpressure.

Heartbeat: a thread with its own PUSH socket sends a status every --heartbeat-interval-s,
so the learner hears from a sampler even while it generates a long round or waits at the
high-water mark (its own pipe is fair-queued with the groups', never stuck behind them).

send_group: what a sampler does when the data socket is at its high-water mark
(--on-full): 'block' waits (logging) up to --send-timeout-s, then drops the group;
'drop' drops it at once. Either way a dropped group is counted (stats dropped_full /
dropped_send_timeout) and still counts as offered (groups_sent), so the learner's books
include it. Memory stays bounded: at most send_hwm groups wait in the socket.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

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


def send_group(sender: Sender, msg: M.Message, on_full: str, timeout_s: float, stats: dict,
               where: str, what: str = "group") -> bool:
    """Send one group under the --on-full policy; False when it was dropped (and counted)."""
    if on_full == "drop":
        if sender.send(msg, timeout_s=0):
            return True
        stats["dropped_full"] = stats.get("dropped_full", 0.0) + 1
        n = int(stats["dropped_full"])
        if n == 1 or (n <= 100 and n % 10 == 0) or n % 1000 == 0:  # a dead learner must not flood the log
            log.warning("data queue full (learner slow or absent at %s): dropped %d groups so far "
                        "(--on-full drop)", where, int(stats["dropped_full"]))
        return False
    step = min(5.0, timeout_s) if timeout_s > 0 else 5.0  # wake every 5 s to log the wait
    t0 = time.monotonic()
    while not sender.send(msg, timeout_s=step):
        waited = time.monotonic() - t0
        if timeout_s > 0 and waited >= timeout_s:
            stats["dropped_send_timeout"] = stats.get("dropped_send_timeout", 0.0) + 1
            log.warning("data queue full for %.0f s (> --send-timeout-s): dropped %s (%d so far)",
                        waited, what, int(stats["dropped_send_timeout"]))
            return False
        log.info("data queue full for %.0f s (learner slow or not up at %s); waiting to send %s",
                 waited, where, what)
    return True


def wait_send(sender: Sender, msg: M.Message, timeout_s: float, where: str) -> bool:
    """A status message: waits like 'block', at most timeout_s, never dropped silently."""
    ok = send_group(sender, msg, "block", timeout_s, {}, where, "a status")
    if not ok:
        log.warning("could not send a status to the learner at %s within %.0f s", where, timeout_s)
    return ok

