"""Learner rank 0's side of the data channel: what arrived, what waits, what was dropped and why.

The intake reads groups and sampler statuses off the data channel (a transport Receiver), keeps received groups in a
bounded FIFO (`--buffer-size`: when full the oldest, i.e. stalest, goes), records every group
and status in the books, and hands the learner a step's worth of groups it may train on at
its current version (`drop_reason`). Its counts (received, trained, dropped_<reason>) and the
books give the end-of-run accounting: sent = trained + dropped + queued.
"""
from __future__ import annotations

import collections
import logging
import math
import time
from collections.abc import Callable

from grpo.config import LearnerConfig
from grpo.learner.accounting import Books, MessageLedger
from grpo.learner.liveness import Liveness
from grpo.loss import has_signal
from grpo.rules.staleness import Staleness
from grpo.wire import messages as M
from grpo.wire.transport import Receiver

log = logging.getLogger(__name__)

MAX_PROCESSES = 4096   # sampler processes whose arrivals are kept for the budget (the newest this many)


def drop_reason(g: M.Group, version: int, max_staleness: int, filter_zero_signal: bool,
                needs_ref: bool = False) -> str | None:
    """Why a received group must not be trained on at learner `version` (None: train on it)."""
    if reason := Staleness(max_staleness).drop_reason(g.policy_version, version):
        return reason   # future_version, stale
    if len(g.prefix_token_ids) == 0:
        return "empty_prompt"
    if needs_ref and any(len(c.ref_policy_log_probs) != len(c.generated_token_ids) for c in g.completions):
        return "missing_ref"   # the KL term needs them (beta > 0) and the sampler sent none
    if filter_zero_signal and not has_signal([c.reward for c in g.completions]):
        # Every advantage is 0 and the group only adds KL; the next group from the queue
        # takes its place.
        return "zero_signal"
    return None


