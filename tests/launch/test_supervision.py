"""Launcher supervision with real processes: restart a dead sampler, stop on failure, SIGTERM, no orphans."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from netutil import free_ports

ROOT = Path(__file__).resolve().parents[2]
GSM8K = ROOT.parent / "shared" / "data" / "gsm8k"


def start(run_dir, ports, *extra):
    env = dict(os.environ, PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    args = [sys.executable, "run_distributed.py", "--device", "cpu", "--model", "tiny-random", "--no-deepspeed",
            "--dataset", str(GSM8K), "--num-generations", "2", "--prompts-per-round", "1", "--train-batch-size", "2",
            "--max-new-tokens", "4", "--max-steps", "100000", "--save-every", "0", "--data-port", str(ports[0]),
            "--sync-port", str(ports[1]), "--run-dir", str(run_dir), *extra]
    return subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def pids(run_dir):
    try:
        return json.loads((run_dir / "pids.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def sampler_running(run_dir):
    log = run_dir / "sampler0.log"
    return "sampler0" in pids(run_dir) and log.exists() and "round 0" in log.read_text(errors="replace")


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def assert_clean(all_pids, ports):
    assert not [p for p in all_pids if alive(p)], "orphans left"
    for port in ports:
        with socket.socket() as s:       # what a new run's learner does: bind the port again
            # ZeroMQ binds with SO_REUSEADDR (and so does the launcher's port check): connections
            # of the old run left in TIME_WAIT do not block it, a process still listening does.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
            s.listen()


def finish(proc, timeout=120):
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return out


@pytest.mark.slow
def test_dead_sampler_is_restarted_then_failure_stops_everything(tmp_path):
    ports, run_dir = free_ports(2), tmp_path / "run"
    proc = start(run_dir, ports, "--restart-samplers", "1")
    seen = set()
    try:
        wait_for(lambda: sampler_running(run_dir), 300, "the sampler's first round")
        first = pids(run_dir)
        seen |= set(first.values()) - {first["launcher"]}
        os.kill(first["sampler0"], signal.SIGKILL)
        wait_for(lambda: pids(run_dir).get("sampler0") not in (None, first["sampler0"]), 60, "a restarted sampler")
        second = pids(run_dir)
        seen |= set(second.values()) - {second["launcher"]}
        assert second["learner0"] == first["learner0"]          # the learner kept running
        os.kill(second["sampler0"], signal.SIGKILL)              # no restarts left: the run stops
        out = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out
    assert "sampler0 was killed by SIGKILL; restarting it (1 of 1)" in out
    assert "sampler0 was killed by SIGKILL; stopping the run. Last lines of sampler0.log:" in out
    assert "round 0" in out.split("stopping the run")[1]       # the tail of its log is shown
    assert_clean(seen, ports)


@pytest.mark.slow
def test_sigterm_stops_every_process_and_frees_the_ports(tmp_path):
    ports, run_dir = free_ports(2), tmp_path / "run"
    proc = start(run_dir, ports)
    try:
        wait_for(lambda: sampler_running(run_dir), 300, "the sampler's first round")
        children = [p for n, p in pids(run_dir).items() if n != "launcher"]
        assert len(children) == 2
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out = finish(proc, timeout=90)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert "SIGTERM: stopping every process" in out
    assert took < 60, took
    assert_clean(children, ports)
