"""Helpers shared by tests: free loopback ports, and a one-thread fixture for CPU-heavy modules."""
import socket

import pytest
import torch


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


def free_port_run(n: int) -> int:
    """The first of n consecutive loopback ports that are free now (for flags that take base, base + 1, ...)."""
    for _ in range(100):
        (base,) = free_ports(1)
        if base + n > 65536:
            continue
        socks = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports found")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The test machine's cores are shared: one intra-op thread avoids oversubscription.

    Import it into a test module to apply it to that module's tests."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
