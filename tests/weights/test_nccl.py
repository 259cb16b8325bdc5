"""Method "nccl" on CPU (the same code on gloo): pair groups, bit-exact versions, a dead sampler
that never joins does not hang the learner, a restarted sampler rejoins with the current weights.
Also the slot publisher's tcp answers and its acknowledgement rule."""
import threading
import time

import torch
from netutil import free_ports

from grpo.model.load import weights_checksum
from grpo.weights.nccl import NcclReceiver
from grpo.sync.client import request_weights
from grpo.weights.slots import SlotPublisher
from grpo.weights.tcp import apply_weights
from grpo.wire import messages as M
from grpo.wire.transport import SyncClient, SyncServer


def _model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3))


def _step(model, v):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * v)


def _client(port):
    return SyncClient("127.0.0.1", port, M.weights_limits(1 << 20))


def test_nccl_on_gloo_delivers_each_version_bit_exactly_and_survives_a_dead_peer():
    learner, sampler = _model(0), _model(1)
    port = free_ports(1)[0]
    pub = SlotPublisher(SyncServer("127.0.0.1", port), learner, torch.float32, ack_timeout_s=3.0,
                       method="nccl", nccl_timeout_s=3.0)
    rx = NcclReceiver(sampler, torch.float32, timeout_s=10.0)
    client = _client(port)
    try:
        assert weights_checksum(sampler) != weights_checksum(learner)
        for v in (1, 2, 3):
            _step(learner, v)
            pub.publish(v, learner)
            answered, newest, stop = request_weights(client, 0, v - 1, v, 10.0, "nccl")
            assert answered and stop is None and newest.method == "nccl" and newest.version == v
            assert rx.apply(newest)
            assert weights_checksum(sampler) == weights_checksum(learner)   # the version, bit for bit
            assert torch.equal(sampler[0].weight, learner[0].weight)
        deadline = time.monotonic() + 5        # the learner's send returns just after our recv
        while pub.pairs.sent < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pub.pairs.sent == 3 and len(pub.pairs.pairs) == 1            # one pair group, reused

        # A peer that asks for nccl and dies before joining: the learner's sync thread gives up
        # after nccl_timeout_s, drops the pair, and publishing (which needs that slot) goes on.
        ghost = _client(port)
        ghost.send(M.WeightsRequest(sampler_id=7, have_version=0, request_id=1, method="nccl"))
        time.sleep(0.5)
        ghost.close()
        deadline = time.monotonic() + 15
        while pub.pairs.failed == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pub.pairs.failed == 1 and len(pub.pairs.pairs) == 1
        answered, newest, _ = request_weights(client, 0, 3, 9, 10.0, "nccl")   # the live sampler acknowledges v3
        assert answered and newest is None
        t0 = time.monotonic()
        for v in (4, 5):   # both slots get rewritten: nothing waits on the ghost any more
            _step(learner, v)
            pub.publish(v, learner)
        assert time.monotonic() - t0 < 2.5

        # The sampler restarts: a new connection, a new pair, and the current version.
        client.close()
        rx.close()
        sampler2 = _model(2)
        rx2 = NcclReceiver(sampler2, torch.float32, timeout_s=10.0)
        client = _client(port)
        answered, newest, _ = request_weights(client, 0, -1, 1, 10.0, "nccl")
        assert newest.version == 5 and rx2.apply(newest)
        assert weights_checksum(sampler2) == weights_checksum(learner)
        rx2.close()
    finally:
        client.close()
        pub.close()


