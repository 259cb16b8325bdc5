"""The learner's two ledgers: groups per sampler process ("incarnation"), and messages.

Groups. The identity every run must close: sent = trained + dropped (by reason) + queued.
A group message that fails validation but whose valid header names a sampler process
(grpo.wire.messages.Origin) is charged to that process as dropped "rejected"; it was sent
and it arrived, so it is never also "lost_in_flight". Rejections that name a process the
learner has not heard from validly are held aside (bounded) until it does; junk that names
nobody stays out of the group books for good.

Messages. Every rejected message, by channel (data, sync), reason and peer (the sampler id
when the peer is a known sampler process or sync connection, else "unknown"): port scans,
corrupted statuses and made-up ids live only here, so they can never unbalance the groups.

A sampler's status says how many groups it has offered to its data socket (groups_sent,
including those it dropped itself at the high-water mark: stats dropped_full /
dropped_send_timeout). A restarted sampler (same --sampler-id) is a new incarnation whose
counts start at 0, so the books keep one entry per (sampler_id, incarnation).

For a process that ended without a final status (killed), its last status may be older
or newer than the groups that reached us: we take sent = max(last groups_sent, what we
received + what it dropped), and what it sent that never arrived is dropped as
"lost_in_flight" (groups that died in its socket buffer with it).

A learner resumed from a checkpoint restores the books as they were at that checkpoint
(dump/restore). What the killed learner had queued then died with it ("lost_in_learner_queue");
so did what it received after the checkpoint and what was in flight to it: "lost_with_learner"
(the samplers' final counts say they were sent; no learner that lived on saw them).
"""
from __future__ import annotations

import collections
import logging
import threading
from dataclasses import dataclass, field

from grpo.wire import messages as M

log = logging.getLogger(__name__)

# Groups a sampler counted as offered (groups_sent) but did not deliver, by its stats key.
SAMPLER_DROPS = {"dropped_full": "sampler_full", "dropped_send_timeout": "sampler_send_timeout",
                 "dropped_zero_signal": "sampler_zero_signal"}


@dataclass
class Incarnation:
    sampler_id: int
    incarnation: int
    joined_at_version: int  # learner version when we first heard from this process
    received: int = 0
    rejected: int = 0   # its group messages that failed validation (charged as dropped "rejected")
    first_group_version: int | None = None
    status: M.SamplerStatus | None = None
    order: int = field(default=0)

    @property
    def final(self) -> bool:
        return self.status is not None and self.status.final

    def sampler_dropped(self) -> dict[str, int]:
        stats = self.status.stats if self.status else {}
        return {reason: int(stats.get(key, 0)) for key, reason in SAMPLER_DROPS.items() if stats.get(key, 0)}

    def arrived(self) -> int:
        """Groups of this process accounted for here: valid, rejected, or dropped at its own socket."""
        return self.received + self.rejected + sum(self.sampler_dropped().values())

    def lost_with_learner(self, carried: bool) -> int:
        if not (carried and self.final):
            return 0
        return max(0, self.sent() - self.arrived())

    def sent(self) -> int:
        offered = self.status.groups_sent if self.status else 0
        if self.final:
            return offered
        return max(offered, self.arrived())

    def lost(self) -> int:
        """Sent but never seen: only for a process that ended without its final status; never negative."""
        return 0 if self.final else self.sent() - self.arrived()


