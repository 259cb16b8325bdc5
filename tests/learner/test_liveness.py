"""Heartbeat bookkeeping, per-process accounting and sync-id binding, by hand-worked cases (no processes)."""
import time

import msgpack
import numpy as np
import pytest
import torch
from builders import make_group, make_status
from netutil import free_ports

from grpo.learner.accounting import Books, MessageLedger
from grpo.learner.liveness import Liveness, SyncPeers
from grpo.sampler.counters import SamplerCounters
from grpo.sampler.heartbeat import hand_group, send_group
from grpo.weights.tcp import TcpPublisher
from grpo.wire import codec
from grpo.wire import messages as M
from grpo.wire.transport import DataSender, SyncClient, SyncServer


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_silent_sampler_is_gone_then_back_and_final_is_not_waited_for(caplog):
    clock = Clock()
    live = Liveness(timeout_s=5.0, max_samplers=4, clock=clock)
    assert live.seen(0) and live.seen(1) and live.seen(2)
    assert not live.seen(4) and not live.seen(-1)          # out of range: nothing recorded
    clock.t += 3
    live.seen(1)
    clock.t += 2.5                                         # 0 and 2 silent 5.5 s, 1 silent 2.5 s
    assert live.check() == [0, 2] and live.check() == []   # each counted gone once
    assert live.alive() == {1}
    live.seen(2, final=True)                               # 2 speaks again, and it is its last word
    assert live.alive() == {1} and live.finished == {2} and live.gone == {0}
    clock.t += 60
    assert live.alive() == set() and live.gone == {0, 1}   # 2 finished: never counted gone
    live.seen(0)
    assert live.alive() == {0}
    snap = live.snapshot()
    assert (snap["gone"], snap["finished"], snap["times_gone"], snap["times_back"]) == ([1], [2], 3, 2)
    msgs = [r.getMessage() for r in caplog.records]
    assert sum("counted as gone" in m for m in msgs) == 3 and sum("is back after" in m for m in msgs) == 2


def test_books_per_process_killed_restarted_and_late_heartbeat():
    b = Books()
    # sampler 0: 5 offered, 2 of them dropped at its HWM, 3 received, then final.
    for _ in range(3):
        b.group(make_group(sampler_id=0, incarnation=11), version=0)
    assert b.status(make_status(0, 11, 5, final=True, dropped_full=2), 0) is True
    # a heartbeat that overtook the final status (sent on another socket) changes nothing
    assert b.status(make_status(0, 11, 4), 1) is True
    # sampler 1, first process: heartbeat said 4 sent, 2 arrived, then SIGKILL: 2 lost in flight
    b.group(make_group(sampler_id=1, incarnation=21), version=1)
    b.status(make_status(1, 21, 4), 1)
    b.status(make_status(1, 21, 3), 1)             # an older heartbeat arriving late: ignored
    b.group(make_group(sampler_id=1, incarnation=21), version=1)
    # sampler 1 restarted: a new process whose counts start at 0; its first group is at v3
    b.group(make_group(sampler_id=1, incarnation=22, policy_version=3), version=3)
    b.status(make_status(1, 22, 1, final=True), 3)
    # sampler 2 died before any status reached us: sent >= what we received
    b.group(make_group(sampler_id=2, incarnation=31), version=3)
    sent, dropped = b.totals()
    assert sent == 5 + 4 + 1 + 1
    assert dropped == {"sampler_full": 2, "lost_in_flight": 2}
    received = 3 + 2 + 1 + 1
    assert sent == received + sum(dropped.values())
    rows = {(r["sampler_id"], r["incarnation"]): r for r in b.report()}
    assert rows[(1, 22)]["joined_at_version"] == 3 and rows[(1, 22)]["first_group_version"] == 3
    assert rows[(1, 21)]["lost_in_flight"] == 2 and not rows[(1, 21)]["final"]
    assert b.latest()[1].incarnation == 22


def test_books_are_bounded_against_made_up_incarnations():
    b = Books(max_entries=3)
    for inc in range(10):
        b.group(make_group(sampler_id=0, incarnation=inc), version=0)
    assert len(b.entries) == 4 and b.entries[(0, -1)].received == 7  # 3 real + one overflow entry
    assert b.totals() == (10, {})


def test_sync_connection_is_bound_to_its_first_sampler_id():
    live = Liveness(timeout_s=5.0, max_samplers=8)
    peers = SyncPeers(live, max_peers=2)
    assert peers.accept(b"A", 3) is None and peers.accept(b"A", 3) is None
    assert peers.accept(b"A", 4) == "sampler_id_mismatch"
    assert peers.accept(b"B", 99) == "bad_sampler_id"
    assert peers.accept(b"B", 4) is None and peers.accept(b"C", 5) is None
    assert list(peers._ids) == [b"B", b"C"]                # A aged out: the table stays bounded
    assert live.last_seen.keys() == {3, 4, 5}


