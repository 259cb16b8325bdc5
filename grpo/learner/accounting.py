"""The learner's group accounting, per sampler process ("incarnation").

The identity every run must close: sent = trained + dropped (by reason) + queued.

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

import logging
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
    first_group_version: int | None = None
    status: M.SamplerStatus | None = None
    order: int = field(default=0)

    @property
    def final(self) -> bool:
        return self.status is not None and self.status.final

    def sampler_dropped(self) -> dict[str, int]:
        stats = self.status.stats if self.status else {}
        return {reason: int(stats.get(key, 0)) for key, reason in SAMPLER_DROPS.items() if stats.get(key, 0)}

    def lost_with_learner(self, carried: bool) -> int:
        if not (carried and self.final):
            return 0
        return max(0, self.sent() - self.received - sum(self.sampler_dropped().values()))

    def sent(self) -> int:
        offered = self.status.groups_sent if self.status else 0
        if self.final:
            return offered
        return max(offered, self.received + sum(self.sampler_dropped().values()))

    def lost(self) -> int:
        return 0 if self.final else self.sent() - self.received - sum(self.sampler_dropped().values())


class Books:
    """Bounded: at most max_entries incarnations (older ones of a sampler are folded together)."""

    def __init__(self, max_entries: int = 1024):
        self.max_entries = max_entries
        self.entries: dict[tuple[int, int], Incarnation] = {}
        self.carried = False  # restored from a checkpoint of an earlier learner process

    def _entry(self, sampler_id: int, incarnation: int, version: int) -> Incarnation:
        key = (sampler_id, incarnation)
        e = self.entries.get(key)
        if e is None:
            if len(self.entries) >= self.max_entries:
                key = (sampler_id, -1)  # made-up incarnations cannot grow the table
                e = self.entries.get(key)
            if e is None:
                e = Incarnation(sampler_id, key[1], version, order=len(self.entries))
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
            for reason, n in (("lost_in_flight", e.lost()), ("lost_with_learner", e.lost_with_learner(self.carried))):
                if n:
                    dropped[reason] = dropped.get(reason, 0) + n
        return sent, dropped

    # ------------------------------------------------------------------ checkpoint / resume
    def dump(self) -> list[dict]:
        """JSON-able state for the learner's checkpoint."""
        return [{"sampler_id": e.sampler_id, "incarnation": e.incarnation, "joined_at_version": e.joined_at_version,
                 "received": e.received, "first_group_version": e.first_group_version,
                 "status": None if e.status is None else
                 {"policy_version": e.status.policy_version, "groups_sent": e.status.groups_sent,
                  "final": e.status.final, "stats": dict(e.status.stats)}}
                for e in sorted(self.entries.values(), key=lambda e: e.order)]

    def restore(self, entries: list[dict], groups: dict, counts, rejected) -> int:
        """Take over the books of a checkpoint; returns the groups lost from its queue."""
        for d in entries[: self.max_entries]:
            e = Incarnation(int(d["sampler_id"]), int(d["incarnation"]), int(d["joined_at_version"]),
                            int(d["received"]), d.get("first_group_version"), order=len(self.entries))
            st = d.get("status")
            if st:
                e.status = M.SamplerStatus(e.sampler_id, int(st["policy_version"]), int(st["groups_sent"]),
                                           bool(st["final"]), {k: float(v) for k, v in st["stats"].items()},
                                           e.incarnation)
            self.entries[(e.sampler_id, e.incarnation)] = e
        self.carried = True
        counts["received"] += int(groups.get("received", 0))
        counts["trained"] += int(groups.get("trained", 0))
        derived = set(SAMPLER_DROPS.values()) | {"lost_in_flight", "lost_with_learner"}  # recomputed
        for reason, n in groups.get("dropped", {}).items():
            if reason.startswith("invalid_"):
                rejected[reason[len("invalid_"):]] += int(n)
            elif reason not in derived:  # those are recomputed from the restored entries
                counts["dropped_" + reason] += int(n)
        lost = int(groups.get("queued", 0))  # the killed learner's queue at the checkpoint
        counts["dropped_lost_in_learner_queue"] += lost
        return lost

    def report(self) -> list[dict]:
        return [{"sampler_id": e.sampler_id, "incarnation": e.incarnation, "joined_at_version": e.joined_at_version,
                 "first_group_version": e.first_group_version, "received": e.received, "sent": e.sent(),
                 "final": e.final, "lost_in_flight": e.lost(), **({"sampler_dropped": e.sampler_dropped()}
                                                                 if e.sampler_dropped() else {})}
                for e in sorted(self.entries.values(), key=lambda e: e.order)]
