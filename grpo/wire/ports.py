"""The one line for ports that are taken, said alike by the launcher (which asks before anything
starts, torch- and zmq-free), the learner (which binds them) and the smoke test. Every port is
tried before any is refused, so a user with both the data and the sync port taken (another run
still going) learns of both at once, not of the second after freeing the first."""
from __future__ import annotations


def busy_ports_line(host: str, busy: list[tuple[int, str]]) -> str:
    """`busy`: (port, the flag that changes it) for each port found taken."""
    if len(busy) == 1:
        (port, flag), = busy
        return f"port {port} on {host} is already in use (another run?); stop what holds it or pass {flag} N"
    ports = " and ".join(f"{port} ({flag})" for port, flag in busy)
    flags = " ".join(f"{flag} {chr(ord('N') - i)}" for i, (_, flag) in enumerate(busy))
    return f"ports {ports} on {host} are already in use (another run?); stop what holds them or pass {flags}"