def test_slot_publisher_answers_tcp_and_waits_for_acknowledgements():
    learner, sampler, tcp_sampler = _model(3), _model(4), _model(5)
    port = free_ports(1)[0]
    pub = SlotPublisher(SyncServer("127.0.0.1", port), learner, torch.float32, ack_timeout_s=1.5,
                       method="nccl", nccl_timeout_s=10.0)
    rx = NcclReceiver(sampler, torch.float32, timeout_s=10.0)
    client, tcp_client = _client(port), _client(port)

    def sync(have, rid):
        _, newest, _ = request_weights(client, 0, have, rid, 10.0, "nccl")
        assert rx.apply(newest)
        return newest.version

    try:
        _step(learner, 1)
        pub.publish(1, learner)                       # slot 0
        # tcp from the same slots: bytes, copied out before the answer, so nothing to acknowledge
        _, newest, _ = request_weights(tcp_client, 1, 0, 1, 10.0, "tcp")
        assert newest.method == "tcp" and newest.version == 1
        apply_weights(tcp_sampler, newest)
        assert weights_checksum(tcp_sampler) == weights_checksum(learner)
        assert sync(0, 1) == 1                        # nccl reader of slot 0, not yet acknowledged
        t0 = time.monotonic()
        pub.publish(2, learner)                       # slot 1: free, no wait
        assert time.monotonic() - t0 < 0.5
        acker = threading.Timer(0.6, lambda: sync(1, 2))   # acknowledges v1 (and takes v2 from slot 1)
        acker.start()
        t0 = time.monotonic()
        pub.publish(3, learner)                       # slot 0 again: waits for that acknowledgement
        waited = time.monotonic() - t0
        acker.join()
        assert 0.4 < waited < 1.4
        assert sync(2, 3) == 3                        # acknowledges v2 (slot 1); reads v3 from slot 0
        t0 = time.monotonic()
        pub.publish(4, learner)                       # slot 1: acknowledged, no wait
        assert time.monotonic() - t0 < 0.5
        t0 = time.monotonic()
        pub.publish(5, learner)                       # slot 0: never acknowledged -> ack_timeout_s, then reuse
        assert 1.3 < time.monotonic() - t0 < 3.0
        assert sync(3, 4) == 5 and weights_checksum(sampler) == weights_checksum(learner)
    finally:
        client.close()
        tcp_client.close()
        rx.close()
        pub.close()


def test_a_restarted_sampler_releases_the_slot_its_dead_process_was_reading():
    """Sampler 0 reads v1 from slot 0 and dies before acknowledging it; its restart (same id, new
    connection) takes v2 from slot 1 and acknowledges it. Publishing v3 into slot 0 must not wait
    ack_timeout_s for the dead process: its reads ended when its id asked on a new connection."""
    learner, sampler, restarted = _model(6), _model(7), _model(8)
    port = free_ports(1)[0]
    pub = SlotPublisher(SyncServer("127.0.0.1", port), learner, torch.float32, ack_timeout_s=2.0,
                       method="nccl", nccl_timeout_s=10.0)
    rx, rx2 = NcclReceiver(sampler, torch.float32, timeout_s=10.0), NcclReceiver(restarted, torch.float32, timeout_s=10.0)
    dead, client = _client(port), None
    try:
        _step(learner, 1)
        pub.publish(1, learner)                                    # slot 0
        _, newest, _ = request_weights(dead, 0, 0, 1, 10.0, "nccl")
        assert newest.version == 1 and rx.apply(newest)            # read, never acknowledged
        dead.close()
        assert pub.pending[0] and not pub.pending[1]
        _step(learner, 2)
        pub.publish(2, learner)                                    # slot 1: free
        client = _client(port)                                     # the restarted process, sampler id 0
        _, newest, _ = request_weights(client, 0, -1, 1, 10.0, "nccl")
        assert newest.version == 2 and rx2.apply(newest)
        assert not pub.pending[0]                                  # the dead reader's slot is released
        answered, newest, _ = request_weights(client, 0, 2, 2, 10.0, "nccl")   # acknowledges v2
        assert answered and newest is None and not pub.pending[1]
        _step(learner, 3)
        t0 = time.monotonic()
        pub.publish(3, learner)                                    # slot 0 again
        assert time.monotonic() - t0 < 1.0 and pub.ack_waits_s[-1] < 1.0
        assert weights_checksum(restarted) != weights_checksum(learner)   # v3 is new to it
    finally:
        if client is not None:
            client.close()
        rx.close()
        rx2.close()
        pub.close()


def test_method_choice_per_side():
    import pytest

    from grpo.weights.methods import check_method, sampler_method

    assert [sampler_method(m, "cuda") for m in ("auto", "ipc", "nccl", "shared", "tcp")] == \
        ["ipc", "ipc", "nccl", "shared", "tcp"]
    assert [sampler_method(m, "cpu") for m in ("auto", "ipc", "nccl", "tcp")] == ["tcp", "tcp", "nccl", "tcp"]
    check_method("nccl", "cpu", lora=False, bf16_weights=False)           # gloo on CPU: allowed
    check_method("shared", "cuda", lora=False, bf16_weights=True)
    for method, device, lora, bf16, needle in (("pigeon", "cpu", False, True, "choose auto"),
                                               ("ipc", "cpu", False, True, "needs a CUDA learner"),
                                               ("shared", "cuda", True, True, "without LoRA"),
                                               ("shared", "cuda", False, False, "--precision bf16")):
        with pytest.raises(ValueError, match=needle):
            check_method(method, device, lora, bf16)
