"""Fuzzing both sockets with malformed messages (docs/protocol.md, section 4).

The malformed messages are corruptions of valid ones, built and checked in tests/wire/corruptions.py:
each one is first decoded here with the receiver's own limits, must raise ``ProtocolError``, and
the reason it gives is the count the receiver on the other end of the socket must report.

* data port: a real learner process receives >= 10,000 malformed messages, then one valid
  group that it must train on, then a final status that closes its accounting;
* sync port: a hostile ROUTER feeds a real ``SyncClient`` >= 2,000 malformed answers, then a
  valid ``weights`` answer.

Everything is seeded, so the messages (and the expected counts) are the same on every run.
(No code-executing deserializer anywhere: tests/test_no_unsafe_code.py.)
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import zmq
import zmq.utils.monitor
from builders import frames_of, make_weights
from corruptions import DATA_LIMITS, SAMPLER_ID, SEED, G, data_cases, fuzz_group, oversized_messages, sync_cases
from netutil import free_ports

from grpo.wire import codec
from grpo.wire import messages as M
from grpo.wire.transport import SyncClient

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
MAX_MESSAGE_MB = 1  # learner's --max-message-mb: libzmq drops any frame above 1 MiB
N_DATA = 10_000
N_SYNC = 2_000
# Every reason code of docs/protocol.md section 4 except not_multipart, which cannot cross a
# socket (zmq always delivers a non-empty list of frames).
WIRE_REASONS = {"bad_header", "bad_schema", "bad_kind", "bad_field", "too_large", "bad_dtype", "bad_shape",
                "frame_size", "length_mismatch", "non_finite", "token_out_of_range", "bad_group_size",
                "bad_log_prob"}


# ----------------------------------------------------------------------------- helpers


def child_env() -> dict[str, str]:
    return dict(os.environ, PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")


# ----------------------------------------------------------------------------- 1. data port


def send_oversized(ctx: zmq.Context, port: int, frames: list[bytes]) -> bool:
    """Send on a fresh PUSH; True once the learner hung up on us (the drop libzmq does)."""
    sock = ctx.socket(zmq.PUSH)
    mon = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDTIMEO, 10_000)
    sock.setsockopt(zmq.RECONNECT_IVL, 10_000)  # do not come back within this test
    sock.connect(f"tcp://127.0.0.1:{port}")
    seen = []
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and zmq.EVENT_DISCONNECTED not in seen:
            if mon.poll(200):
                ev = zmq.utils.monitor.recv_monitor_message(mon)["event"]
                seen.append(ev)
                if ev == zmq.EVENT_CONNECTED:
                    sock.send_multipart(frames, copy=False)
        return zmq.EVENT_CONNECTED in seen and zmq.EVENT_DISCONNECTED in seen
    finally:
        sock.disable_monitor()
        mon.close(linger=0)
        sock.close(linger=0)


def origin_of(frames) -> M.Origin | None:
    """The sender a rejected message's valid header names (the learner's rule), or None."""
    try:
        codec.decode(frames, DATA_LIMITS)
    except M.ProtocolError as exc:
        return exc.origin if exc.origin is not None and exc.origin.sampler_id < 256 else None   # --max-samplers
    raise AssertionError("a fuzz case decoded")


@pytest.mark.slow
def test_fuzz_data_port_then_valid_group_is_trained(tmp_path):
    t_start = time.monotonic()
    data_port, sync_port = free_ports(2)
    run_dir = tmp_path / "run"
    err_path, out_path = tmp_path / "learner.stderr", tmp_path / "learner.stdout"
    cmd = [PY, "training_worker.py", "--device", "cpu", "--model", "tiny-random", "--num-generations", str(G),
           "--train-batch-size", "2", "--max-steps", "1", "--data-port", str(data_port), "--sync-port",
           str(sync_port), "--run-dir", str(run_dir), "--shutdown-timeout-s", "10",
           "--max-message-mb", str(MAX_MESSAGE_MB)]
    ctx = zmq.Context()
    # The learner starts first: its imports and model load take one core while the cases are made on
    # the other (nothing is sent to it before they are all made and checked).
    with open(err_path, "w") as err, open(out_path, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=child_env(), stdout=out, stderr=err)
    try:
        cases = data_cases(N_DATA)
        expected = Counter(reason for _, _, reason in cases)
        assert len(cases) >= 10_000
        assert WIRE_REASONS <= set(expected), sorted(WIRE_REASONS - set(expected))
        r, nrng = random.Random(SEED + 1), np.random.default_rng(SEED + 1)
        oversized = oversized_messages(r, nrng, MAX_MESSAGE_MB)
        valid = fuzz_group(nrng, f"s{SAMPLER_ID}-valid")
        assert codec.decode(frames_of(valid), DATA_LIMITS).group_id == valid.group_id
        # Which malformed messages name this sampler process in a valid header: its groups among them
        # are charged to its books as "rejected" (so they count in its groups_sent); the rest of what
        # names it is shown under its id in the message ledger, and all else under "unknown".
        named = [origin_of(frames) for _, frames, _ in cases]
        ours = sum(1 for o in named if o is not None and (o.sampler_id, o.incarnation) == (SAMPLER_ID, 0))
        tied = sum(1 for o in named
                   if o is not None and (o.sampler_id, o.incarnation, o.kind) == (SAMPLER_ID, 0, "group"))
        assert 0 < tied < ours < len(cases)
        t_gen = time.monotonic() - t_start

        deadline = time.monotonic() + 120
        while not (run_dir / "learner.ready").exists():
            assert proc.poll() is None, err_path.read_text()[-4000:]
            assert time.monotonic() < deadline, "learner.ready never appeared"
            time.sleep(0.1)

        push = ctx.socket(zmq.PUSH)
        # PUSH never drops: at its high-water mark a send blocks until the learner reads, so
        # every message below reaches the learner's decoder and the counts can be exact.
        push.setsockopt(zmq.SNDTIMEO, 120_000)
        push.setsockopt(zmq.LINGER, 30_000)
        push.connect(f"tcp://127.0.0.1:{data_port}")
        every = len(cases) // len(oversized)
        dropped_by_zmq = 0
        try:
            for i, (_, frames, _) in enumerate(cases):
                if i % every == every // 2 and i // every < len(oversized):
                    dropped_by_zmq += send_oversized(ctx, data_port, oversized[i // every])
                push.send_multipart(frames)
            # Same socket, so after every malformed message: the valid group, then the final status.
            # groups_sent counts the groups this sampler process sent: the valid one and its
            # malformed ones (docs/protocol.md section 5), never anything else.
            push.send_multipart(codec.encode(valid), copy=False)
            push.send_multipart(codec.encode(M.SamplerStatus(sampler_id=SAMPLER_ID, policy_version=0,
                                                         groups_sent=1 + tied, final=True, stats={})))
        except zmq.Again:
            pytest.fail(f"the learner stopped reading its data socket (exit code {proc.poll()}):\n"
                        + err_path.read_text(errors="replace")[-4000:])
        t_sent = time.monotonic() - t_start
        push.close()  # lingers until both have left
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        ctx.destroy(linger=0)
    stderr = err_path.read_text(errors="replace")
    assert rc == 0, stderr[-6000:]
    assert "Traceback" not in stderr, stderr[-6000:]
    assert dropped_by_zmq == len(oversized), "the learner did not hang up on every oversized message"

    summary = json.loads((run_dir / "summary.json").read_text())
    acc, ledger = summary["groups"], summary["messages"]["data"]
    rejected = ledger["by_reason"]
    print(f"\nfuzz data port: {len(cases)} malformed + {len(oversized)} oversized (dropped by libzmq) "
          f"+ 1 valid group; generated in {t_gen:.1f} s, all sent after {t_sent:.1f} s, learner exited "
          f"after {time.monotonic() - t_start:.1f} s")
    print("rejected by reason:", dict(sorted(rejected.items())))
    print("accounting:", acc)
    # Exact: PUSH blocks instead of dropping, and oversized messages went through their own
    # sockets, so every other message reached the decoder, and none was counted twice.
    assert rejected == dict(expected), (rejected, dict(expected))
    assert sum(rejected.values()) == len(cases) == ledger["rejected"]
    assert len(rejected) >= 10
    by_peer = {peer: sum(n.values()) for peer, n in ledger["by_peer"].items()}
    assert by_peer == {str(SAMPLER_ID): ours, "unknown": len(cases) - ours}, by_peer
    assert summary["steps"] == 1
    assert acc["trained"] == 1 and acc["received"] == 1 and acc["queued"] == 0
    # The group books hold only this process's groups: the valid one, trained, and its malformed
    # ones, dropped as rejected: sent (1 + tied) == trained (1) + rejected (tied) + queued (0).
    assert acc["dropped"] == {"rejected": tied}, acc["dropped"]
    assert acc["sent"] == 1 + tied and acc["balanced"] is True, acc
    assert summary["samplers"][str(SAMPLER_ID)]["final"] is True
    assert summary["samplers_without_final_status"] == []


# ----------------------------------------------------------------------------- 2. sync port


def test_fuzz_sync_port_from_sampler_side():
    t_start = time.monotonic()
    valid = make_weights(version=5, request_id=42)
    limits = M.weights_limits(sum(valid.bucket_nbytes))
    cases = sync_cases(N_SYNC, limits)
    expected = Counter(reason for _, _, reason in cases)

    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)  # an unroutable send raises instead of vanishing
    port = router.bind_to_random_port("tcp://127.0.0.1")
    client = SyncClient("127.0.0.1", port, limits, ctx=ctx)
    try:
        deadline = time.monotonic() + 30
        while not client.send(M.WeightsRequest(sampler_id=SAMPLER_ID, have_version=-1, request_id=42)):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert router.poll(30_000), "the client's weights_request never arrived"
        identity, *request = router.recv_multipart()
        assert codec.decode(request) == M.WeightsRequest(sampler_id=SAMPLER_ID, have_version=-1, request_id=42)

        so_far: Counter[str] = Counter()
        for i, (family, frames, reason) in enumerate(cases):
            # Lock-step: a ROUTER drops at its high-water mark, and a per-message check pins
            # each rejection on the message that caused it.
            router.send_multipart([identity, *frames])
            before = client.messages
            msg = client.receive(timeout_s=10.0)  # must return None, never raise
            assert msg is None, (i, family, msg)
            assert client.messages == before + 1, f"case {i} ({family}) never arrived"
            so_far[reason] += 1
            assert client.rejected == so_far, (i, family, reason, dict(client.rejected))
        assert client.rejected == expected

        router.send_multipart([identity, *codec.encode(valid)], copy=False)
        got = client.receive(timeout_s=10.0)
    finally:
        client.close()
        router.close(linger=0)
        ctx.destroy(linger=0)
    assert isinstance(got, M.WeightsAnnounce), got
    assert (got.version, got.request_id, got.method) == (5, 42, "tcp")
    assert got.layout == valid.layout
    assert got.bucket_dtypes == valid.bucket_dtypes and got.bucket_nbytes == valid.bucket_nbytes
    assert [bytes(b) for b in got.buckets] == [bytes(b) for b in valid.buckets]
    a = np.frombuffer(got.buckets[0], "<f4", count=6, offset=0).reshape(2, 3)
    np.testing.assert_array_equal(a, np.arange(6, dtype=np.float32).reshape(2, 3) * 0.5)
    print(f"\nfuzz sync port: {len(cases)} malformed answers, {time.monotonic() - t_start:.1f} s; "
          f"rejected by reason: {dict(sorted(client.rejected.items()))}")
    assert len(expected) >= 9, dict(expected)
