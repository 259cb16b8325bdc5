"""The launcher reaches its workers' start without importing torch: it counts GPUs by asking the
CUDA driver library (ctypes), since torch's import alone held every worker back by seconds."""
import ctypes
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from netutil import free_port_run

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
        busy.bind(("127.0.0.1", free_port_run(2)))   # and the next one (the sync port) free
        busy.listen()
        port = busy.getsockname()[1]
        out = subprocess.run([sys.executable, "-c", code, "--device", "auto", "--data-port", str(port),
                              "--sync-port", str(port + 1)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert f"port {port} on 127.0.0.1 is already in use" in out.stderr, out.stderr
    rc, counts, heavy = out.stdout.splitlines()[-1].split(maxsplit=2)   # after the launcher's own lines
    assert (rc, counts) == ("2", "1"), out.stdout   # exit 2 after counting the GPUs once
    assert heavy.strip() == "[]", f"the launcher imported {heavy.strip()} before starting any worker"


def test_missing_bytecode_looks_where_the_interpreter_would(tmp_path, monkeypatch):
    """A package's top module without bytecode is named; once compiled it is not; under a
    PYTHONPYCACHEPREFIX (sys.pycache_prefix) the bytecode beside the source does not count."""
    import py_compile

    from grpo.launch.main import missing_bytecode

    pkg = tmp_path / "fakepkg_bc"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "pycache_prefix", None)
    assert missing_bytecode(("fakepkg_bc", "no_such_package_bc")) == ["fakepkg_bc"]   # not installed: not named
    py_compile.compile(str(pkg / "__init__.py"))
    assert missing_bytecode(("fakepkg_bc",)) == []
    monkeypatch.setattr(sys, "pycache_prefix", str(tmp_path / "prefix"))
    assert missing_bytecode(("fakepkg_bc",)) == ["fakepkg_bc"]


def test_missing_bytecode_imports_nothing_heavy():
    code = ("import sys\nfrom grpo.launch.main import missing_bytecode\nmissing_bytecode()\n"
            f"print(sorted(n for n in {HEAVY!r} if n in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_bytecode_warning_only_where_nothing_will_write_it():
    from grpo.launch.main import bytecode_warning

    assert bytecode_warning(False, ["torch"]) is None    # the first run writes it
    assert bytecode_warning(True, []) is None
    line = bytecode_warning(True, ["torch", "transformers"])
    assert line.startswith("torch, transformers have no bytecode and PYTHONDONTWRITEBYTECODE (or python -B) is set")
    assert "PYTHONPYCACHEPREFIX" in line and "\n" not in line
    assert bytecode_warning(True, ["torch"]).startswith("torch has no bytecode")