class Books:
    """Bounded: at most max_entries incarnations (older ones of a sampler are folded together)."""

    def __init__(self, max_entries: int = 1024):
        self.max_entries = max_entries
        self.entries: dict[tuple[int, int], Incarnation] = {}
        self.carried = False  # restored from a checkpoint of an earlier learner process
        # Rejected groups naming a process not (yet) known from a valid message: charged to it
        # when it appears; bounded, so made-up (sampler id, incarnation) pairs cannot grow it.
        self.pending_rejected: dict[tuple[int, int], int] = {}

    def _entry(self, sampler_id: int, incarnation: int, version: int) -> Incarnation:
        key = (sampler_id, incarnation)
        e = self.entries.get(key)
        if e is None:
            if len(self.entries) >= self.max_entries:
                key = (sampler_id, -1)  # made-up incarnations cannot grow the table
                e = self.entries.get(key)
            if e is None:
                e = Incarnation(sampler_id, key[1], version, order=len(self.entries))
                e.rejected = self.pending_rejected.pop((sampler_id, incarnation), 0)
                self.entries[key] = e
                if any(o.sampler_id == sampler_id for k, o in self.entries.items() if k != key):
                    log.warning("sampler %d restarted (new process): rejoined at learner version %d",
                                sampler_id, version)
        return e

    def group(self, g: M.Group, version: int) -> None:
        e = self._entry(g.sampler_id, g.incarnation, version)
        e.received += 1
        if e.first_group_version is None:
            e.first_group_version = g.policy_version

    def rejected(self, sampler_id: int, incarnation: int) -> None:
        """A group message that failed validation, whose valid header names this process."""
        e = self.entries.get((sampler_id, incarnation))
        if e is not None:
            e.rejected += 1
        else:
            key = (sampler_id, incarnation)
            if key in self.pending_rejected or len(self.pending_rejected) < self.max_entries:
                self.pending_rejected[key] = self.pending_rejected.get(key, 0) + 1

    def known(self, sampler_id: int, incarnation: int) -> bool:
        """Whether this process has spoken validly (a group or a status)."""
        return (sampler_id, incarnation) in self.entries

    def status(self, s: M.SamplerStatus, version: int) -> bool:
        """Record a status; returns whether that process has now sent its final status."""
        e = self._entry(s.sampler_id, s.incarnation, version)
        old = e.status
        # Heartbeats travel on their own socket, so one may overtake (arrive after) the final
        # status or a newer heartbeat: keep the final one, else the one with the larger count.
        if old is None or s.final or (not old.final and s.groups_sent >= old.groups_sent):
            e.status = s
        return e.final

    def latest(self) -> dict[int, Incarnation]:
        """Per sampler id, its newest incarnation."""
        out: dict[int, Incarnation] = {}
        for e in sorted(self.entries.values(), key=lambda e: e.order):
            out[e.sampler_id] = e
        return out

    def totals(self) -> tuple[int, dict[str, int]]:
        """(sent, drops the samplers report or that died with them), summed over incarnations."""
        sent, dropped = 0, {}
        for e in self.entries.values():
            sent += e.sent()
            for reason, n in e.sampler_dropped().items():
                dropped[reason] = dropped.get(reason, 0) + n
            for reason, n in (("rejected", e.rejected), ("lost_in_flight", e.lost()),
                              ("lost_with_learner", e.lost_with_learner(self.carried))):
                if n:
                    dropped[reason] = dropped.get(reason, 0) + n
        return sent, dropped

    # ------------------------------------------------------------------ checkpoint / resume
    def dump(self) -> list[dict]:
        """JSON-able state for the learner's checkpoint."""
        return [{"sampler_id": e.sampler_id, "incarnation": e.incarnation, "joined_at_version": e.joined_at_version,
                 "received": e.received, "rejected": e.rejected, "first_group_version": e.first_group_version,
                 "status": None if e.status is None else
                 {"policy_version": e.status.policy_version, "groups_sent": e.status.groups_sent,
                  "final": e.status.final, "stats": dict(e.status.stats)}}
                for e in sorted(self.entries.values(), key=lambda e: e.order)]

    def restore(self, entries: list[dict], groups: dict, counts) -> int:
        """Take over the books of a checkpoint; returns the groups lost from its queue."""
        for d in entries[: self.max_entries]:
            e = Incarnation(int(d["sampler_id"]), int(d["incarnation"]), int(d["joined_at_version"]),
                            int(d["received"]), int(d.get("rejected", 0)), d.get("first_group_version"),
                            order=len(self.entries))
            st = d.get("status")
            if st:
                e.status = M.SamplerStatus(e.sampler_id, int(st["policy_version"]), int(st["groups_sent"]),
                                           bool(st["final"]), {k: float(v) for k, v in st["stats"].items()},
                                           e.incarnation)
            self.entries[(e.sampler_id, e.incarnation)] = e
        self.carried = True
        counts["received"] += int(groups.get("received", 0))
        counts["trained"] += int(groups.get("trained", 0))
        derived = set(SAMPLER_DROPS.values()) | {"rejected", "lost_in_flight", "lost_with_learner"}  # recomputed
        for reason, n in groups.get("dropped", {}).items():
            if reason not in derived:  # those are recomputed from the restored entries
                counts["dropped_" + reason] += int(n)
        lost = int(groups.get("queued", 0))  # the killed learner's queue at the checkpoint
        counts["dropped_lost_in_learner_queue"] += lost
        return lost

    def report(self) -> list[dict]:
        return [{"sampler_id": e.sampler_id, "incarnation": e.incarnation, "joined_at_version": e.joined_at_version,
                 "first_group_version": e.first_group_version, "received": e.received, "rejected": e.rejected,
                 "sent": e.sent(),
                 "final": e.final, "lost_in_flight": e.lost(), **({"sampler_dropped": e.sampler_dropped()}
                                                                 if e.sampler_dropped() else {})}
                for e in sorted(self.entries.values(), key=lambda e: e.order)]


def balance(acc: dict, books: Books, messages: "MessageLedger") -> dict:
    """Why the group ledger `acc` (Intake.accounting) does or does not balance, by name.

    A final status is the sampler's own count, so a group it sent that the learner could not tie
    to it (a message refused before its header named a sampler process, e.g. bad_schema, lives
    only in the message ledger as "unknown") leaves that process one short. Returns
    {"text", "gap" (sent - trained - dropped - queued), "by_process": [{"sampler_id", "incarnation",
    "sent", "accounted", "gap"}] for every process whose count differs, "learner_gap" (groups
    received but neither trained, dropped nor queued), "unattributable" {reason: n} (data messages
    tied to no known process), "explained" (every missing group can be one of those)}.
    """
    accounted = acc["trained"] + sum(acc["dropped"].values()) + acc["queued"]
    gap = acc["sent"] - accounted
    rows = []
    for e in sorted(books.entries.values(), key=lambda e: e.order):
        got = e.arrived() + e.lost() + e.lost_with_learner(books.carried)
        if e.sent() != got:
            rows.append({"sampler_id": e.sampler_id, "incarnation": e.incarnation, "sent": e.sent(),
                         "accounted": got, "gap": e.sent() - got})
    learner_gap = gap - sum(r["gap"] for r in rows)
    unknown = messages.report(books).get("data", {}).get("by_peer", {}).get("unknown", {})
    missing = sum(r["gap"] for r in rows)
    explained = (gap == 0 and not rows) or (learner_gap == 0 and all(r["gap"] > 0 for r in rows)
                                            and missing <= sum(unknown.values()))
    if gap == 0 and not rows:
        text = "balanced"
    else:
        per = {}
        for r in rows:
            per[r["sampler_id"]] = per.get(r["sampler_id"], 0) + r["gap"]
        who = " and ".join(f"{n} group{'s' * (n != 1)} sent by sampler {sid}" for sid, n in per.items() if n > 0)
        reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(unknown.items()))
        if explained:
            what = "an unattributable message" if missing == 1 else "unattributable messages"
            text = f"balanced except {who} that arrived as {what}: {reasons}"
        else:
            parts = [f"sampler {r['sampler_id']} (process {r['incarnation']}) says it sent {r['sent']}, "
                     f"{r['accounted']} are accounted for" for r in rows]
            if learner_gap:
                parts.append(f"{learner_gap} received group(s) are neither trained, dropped nor queued")
            if unknown:
                parts.append(f"unattributable data messages: {reasons}")
            text = f"NOT balanced (sent {acc['sent']}, accounted {accounted}): " + "; ".join(parts)
    return {"text": text, "gap": gap, "by_process": rows, "learner_gap": learner_gap,
            "unattributable": dict(sorted(unknown.items())), "explained": explained}


class MessageLedger:
    """Every rejected message, by channel, reason and peer; thread-safe (the sync thread writes too).

    A peer is given as a label ("unknown" or a sampler id) or, on the data channel, as the
    (sampler id, incarnation) a rejected header names: shown as that sampler id only if the
    process is known to the books by then, else as "unknown". Bounded: beyond `max_keys`
    distinct keys, new peers are counted as "unknown".
    """

    def __init__(self, max_keys: int = 4096):
        self.max_keys = max_keys
        self.counts: collections.Counter = collections.Counter()   # (channel, reason, peer) -> n
        self._lock = threading.Lock()

    def reject(self, channel: str, reason: str, peer: str | tuple[int, int] | None = None) -> None:
        key = (channel, reason, "unknown" if peer is None else peer)
        with self._lock:
            if key not in self.counts and len(self.counts) >= self.max_keys:
                key = (channel, reason, "unknown")
            self.counts[key] += 1

    def total(self) -> int:
        with self._lock:
            return sum(self.counts.values())

    def report(self, books: Books) -> dict:
        """{channel: {"rejected": n, "by_reason": {reason: n}, "by_peer": {peer: {reason: n}}}}."""
        with self._lock:
            items = list(self.counts.items())
        out: dict[str, dict] = {}
        for (channel, reason, peer), n in sorted(items, key=lambda kv: str(kv[0])):
            if isinstance(peer, tuple):
                peer = str(peer[0]) if books.known(*peer) else "unknown"
            ch = out.setdefault(channel, {"rejected": 0, "by_reason": {}, "by_peer": {}})
            ch["rejected"] += n
            ch["by_reason"][reason] = ch["by_reason"].get(reason, 0) + n
            by = ch["by_peer"].setdefault(str(peer), {})
            by[reason] = by.get(reason, 0) + n
        return out

    def dump(self) -> list:
        with self._lock:
            return [[c, r, list(p) if isinstance(p, tuple) else p, n] for (c, r, p), n in self.counts.items()]

    def restore(self, items: list) -> None:
        for c, r, p, n in items:
            with self._lock:
                self.counts[(str(c), str(r), tuple(p) if isinstance(p, list) else str(p))] += int(n)
