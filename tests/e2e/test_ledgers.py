"""The two ledgers under bad input, with a real learner process and real sockets.

Groups (per sampler process) must balance whatever arrives: a sampler that sends malformed
groups and then vanishes without its final status, junk from a socket that is no sampler, a
status corrupted on the wire. Rejected messages are in the message ledger, by reason and peer,
and never also in the group books.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq
from builders import make_group, make_status
from netutil import free_ports

from grpo.wire import codec

ROOT = Path(__file__).resolve().parents[2]
SID, INC = 3, 777   # the scripted sampler's id and incarnation


class Learner:
    """A CPU learner process (tiny model) started for one test, before that test runs."""

    def __init__(self, folder: Path, data: int, sync: int, steps: int = 3):
        self.data, self.run_dir, self.log = data, folder / "run", folder / "learner.log"
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        self.err = open(self.log, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "training_worker.py"), "--device", "cpu", "--model", "tiny-random",
             "--no-deepspeed", "--num-generations", "2", "--train-batch-size", "2", "--max-steps", str(steps),
             "--max-new-tokens", "8", "--heartbeat-timeout-s", "1.5", "--shutdown-timeout-s", "30",
             "--report-to", "none", "--data-port", str(data), "--sync-port", str(sync), "--run-dir",
             str(self.run_dir)],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=self.err)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.err.close()


class Learners:
    """The learners of this module's tests selected in this session, each started one test ahead:
    while a test drives its learner, the next test's starts (imports, the model, the first
    publish), so the starts overlap the tests instead of adding up."""

    def __init__(self, names: list[str], tmp_path_factory):
        self.names, self.factory, self.started = names, tmp_path_factory, {}

    def _start(self, name: str) -> None:
        if name not in self.started:
            self.started[name] = Learner(self.factory.mktemp(name[:40]), *free_ports(2))

    def __getitem__(self, name: str) -> Learner:
        self._start(name)
        i = self.names.index(name)
        if i + 1 < len(self.names):
            self._start(self.names[i + 1])
        return self.started[name]


@pytest.fixture(scope="module")
def learners(request, tmp_path_factory):
    names = [item.name for item in request.session.items if item.module is request.module]
    ahead = Learners(names, tmp_path_factory)
    try:
        yield ahead
    finally:
        for learner in ahead.started.values():
            learner.stop()


@contextlib.contextmanager
def learner_run(learners: Learners, request):
    """This test's learner, ready for groups, and a way to open PUSH sockets to it; yields
    (connect, result) where result["summary"] is its summary.json once it has finished."""
    learner = learners[request.node.name]
    proc, run_dir, log = learner.proc, learner.run_dir, learner.log
    ctx = zmq.Context()
    result: dict = {}

    def connect() -> zmq.Socket:
        s = ctx.socket(zmq.PUSH)
        s.connect(f"tcp://127.0.0.1:{learner.data}")
        return s

    try:
        stage = run_dir / "stages" / "learner0.json"
        # generous: two learners start at once on a machine that may be shared
        deadline = time.monotonic() + 600
        while not (stage.exists() and json.loads(stage.read_text())["stage"] == "weights_published"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        yield connect, result
        assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]
        result["summary"] = json.loads((run_dir / "summary.json").read_text())
    finally:
        learner.stop()
        ctx.destroy(linger=0)


def valid(i: int):
    return make_group([[5, 6], [7]], [1, 2, 3], rewards=[1.0, 0.0], sampler_id=SID, incarnation=INC,
                      group_id=f"v{i}")


def malformed(i: int) -> list[bytes]:
    """A group of this process whose header is valid but whose first log-prob is +1 (bad_log_prob)."""
    frames = [bytes(f) for f in codec.encode(valid(100 + i))]
    lp = bytearray(frames[4])   # old_policy_log_probs
    lp[0:4] = np.float32(1.0).tobytes()
    frames[4] = bytes(lp)
    return frames


@pytest.mark.slow
def test_sampler_sends_malformed_groups_then_vanishes(learners, request):
    with learner_run(learners, request) as (connect, result):
        s = connect()
        for i in range(3):
            s.send_multipart(codec.encode(valid(i)))
            s.send_multipart(malformed(2 * i))
            s.send_multipart(malformed(2 * i + 1))
        for i in range(2):
            s.send_multipart(malformed(6 + i))
        s.send_multipart(codec.encode(make_status(SID, INC, groups_sent=11)))   # 3 valid + 8 malformed
        s.close(linger=5000)   # and gone: no final status
    summary = result["summary"]
    acc = summary["groups"]
    assert acc == {"received": 3, "trained": 3, "dropped": {"rejected": 8}, "queued": 0, "sent": 11,
                   "balanced": True}
    [row] = summary["incarnations"]
    assert (row["sent"], row["received"], row["rejected"], row["lost_in_flight"], row["final"]) == (11, 3, 8, 0, False)
    assert summary["messages"] == {"data": {"rejected": 8, "by_reason": {"bad_log_prob": 8},
                                            "by_peer": {str(SID): {"bad_log_prob": 8}}}}


def junk(r: random.Random) -> list[bytes]:
    """One message from no sampler: noise, garbage msgpack, or made-up senders with broken content."""
    kind = r.randrange(5)
    if kind == 0:
        return [r.randbytes(r.randrange(1, 200))]
    if kind == 1:
        return [msgpack.packb({"schema": 2, "kind": "group", "junk": r.random()}), r.randbytes(8)]
    if kind == 2:   # a plausible group from a process that never spoke validly
        frames = [bytes(f) for f in codec.encode(make_group(sampler_id=r.randrange(8), incarnation=r.getrandbits(40)))]
        return frames[:-1]   # a frame short
    if kind == 3:   # a status with a NaN
        h = msgpack.unpackb(bytes(codec.encode(make_status(r.randrange(8), r.getrandbits(40)))[0]))
        h["stats"] = {"x": float("nan")}
        return [msgpack.packb(h)]
    return [msgpack.packb({"schema": 2, "kind": "weights_request", "sampler_id": -1})]


@pytest.mark.slow
def test_junk_from_a_socket_that_is_no_sampler(learners, request):
    r = random.Random(7)
    with learner_run(learners, request) as (connect, result):
        scan = connect()
        for _ in range(2000):
            scan.send_multipart(junk(r))
        scan.close(linger=10_000)
        time.sleep(3)   # the learner reads all of it while it waits for groups
        s = connect()
        for i in range(3):
            s.send_multipart(codec.encode(valid(i)))
        s.send_multipart(codec.encode(make_status(SID, INC, groups_sent=3, final=True)))
        s.close(linger=5000)
    summary = result["summary"]
    assert summary["groups"] == {"received": 3, "trained": 3, "dropped": {}, "queued": 0, "sent": 3,
                                 "balanced": True}
    data = summary["messages"]["data"]
    assert data["rejected"] == 2000 and set(data["by_peer"]) == {"unknown"}
    assert [row["sampler_id"] for row in summary["incarnations"]] == [SID]   # junk made no book entries


@pytest.mark.slow
def test_final_status_corrupted_on_the_wire(learners, request):
    with learner_run(learners, request) as (connect, result):
        s = connect()
        for i in range(3):
            s.send_multipart(codec.encode(valid(i)))
        s.send_multipart(codec.encode(make_status(SID, INC, groups_sent=3)))
        final = msgpack.unpackb(bytes(codec.encode(make_status(SID, INC, groups_sent=3, final=True))[0]))
        final["stats"] = {"tokens": float("inf")}   # one bad number: the whole status is refused
        s.send_multipart([msgpack.packb(final)])
        s.close(linger=5000)
    summary = result["summary"]
    assert summary["groups"] == {"received": 3, "trained": 3, "dropped": {}, "queued": 0, "sent": 3,
                                 "balanced": True}
    assert summary["samplers_without_final_status"] == [SID]   # gone after --heartbeat-timeout-s
    assert summary["messages"] == {"data": {"rejected": 1, "by_reason": {"non_finite": 1},
                                            "by_peer": {str(SID): {"non_finite": 1}}}}


def wrong_schema(i: int) -> list[bytes]:
    """A valid group of this process, but its header says another schema: refused before the
    learner reads who sent it, so the message ledger books it under "unknown"."""
    frames = [bytes(f) for f in codec.encode(valid(200 + i))]
    h = msgpack.unpackb(frames[0])
    h["schema"] = 99
    return [msgpack.packb(h), *frames[1:]]


@pytest.mark.slow
def test_a_group_that_arrives_unattributable_is_named_in_the_summary(learners, request):
    """3 valid groups and 1 with a wrong schema, then a final status saying 4 sent: the books are
    honestly not balanced (sent 4, accounted 3), and the summary and the learner's last log line
    say which sampler's group it was and what the learner made of it."""
    with learner_run(learners, request) as (connect, result):
        s = connect()
        for i in range(3):
            s.send_multipart(codec.encode(valid(i)))
        s.send_multipart(wrong_schema(0))
        s.send_multipart(codec.encode(make_status(SID, INC, groups_sent=4, final=True)))
        s.close(linger=5000)
    summary = result["summary"]
    assert summary["groups"] == {"received": 3, "trained": 3, "dropped": {}, "queued": 0, "sent": 4,
                                 "balanced": False}
    assert summary["messages"] == {"data": {"rejected": 1, "by_reason": {"bad_schema": 1},
                                            "by_peer": {"unknown": {"bad_schema": 1}}}}
    text = f"balanced except 1 group sent by sampler {SID} that arrived as an unattributable message: bad_schema 1"
    assert summary["balance"] == {"text": text, "gap": 1, "learner_gap": 0, "explained": True,
                                  "unattributable": {"bad_schema": 1},
                                  "by_process": [{"sampler_id": SID, "incarnation": INC, "sent": 4, "accounted": 3,
                                                  "gap": 1}]}
    last = [line for line in learners[request.node.name].log.read_text().splitlines() if "accounting: sent" in line]
    assert len(last) == 1 and last[0].endswith("-> " + text), last
