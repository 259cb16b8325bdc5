"""Ports, torch- and zmq-free so that the launcher asks before anything starts: a free one,
whether one is taken, and the one line for those taken, said alike by the launcher, the learner
(which binds them) and the smoke test. Every port is tried before any is refused, so a user with
both the data and the sync port taken (another run still going) learns of both at once, not of
the second after freeing the first."""
from __future__ import annotations

import socket


class PortInUse(Exception):
    """A port we must bind is taken; the message names the flag that changes it. `busy`: (port, flag)
    of each port found taken, empty for another reason not to bind (bind_each joins them). Here, not
    in grpo.wire.transport: the workers name it before zmq loads."""

    def __init__(self, message: str, host: str = "", busy: list[tuple[int, str]] | None = None):
        super().__init__(message)
        self.host, self.busy = host, list(busy or [])


def free_port(host: str = "127.0.0.1", avoid: tuple[int, ...] = ()) -> int:
    """A TCP port the OS says is free now (the learner ranks' rendezvous, NCCL's store, tests), none of
    `avoid`: ports the run will bind later (its data and sync ports), which the OS can hand out
    while nothing listens on them yet (a learner's rendezvous once took its own sync port)."""
    for _ in range(64):
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in avoid:
            return port
    raise OSError(f"no free port outside {sorted(avoid)} on {host} after 64 tries")


def port_in_use(host: str, port: int) -> bool:
    """Whether binding `port` fails now (SO_REUSEADDR, as ZeroMQ binds: a closed run's connections
    in TIME_WAIT do not count, a process still listening does)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def busy_ports_line(host: str, busy: list[tuple[int, str]]) -> str:
    """`busy`: (port, the flag that changes it) for each port found taken."""
    if len(busy) == 1:
        (port, flag), = busy
        return f"port {port} on {host} is already in use (another run?); stop what holds it or pass {flag} N"
    ports = " and ".join(f"{port} ({flag})" for port, flag in busy)
    flags = " ".join(f"{flag} {chr(ord('N') - i)}" for i, (_, flag) in enumerate(busy))
    return f"ports {ports} on {host} are already in use (another run?); stop what holds them or pass {flags}"
