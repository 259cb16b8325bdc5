"""Loopback by default, a warning otherwise; CURVE keys: the right key gets through, no key or a wrong one gets nothing."""
import logging
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq
from netutil import free_ports

from grpo.wire import messages as M
from grpo.wire.curve import CLIENT, SERVER, Curve, KeysMissing, is_loopback, warn_if_exposed
from grpo.wire.transport import DataReceiver, DataSender, SyncClient, SyncServer

ROOT = Path(__file__).resolve().parents[2]


def make_keys(d: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grpo.wire.curve", str(d), *extra], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


@pytest.fixture
def keys(tmp_path):
    r = make_keys(tmp_path / "keys")
    assert r.returncode == 0, r.stderr
    return tmp_path / "keys"


def test_keys_command_makes_private_secrets_and_refuses_to_overwrite(keys):
    names = sorted(str(p.relative_to(keys)) for p in keys.rglob("*") if p.is_file())
    assert names == ["authorized_clients/client.key", "client.key", "client.key_secret", "server.key",
                     "server.key_secret"]
    for secret in ("client.key_secret", "server.key_secret"):
        assert stat.S_IMODE(os.stat(keys / secret).st_mode) == 0o600
    again = make_keys(keys)
    assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 1 and "--force" in again.stderr
    assert make_keys(keys, "--force").returncode == 0


def _deliver(ctx, port, receiver, curve, timeout_s=1.5) -> bool:
    """Does one group sent by a client with `curve` keys (None: plain) reach the receiver?"""
    sender = DataSender("127.0.0.1", port, hwm=4, ctx=ctx, curve=curve)
    try:
        ok = sender.send(M.SamplerStatus(1, 0, 0, False, {}), timeout_s=1.0)
        return ok and receiver.receive(timeout_s=timeout_s) is not None
    finally:
        sender.close(linger_s=0)


def test_curve_admits_only_authorized_clients(keys, tmp_path):
    other = tmp_path / "other"
    assert make_keys(other).returncode == 0
    (port, sync_port) = free_ports(2)
    ctx = zmq.Context()
    try:
        receiver = DataReceiver("127.0.0.1", port, M.Limits(), 1 << 20, ctx=ctx, curve=Curve(str(keys), SERVER))
        right = Curve(str(keys), CLIENT)
        # A stranger: its own client key pair, but it knows the learner's public key.
        wrong = Curve(str(other), CLIENT)
        wrong.server_public = right.server_public
        assert _deliver(ctx, port, receiver, right)
        assert not _deliver(ctx, port, receiver, None)
        assert not _deliver(ctx, port, receiver, wrong)
        assert _deliver(ctx, port, receiver, right)        # still serving the right key afterwards
        assert receiver.messages == 2            # the refused peers never reached the decoder

        # The sync channel too: a request and its answer over CURVE.
        server = SyncServer("127.0.0.1", sync_port, ctx=ctx, curve=Curve(str(keys), SERVER))
        client = SyncClient("127.0.0.1", sync_port, M.weights_limits(1 << 20), ctx=ctx, curve=right)
        deadline = time.monotonic() + 10
        while not client.send(M.WeightsRequest(sampler_id=0, have_version=0, request_id=7)):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        got = server.receive(timeout_s=5.0)
        assert got is not None and got[1] == M.WeightsRequest(0, 0, 7)
        server.reply(got[0], M.NoUpdate(version=0, request_id=7))
        assert client.receive(timeout_s=5.0) == M.NoUpdate(version=0, request_id=7)
        client.close()
        server.close()
        receiver.close()
    finally:
        Curve.stop_authenticators()
        ctx.destroy(linger=0)


def test_missing_keys_are_one_line_user_errors(tmp_path):
    with pytest.raises(KeysMissing, match="python -m grpo.wire.curve"):
        Curve(str(tmp_path), SERVER)
    with pytest.raises(KeysMissing, match="client.key_secret"):
        Curve(str(tmp_path), CLIENT)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    r = subprocess.run([sys.executable, "sampling_worker.py", "--device", "cpu", "--curve-keys", str(tmp_path),
                        "--run-dir", str(tmp_path / "run")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "grpo.wire.curve" in r.stderr


def test_loopback_is_quiet_anything_else_warns(caplog):
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "::1", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "10.1.2.3", "::", "example.org"))
    with caplog.at_level(logging.WARNING):
        warn_if_exposed("127.0.0.1", None)
        assert caplog.records == []
        warn_if_exposed("0.0.0.0", None)
    assert len(caplog.records) == 1 and "--curve-keys" in caplog.records[0].getMessage()
