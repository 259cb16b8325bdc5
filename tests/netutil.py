"""Helpers shared by the tests that open real sockets."""
import socket


def free_ports(n: int) -> list[int]:
    """n distinct loopback ports that are free now (all held open until each is known)."""
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports
