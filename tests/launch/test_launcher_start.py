"""The launcher reaches its workers' start without importing torch: it counts GPUs by asking the
CUDA driver library (ctypes), since torch's import alone held every worker back by seconds."""
import ctypes
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from grpo.launch.main import cuda_device_count

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "deepspeed", "datasets", "reasoning_gym", "numpy", "zmq")


def driver_loads() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def test_cuda_device_count_agrees_with_torch():
    import torch

    expected = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert cuda_device_count() == expected
    if not driver_loads():   # a CPU machine (no libcuda.so.1): no GPUs, no error
        assert cuda_device_count() == 0


def test_cuda_device_count_honours_cuda_visible_devices():
    code = "from grpo.launch.main import cuda_device_count; print(cuda_device_count())"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "0", out.stderr


class FakeDriver:
    def __init__(self, init_result: int, count: int):
        self.init_result, self.count = init_result, count

    def cuInit(self, flags):
        assert flags == 0
        return self.init_result

    def cuDeviceGetCount(self, ref):
        ref._obj.value = self.count
        return 0


@pytest.mark.parametrize("init_result,count,expected", [(0, 3, 3), (100, 3, 0), (999, 0, 0)])
def test_cuda_device_count_reads_the_driver(monkeypatch, init_result, count, expected):
    """CUDA_SUCCESS: the driver's count; CUDA_ERROR_NO_DEVICE (100) or any other failure: 0."""
    opened = []
    monkeypatch.setattr(ctypes, "CDLL", lambda name: opened.append(name) or FakeDriver(init_result, count))
    assert cuda_device_count() == expected
    assert opened == ["libcuda.so.1"]


def test_no_driver_library_means_no_gpus(monkeypatch):
    def missing(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", missing)
    assert cuda_device_count() == 0


def test_launcher_counts_gpus_and_checks_everything_without_torch():
    """main() with --device auto counts GPUs, plans, checks the sampler's flags, --resume and the
    ports, and fails on the busy data port: the last check before any worker starts. In a fresh
    interpreter, so that no other test's imports count."""
    code = ("import sys\n"
            "from grpo.launch import main as m\n"
            "counted = []\n"
            "count = m.cuda_device_count\n"
            "m.cuda_device_count = lambda: counted.append(1) or count()\n"
            "rc = m.main(sys.argv[1:])\n"
            f"print(rc, len(counted), sorted(n for n in {HEAVY!r} if n in sys.modules))\n")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = subprocess.run([sys.executable, "-c", code, "--device", "auto", "--data-port", str(port),
                              "--sync-port", str(port + 1)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert f"port {port} on 127.0.0.1 is already in use" in out.stderr, out.stderr
    rc, counts, heavy = out.stdout.split(maxsplit=2)
    assert (rc, counts) == ("2", "1"), out.stdout   # exit 2 after counting the GPUs once
    assert heavy.strip() == "[]", f"the launcher imported {heavy.strip()} before starting any worker"
