"""Both ports a learner binds (--data-port, --sync-port) are tried before either is refused: with
both taken (another run still going), the launcher, a learner started alone and the smoke test
each name both in one line, exit code 2, rather than the second only after the first is freed."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from grpo.wire.ports import busy_ports_line
from grpo.wire.transport import PortInUse, bind_each

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


@contextlib.contextmanager
def two_busy_ports():
    """Two loopback ports with a listener each (what another run's learner holds)."""
    socks = []
    try:
        for _ in range(2):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            s.listen()
            socks.append(s)
        yield [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def both_named(line: str, data: int, sync: int) -> bool:
    return (f"ports {data} (--data-port) and {sync} (--sync-port) on 127.0.0.1 are already in use" in line
            and line.endswith("stop what holds them or pass --data-port N --sync-port M"))


def refused(args: list[str], cwd: Path) -> str:
    r = subprocess.run([PY, *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    errors = [x for x in r.stderr.splitlines() if "error:" in x]
    assert len(errors) == 1, r.stderr
    return errors[0]


def test_the_launcher_names_both_busy_ports(tmp_path):
    with two_busy_ports() as (data, sync):
        line = refused([str(ROOT / "run_distributed.py"), "--device", "cpu",
                        "--data-port", str(data), "--sync-port", str(sync)], tmp_path)
    assert line.startswith("run_distributed.py: error: ") and both_named(line, data, sync), line
    assert list(tmp_path.iterdir()) == []


def test_a_learner_started_alone_names_both_busy_ports(tmp_path, config_folder):
    """It binds before loading its model (a folder holding only config.json is enough to get there),
    and removes the run folder it made."""
    with two_busy_ports() as (data, sync):
        line = refused([str(ROOT / "training_worker.py"), "--device", "cpu", "--no-deepspeed", "--model",
                        str(config_folder), "--run-dir", str(tmp_path / "run"), "--data-port", str(data),
                        "--sync-port", str(sync)], tmp_path)
    assert line.startswith("training_worker.py: error: ") and both_named(line, data, sync), line
    assert [p.name for p in tmp_path.iterdir()] == ["m"]   # the model folder only


def test_the_smoke_test_names_both_busy_ports(tmp_path):
    with two_busy_ports() as (data, sync):
        line = refused([str(ROOT / "communication_test.py"), "--data-port", str(data), "--sync-port", str(sync)],
                       tmp_path)
    assert line.startswith("communication_test.py: error: ") and both_named(line, data, sync), line


def test_one_busy_port_is_named_alone():
    assert busy_ports_line("127.0.0.1", [(5556, "--sync-port")]) == (
        "port 5556 on 127.0.0.1 is already in use (another run?); stop what holds it or pass --sync-port N")


def test_bind_each_closes_what_it_bound_and_keeps_another_reason_as_it_is():
    closed = []

    class Sock:
        def close(self):
            closed.append(self)

    def taken(port, flag):
        def bind():
            raise PortInUse(busy_ports_line("h", [(port, flag)]), "h", [(port, flag)])
        return bind

    with pytest.raises(PortInUse, match=r"ports 1 \(--data-port\) and 2 \(--sync-port\) on h") as e:
        bind_each(taken(1, "--data-port"), Sock, taken(2, "--sync-port"))
    assert e.value.busy == [(1, "--data-port"), (2, "--sync-port")] and len(closed) == 1

    def bad_host():
        raise PortInUse("cannot bind nowhere:1: no such device; pass --data-port with a free port or fix --host")

    with pytest.raises(PortInUse, match="fix --host"):
        bind_each(bad_host, taken(2, "--sync-port"))
    assert len(bind_each(Sock, Sock)) == 2


def test_the_rendezvous_port_is_never_one_the_run_binds_later(monkeypatch):
    """free_port(avoid=...): the OS may hand out the run's data or sync port while nothing listens on
    it yet; such an answer is asked again, and 64 such answers in a row are an OSError."""
    import grpo.wire.ports as ports

    answers = iter([5556, 5555, 5556, 41234])

    class Sock:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, addr):
            self.port = next(answers)

        def getsockname(self):
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(ports.socket, "socket", Sock)
    assert ports.free_port(avoid=(5555, 5556)) == 41234
    answers = iter([5555] * 64)
    with pytest.raises(OSError, match="no free port outside"):
        ports.free_port(avoid=(5555,))
