"""Weight layout, bucketing and all-or-nothing application; tcp through real sockets."""
import time

import pytest
import torch
from netutil import free_ports

from grpo.sampler.heartbeat import SyncInbox
from grpo.weights.layout import plan_layout, unpack_views
from grpo.weights.pack import pack
from grpo.sync.client import request_weights
from grpo.weights.tcp import TcpPublisher, apply_weights
from grpo.wire import codec
from grpo.wire import messages as M
from grpo.wire.transport import SyncClient, SyncServer


class Mixed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.randn(3, 5))
        self.b = torch.nn.Parameter(torch.randn(7).to(torch.bfloat16))
        self.c = torch.nn.Parameter(torch.randn(2, 2, 3))
        self.d = torch.nn.Parameter(torch.randn(1).to(torch.bfloat16))


def test_layout_round_trips_every_parameter_bit_exactly():
    torch.manual_seed(0)
    m = Mixed()
    named = list(m.named_parameters())
    layout, dtypes, nbytes = plan_layout(named, max_bucket_bytes=64)
    # float32 tensors of 60 and 48 bytes do not share a 64-byte bucket: two fp32 buckets + one bf16
    assert dtypes == ["float32", "bfloat16", "float32"]
    assert [(s.name, s.bucket, s.offset) for s in layout] == [("a", 0, 0), ("b", 1, 0), ("c", 2, 0), ("d", 1, 16)]
    views = unpack_views(layout, pack(named, layout, nbytes))
    for name, p in named:
        assert views[name].dtype == p.dtype and torch.equal(views[name], p.detach())


def _announce(model, version):
    named = list(model.named_parameters())
    layout, dtypes, nbytes = plan_layout(named)
    buckets = pack(named, layout, nbytes)
    return M.WeightsAnnounce(version=version, method="tcp", layout=layout, bucket_dtypes=dtypes,
                             bucket_nbytes=nbytes, buckets=[memoryview(b.numpy()) for b in buckets])


def test_apply_is_all_or_nothing():
    torch.manual_seed(1)
    src, dst = Mixed(), Mixed()
    before = {k: v.detach().clone() for k, v in dst.named_parameters()}
    bad = _announce(src, 1)
    bad.layout[-1] = M.TensorSpec("d", "bfloat16", (2,), bad.layout[-1].bucket, bad.layout[-1].offset)
    with pytest.raises(ValueError, match="shape"):
        apply_weights(dst, bad)
    for k, v in dst.named_parameters():   # the earlier tensors were not written either
        assert torch.equal(v, before[k])
    apply_weights(dst, _announce(src, 2))
    for (k, v), (_, w) in zip(dst.named_parameters(), src.named_parameters()):
        assert torch.equal(v, w)


def test_tcp_publisher_serves_newest_version_and_stop():
    torch.manual_seed(2)
    learner, sampler = Mixed(), Mixed()
    port = free_ports(1)[0]
    pub = TcpPublisher(SyncServer("127.0.0.1", port), learner)
    client = SyncClient("127.0.0.1", port, M.weights_limits(1 << 20))
    try:
        client.send(M.WeightsRequest(sampler_id=3, have_version=0))
        assert isinstance(client.receive(5.0), M.NoUpdate)          # nothing published beyond v0
        with torch.no_grad():
            learner.a.add_(1.0)
        pub.publish(1, learner)
        v1 = pub._snapshot.announce
        a_at_v1 = learner.a.detach().clone()
        with torch.no_grad():
            learner.a.add_(1.0)                                      # training goes on after publish
        assert torch.equal(unpack_views(v1.layout, v1.buckets)["a"], a_at_v1)  # the snapshot is a copy
        pub.publish(2, learner)
        client.send(M.WeightsRequest(sampler_id=3, have_version=0))
        msg = client.receive(5.0)
        assert isinstance(msg, M.WeightsAnnounce) and msg.version == 2
        apply_weights(sampler, msg)
        assert torch.equal(sampler.a, learner.a) and torch.equal(sampler.b, learner.b)
        deadline = time.monotonic() + 2
        while pub.sampler_versions.get(3) != 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pub.sampler_versions[3] == 0
        pub.stop_samplers()
        client.send(M.WeightsRequest(sampler_id=3, have_version=2))
        assert isinstance(client.receive(5.0), M.Stop)
    finally:
        client.close()
        pub.close()