def test_a_late_sync_request_does_not_unfinish_a_sampler_but_a_new_process_does():
    """The learner's stop can cross a sampler's last request: its final status may reach the data
    thread before that request reaches the sync thread. Seen in test_faults_samplers under load:
    the run ended with that sampler 'alive'."""
    clock = [0.0]
    live = Liveness(timeout_s=30, max_samplers=4, clock=lambda: clock[0])
    peers = SyncPeers(live, max_peers=4)
    live.seen(1)
    live.seen(1, final=True)                  # its final status (data thread)
    clock[0] = 1.0
    assert peers.accept(b"conn-a", 1) is None   # then its last request (sync thread)
    snap = live.snapshot()
    assert (snap["alive"], snap["finished"], snap["silent_s"][1]) == ([], [1], 0.0)
    live.seen(1)                              # a group or heartbeat of a new process under id 1
    assert (live.snapshot()["alive"], live.snapshot()["finished"]) == ([1], [])


def test_publisher_refuses_borrowed_and_made_up_sampler_ids():
    """Over real sockets: a connection that switches ids, or names one beyond --max-samplers, gets no answer."""
    (port,) = free_ports(1)
    server = SyncServer("127.0.0.1", port)
    model = torch.nn.Linear(2, 2)
    pub = TcpPublisher(server, model)
    live = Liveness(timeout_s=5.0, max_samplers=8)
    pub.peers = SyncPeers(live, max_peers=16)
    pub.publish(1, model)
    client = SyncClient("127.0.0.1", port, M.weights_limits(1 << 20))
    try:
        def ask(sid, rid):
            deadline = time.monotonic() + 10
            while not client.send(M.WeightsRequest(sampler_id=sid, have_version=0, request_id=rid)):
                assert time.monotonic() < deadline
                time.sleep(0.05)
            return client.receive(timeout_s=2.0)

        first = ask(3, 1)
        assert isinstance(first, M.WeightsAnnounce) and first.request_id == 1
        assert ask(5, 2) is None                     # same connection, another id: refused
        assert ask(1000, 3) is None                  # beyond --max-samplers: refused
        again = ask(3, 4)
        assert isinstance(again, M.WeightsAnnounce) and again.request_id == 4
        assert server.rejected == {"sampler_id_mismatch": 1, "bad_sampler_id": 1}
        assert set(pub.sampler_versions) == {3} and live.last_seen.keys() == {3}
    finally:
        client.close()
        pub.close()


def test_on_full_drop_counts_and_block_times_out():
    """A PUSH with no learner behind it queues exactly --send-hwm groups; the rest are dropped (and counted)."""
    (port,) = free_ports(1)
    g = make_group(sampler_id=0, incarnation=1)
    drop = DataSender("127.0.0.1", port, hwm=2)
    counters = SamplerCounters()
    try:
        sent = [send_group(drop, g, "drop", 600, counters, "nowhere") for _ in range(7)]
        assert sent == [True, True, False, False, False, False, False]
        assert (counters.dropped_full, counters.dropped_send_timeout) == (5.0, 0.0)
        t0 = time.monotonic()
        assert send_group(drop, g, "block", 0.5, counters, "nowhere") is False
        assert 0.4 < time.monotonic() - t0 < 5 and counters.dropped_send_timeout == 1.0
    finally:
        drop.close(linger_s=0)


def test_groups_are_numbered_as_handed_and_the_intake_counts_only_those_a_request_says():
    """Real sockets: a PUSH with no learner behind it takes --send-hwm 2 groups and drops the third,
    which takes no number; once the learner binds, the fourth goes as 3. The learner's intake counts,
    of the first `sent` a process handed, those received: a request that says 2 while group 3 has
    already come (the data and sync sockets race) is told 2, not 3."""
    import collections
    from types import SimpleNamespace

    from grpo.config import LearnerConfig, from_flat
    from grpo.learner.intake import Intake
    from grpo.sync.flow import received_among
    from grpo.wire.transport import DataReceiver

    (port,) = free_ports(1)
    sender, counters = DataSender("127.0.0.1", port, hwm=2), SamplerCounters()
    groups = [make_group(sampler_id=0, incarnation=5, group_id=f"g{i}") for i in range(4)]
    receiver = None
    try:
        assert [hand_group(sender, g, "drop", 600, counters, "nowhere") for g in groups[:3]] == [True, True, False]
        assert [g.seq for g in groups[:3]] == [1, 2, 3] and counters.handed() == 2
        receiver = DataReceiver("127.0.0.1", port, M.Limits(), 1 << 20)
        assert hand_group(sender, groups[3], "block", 10, counters, "here") and groups[3].seq == 3
        got = [receiver.receive(10.0) for _ in range(3)]
    finally:
        sender.close(linger_s=0)
        if receiver is not None:
            receiver.sock.close(linger=0)
    assert [(g.group_id, g.seq, g.incarnation) for g in got] == [("g0", 1, 5), ("g1", 2, 5), ("g3", 3, 5)]

    lrn = Intake(from_flat(LearnerConfig), SimpleNamespace(rejected=collections.Counter()), Liveness(30.0, 4), Books(),
                 MessageLedger())
    for g in got:
        lrn.take(g, version=0)
    assert lrn.arrived(0, 5) == (3, 3)
    assert [received_among(*lrn.arrived(0, 5), sent) for sent in (0, 1, 2, 3, 4)] == [0, 1, 2, 3, 3]
    assert lrn.arrived(0, 6) == lrn.arrived(1, 5) == (0, 0)   # another process, another sampler id
    # a group the codec refused, whose valid header named its process and number, counts as received
    refused = M.ProtocolError("bad_field", "x")
    refused.origin = M.Origin("group", 0, 5, 4)
    lrn._rejected(refused, None)
    assert lrn.arrived(0, 5) == (4, 4)
    assert received_among(*lrn.arrived(0, 5), 3) == 3 and received_among(*lrn.arrived(0, 5), 4) == 4