class Intake:
    """Rank 0's receive side. Every method takes the learner's current policy `version`: the
    books record when things arrived, and staleness is judged against it."""

    def __init__(self, cfg: LearnerConfig, receiver: Receiver, liveness: Liveness, books: Books,
                 messages: MessageLedger, fingerprints=None):
        self.cfg, self.receiver, self.liveness, self.books = cfg, receiver, liveness, books
        self.messages = messages
        self.fingerprints = fingerprints   # --verify-weight-sync: checks what samplers report
        self.queue: collections.deque[M.Group] = collections.deque()
        self.counts = collections.Counter()   # received, trained, dropped_<reason>
        self.ages = collections.Counter()     # groups judged for training, by age (version - theirs)
        # A resumed learner starts at start_version; groups made from older weights (a sampler's round
        # 0, generated before the learner's first answer) are judged, but counted apart: they say
        # nothing of the bound a run needs (staleness_advice reads `ages` only).
        self.start_version = 0
        self.ages_before_start = collections.Counter()
        # Groups that reached us per sampler process (sampler id, incarnation), valid or rejected, as
        # (count, newest Group.seq): the publisher's budget reads it (arrived), from its own thread;
        # each entry is replaced whole, so that thread reads one consistent pair.
        self.arrivals: collections.OrderedDict[tuple[int, int], tuple[int, int]] = collections.OrderedDict()
        # Groups taken off the queue for the step being collected or trained (the learner sets it
        # back to 0 once that step is done): ahead of anything queued, for the budget.
        self.taken = 0
        # Since when collect() waits for data (time.monotonic; None while not collecting): the
        # publisher's budget counts groups never come only while the learner waits (flow.overdue).
        self.waiting_since: float | None = None
        receiver.on_reject = self._rejected

    def _rejected(self, exc: M.ProtocolError, _peer: bytes | None) -> None:
        """A message the codec refused: in the message ledger always; in the group books only
        when its valid header names a sampler process's group (see grpo.learner.accounting)."""
        o = exc.origin
        named = o is not None and self.liveness.valid_id(o.sampler_id)
        if named and o.kind == "group":
            self.books.rejected(o.sampler_id, o.incarnation)
            self._note_arrival(o.sampler_id, o.incarnation, o.seq)
        self.messages.reject("data", exc.reason, (o.sampler_id, o.incarnation) if named else None)

    def _note_arrival(self, sampler_id: int, incarnation: int, seq: int) -> None:
        key = (sampler_id, incarnation)
        count, last = self.arrivals.get(key, (0, 0))
        self.arrivals[key] = (count + 1, max(last, seq))
        self.arrivals.move_to_end(key)
        while len(self.arrivals) > MAX_PROCESSES:   # bounded: restarts, or made-up incarnations, cannot grow it
            self.arrivals.popitem(last=False)

    def arrived(self, sampler_id: int, incarnation: int) -> tuple[int, int]:
        """Sampler process (sampler_id, incarnation)'s groups that reached us, and the newest one's
        Group.seq (0: none numbered), read as one pair (the publisher's thread reads it)."""
        return self.arrivals.get((sampler_id, incarnation), (0, 0))

    def take(self, msg: M.Message | None, version: int) -> None:
        if isinstance(msg, (M.Group, M.SamplerStatus)) and not self.liveness.valid_id(msg.sampler_id):
            self.messages.reject("data", "bad_sampler_id")  # beyond --max-samplers: not in anyone's books
        elif isinstance(msg, M.Group):
            self.liveness.seen(msg.sampler_id)
            self.counts["received"] += 1
            self._note_arrival(msg.sampler_id, msg.incarnation, msg.seq)
            self.books.group(msg, version)
            if (len(msg.prefix_token_ids) > self.cfg.faults.max_prompt_tokens
                    or max(len(c.generated_token_ids) for c in msg.completions) > self.cfg.rollout.max_new_tokens):
                self.counts["dropped_too_long"] += 1  # valid on the wire, but not ours to train on
                return
            if len(self.queue) >= self.cfg.faults.buffer_size > 0:
                self.queue.popleft()  # FIFO: the oldest is the stalest
                self.counts["dropped_buffer_full"] += 1
            self.queue.append(msg)
        elif isinstance(msg, M.SamplerStatus):
            # A heartbeat may overtake the final status (its own socket): the books keep the
            # final one, and liveness asks them, so a finished process stays finished.
            self.liveness.seen(msg.sampler_id, final=self.books.status(msg, version))
            if self.fingerprints is not None:
                self.fingerprints.check(msg.sampler_id, msg.stats)
        elif msg is not None:
            self.messages.reject("data", "unexpected_kind")   # valid, but no kind a sampler sends here

    def _fresh(self, g: M.Group, version: int) -> bool:
        reason = drop_reason(g, version, self.cfg.training.max_staleness, self.cfg.loss.filter_zero_signal,
                             self.cfg.loss.beta > 0)
        if version >= g.policy_version:
            ages = self.ages if g.policy_version >= self.start_version else self.ages_before_start
            ages[version - g.policy_version] += 1
        if reason:
            self.counts["dropped_" + reason] += 1
        return reason is None

    def collect(self, n: int, version: int, within_s: float | None = None,
                stop: Callable[[], bool] | None = None) -> list[M.Group] | None:
        """`n` groups the learner may train on at `version`, waiting as long as it takes (a note
        in the log every --data-timeout-s, naming the samplers alive and gone), or at most
        `within_s` seconds (what is left of --max-time-s), or until `stop()` says a stop was asked
        for (Ctrl+C, SIGTERM: grpo.learner.stop; looked at every half second at most): then None,
        and the groups taken so far go back to the front of the queue, where the books count them
        as queued."""
        groups: list[M.Group] = []
        self.waiting_since = waited_since = time.monotonic()
        try:
            return self._collect(groups, n, version, waited_since, within_s, stop)
        finally:
            self.waiting_since = None

    def _collect(self, groups: list[M.Group], n: int, version: int, waited_since: float, within_s: float | None,
                 stop: Callable[[], bool] | None) -> list[M.Group] | None:
        next_note = waited_since + self.cfg.faults.data_timeout_s
        deadline = math.inf if within_s is None else waited_since + max(within_s, 0.0)
        while len(groups) < n:
            stopped = stop is not None and stop()
            if stopped or time.monotonic() >= deadline:
                self.queue.extendleft(reversed(groups))
                self.taken -= len(groups)
                log.info("%s while waiting for data (had %d of %d groups for step %d%s)",
                         "stop asked for" if stopped else "--max-time-s reached", len(groups), n, version + 1,
                         "; that step is abandoned, its groups stay queued" if stopped else "")
                return None
            while self.queue and len(groups) < n:
                self.taken += 1   # before it leaves the queue: the publisher's budget never misses it
                g = self.queue.popleft()
                if self._fresh(g, version):
                    groups.append(g)
                else:
                    self.taken -= 1
            if len(groups) >= n:
                break
            self.take(self.receiver.receive(timeout_s=0.5), version)
            if not self.receiver.poll(0):  # judge silence only once what arrived is read
                self.liveness.check()
            now = time.monotonic()
            if now >= next_note:
                live = self.liveness.snapshot()
                log.info("no data for %.0f s (have %d of %d groups for step %d); samplers alive %s, gone %s",
                         now - waited_since, len(groups), n, version + 1,
                         live["alive"] or "none", live["gone"] or "none")
                next_note = now + self.cfg.faults.data_timeout_s
        self.drain(version)
        return groups

    def drain(self, version: int) -> None:
        # Take what else already arrived without waiting, so the queue counts (and last-seen
        # times) are current; bounded, so a peer that never stops sending cannot stall us.
        for _ in range(1000):
            if not self.receiver.poll(0):
                break
            self.take(self.receiver.receive(timeout_s=0), version)

    def alive(self, version: int) -> set[int]:
        self.drain(version)  # a training step may have kept us from reading heartbeats that did arrive
        return self.liveness.alive()

    def wait_for_finals(self, timeout_s: float, version: int) -> None:
        """At shutdown: read until every sampler still alive has sent its final status. Only
        live ones are waited for: a killed or made-up one drops out of alive() after
        --heartbeat-timeout-s."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and (self.alive(version) or not self.books.entries):
            self.take(self.receiver.receive(timeout_s=0.2), version)

    def accounting(self) -> dict:
        """The group ledger: sent (by the samplers' own counts) against trained, dropped by reason
        and queued, and whether they balance. Rejected messages are in the message ledger."""
        dropped = {k[len("dropped_"):]: v for k, v in self.counts.items() if k.startswith("dropped_")}
        sent, by_samplers = self.books.totals()
        for reason, n in by_samplers.items():
            dropped[reason] = dropped.get(reason, 0) + n
        queued = len(self.queue)
        return {"received": self.counts["received"], "trained": self.counts["trained"],
                "dropped": dropped, "queued": queued, "sent": sent,
                "balanced": sent == self.counts["trained"] + sum(dropped.values()) + queued}