def test_stop_reaches_a_sampler_that_is_not_asking():
    """When the learner finishes, every connection it has answered gets a stop unprompted (request_id
    -1): a sampler in the middle of a round reads it between decode chunks (SyncInbox.stopped, which
    sends nothing), and keeps any answer it reads on the way for its next weights request."""
    learner = Mixed()
    port = free_ports(1)[0]
    pub = TcpPublisher(SyncServer("127.0.0.1", port), learner)
    inbox = SyncInbox(SyncClient("127.0.0.1", port, M.weights_limits(1 << 20)), every_s=0.0)
    try:
        inbox.send(M.WeightsRequest(sampler_id=3, have_version=0, request_id=1))
        deadline = time.monotonic() + 5
        while not inbox._kept and time.monotonic() < deadline:   # the answer, read on the way
            assert not inbox.stopped()
            time.sleep(0.01)
        assert [type(m) for m in inbox._kept] == [M.NoUpdate] and inbox.stop is None
        t0 = time.monotonic()
        pub.stop_samplers()
        while not inbox.stopped():
            assert time.monotonic() - t0 < 2.0, "no stop within 2 s of stop_samplers()"
            time.sleep(0.01)
        assert inbox.stop.request_id == -1 and inbox.stop.reason == "learner finished"
        # A weights request now: the kept answer to request 1 first, then the stop ends it.
        answered, newest, stop = request_weights(inbox, 3, 0, 2, 5.0)
        assert stop is not None and newest is None and not inbox._kept
    finally:
        inbox.close()
        pub.close()


def test_fp32_master_weights_are_published_as_bf16():
    """--no-deepspeed on GPU trains fp32 weights; samplers run bf16 and get exactly the cast."""
    torch.manual_seed(3)
    learner = torch.nn.Linear(4, 3)
    sampler = torch.nn.Linear(4, 3).to(torch.bfloat16)
    port = free_ports(1)[0]
    pub = TcpPublisher(SyncServer("127.0.0.1", port), learner, dtype=torch.bfloat16)
    client = SyncClient("127.0.0.1", port, M.weights_limits(1 << 20))
    try:
        assert pub.bucket_dtypes == ["bfloat16"] and sum(pub.bucket_nbytes) == 32 + 16  # 24 -> 32 and 6 -> 16 bytes (16-aligned)
        pub.publish(1, learner)
        client.send(M.WeightsRequest(sampler_id=0, have_version=0))
        msg = client.receive(5.0)
        apply_weights(sampler, msg)
        assert torch.equal(sampler.weight, learner.weight.detach().to(torch.bfloat16))
        assert torch.equal(sampler.bias, learner.bias.detach().to(torch.bfloat16))
    finally:
        client.close()
        pub.close()


def test_a_late_answer_is_not_taken_for_the_current_one():
    """Request 1 was sent while the learner was loading; its answer arrives after request 2.

    The answers come in order (1, then 2): the sampler must wait for answer 2 and keep the
    newest weights it saw, not stop at answer 1 (that made every round one answer behind).
    """
    import threading

    import zmq

    port = free_ports(1)[0]
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.bind(f"tcp://127.0.0.1:{port}")
    client = SyncClient("127.0.0.1", port, M.weights_limits(1 << 20))
    torch.manual_seed(4)
    src = Mixed()
    seen = []

    def learner():
        pending = []
        while len(pending) < 2:   # hold request 1 until request 2 is in
            identity, *frames = router.recv_multipart()
            pending.append((identity, codec.decode(frames)))
        for identity, req in pending:
            seen.append(req.request_id)
            answer = (M.NoUpdate(version=0, request_id=req.request_id) if req.request_id == 1
                      else __import__("dataclasses").replace(_announce(src, 5), request_id=req.request_id))
            time.sleep(0.2)
            router.send_multipart([identity, *codec.encode(answer)])

    t = threading.Thread(target=learner)
    t.start()
    try:
        from grpo.sync.client import request_weights

        answered, newest, stop = request_weights(client, 0, 0, request_id=1, timeout_s=0.1)
        assert (answered, newest, stop) == (False, None, None)   # nothing came back in time
        answered, newest, stop = request_weights(client, 0, 0, request_id=2, timeout_s=5.0)
        assert answered and stop is None and newest is not None and newest.version == 5
        assert newest.request_id == 2 and seen == [1, 2]
    finally:
        t.join(timeout=5)
        client.close()
        router.close(linger=0)


def test_backlog_of_requests_gets_one_answer_for_the_newest():
    """Requests queued while the learner loaded: only the newest per sampler is answered.

    Answering each with full weights filled the ROUTER's queue (SNDHWM) so the answer the
    sampler was waiting for was dropped (seen in CI: samplers stuck at version 0).
    """
    torch.manual_seed(5)
    model = Mixed()
    port = free_ports(1)[0]
    server = SyncServer("127.0.0.1", port)
    client = SyncClient("127.0.0.1", port, M.weights_limits(1 << 20))
    try:
        for rid in range(1, 7):
            client.send(M.WeightsRequest(sampler_id=0, have_version=0, request_id=rid))
        time.sleep(0.5)                                # all six are queued at the ROUTER
        pub = TcpPublisher(server, model)              # its thread starts now
        answers = []
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            msg = client.receive(0.1)
            if msg is not None:
                answers.append(msg)
        assert [a.request_id for a in answers] == [6]
    finally:
        client.close()
        pub.close()