def test_msgpack_timestamp_ext_is_refused_as_bad_header():
    h = {"schema": M.SCHEMA_VERSION, "kind": "no_update", "version": 1, "request_id": 1, "x": [msgpack.Timestamp(1, 0)]}
    with pytest.raises(M.ProtocolError) as e:
        codec.decode([msgpack.packb(h, datetime=False)])
    assert e.value.reason == "bad_header"
    del h["x"]
    assert codec.decode([msgpack.packb(h)]) == M.NoUpdate(version=1, request_id=1)


def test_learner_intake_bounds_its_fifo_and_drops_what_it_would_not_train():
    """The learner's intake on real messages: --buffer-size FIFO, too_long, ids beyond --max-samplers."""
    import collections
    from types import SimpleNamespace

    from grpo.config import LearnerConfig, from_flat
    from grpo.learner.intake import Intake

    cfg = from_flat(LearnerConfig, buffer_size=2, max_new_tokens=2, max_prompt_tokens=3, max_samplers=4)
    # no sockets: these messages are handed to take() directly
    lrn = Intake(cfg, SimpleNamespace(rejected=collections.Counter()), Liveness(30.0, 4), Books(), MessageLedger())
    # make_group's default: a prompt of 2 tokens, one completion of 2 tokens
    groups = [make_group(sampler_id=0, incarnation=1, policy_version=v) for v in range(4)]
    long_prompt = make_group(sampler_id=1, incarnation=2)
    long_prompt.prefix_token_ids = np.arange(4, dtype=np.int32)  # 4 > --max-prompt-tokens 3
    long_completion = make_group(sampler_id=1, incarnation=2)
    long_completion.completions[0].generated_token_ids = np.arange(3, dtype=np.int32)  # 3 > --max-new-tokens 2
    for msg in [*groups, long_prompt, long_completion, make_group(sampler_id=4, incarnation=9), make_status(4, 9, 1)]:
        lrn.take(msg, version=0)
    assert [g.policy_version for g in lrn.queue] == [2, 3]        # the two oldest were pushed out
    assert lrn.counts == {"received": 6, "dropped_buffer_full": 2, "dropped_too_long": 2}
    # sampler id 4 >= --max-samplers 4: in the message ledger only, from no peer we know
    assert lrn.messages.report(lrn.books) == {"data": {"rejected": 2, "by_reason": {"bad_sampler_id": 2},
                                                       "by_peer": {"unknown": {"bad_sampler_id": 2}}}}
    assert lrn.books.totals() == (6, {}) and lrn.liveness.last_seen.keys() == {0, 1}
    # what the end-of-run accounting makes of it (the bad ids' messages never reached the group books)
    assert lrn.accounting() == {"received": 6, "trained": 0, "queued": 2, "sent": 6, "balanced": True,
                                "dropped": {"buffer_full": 2, "too_long": 2}}


def test_a_resumed_learner_counts_groups_made_before_its_start_apart():
    """Resumed at version 3: a group from the weights before it (a sampler's round 0, generated before
    the learner's first answer) is judged and dropped stale as any, but its age stays out of `ages`,
    which the end-of-run staleness advice reads: no bound choice is about such groups."""
    import collections
    from types import SimpleNamespace

    from grpo.config import LearnerConfig, from_flat
    from grpo.learner.intake import Intake
    from grpo.rules.staleness import staleness_advice

    cfg = from_flat(LearnerConfig, max_staleness=2)
    lrn = Intake(cfg, SimpleNamespace(rejected=collections.Counter()), Liveness(30.0, 4), Books(), MessageLedger())
    lrn.start_version = 3
    kept = [lrn._fresh(make_group(sampler_id=0, incarnation=1, policy_version=v), version=4) for v in (0, 0, 3, 4)]
    assert kept == [False, False, True, True]
    assert lrn.counts == {"dropped_stale": 2}
    assert lrn.ages == {1: 1, 0: 1} and lrn.ages_before_start == {4: 2}
    assert staleness_advice(lrn.ages, cfg.training.max_staleness) is None   # counted with them: 50% stale, advice given
    assert staleness_advice(lrn.ages + lrn.ages_before_start, cfg.training.max_staleness).startswith("staleness: 50% of")
