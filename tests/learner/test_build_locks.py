"""No silent hang at start: a DeepSpeed op build lock left by a stopped process is removed, a live
one is waited for with a word every few seconds and a bound, and the launcher names a process
that has not reached its next startup stage."""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from netutil import free_ports

from grpo.learner.engine import ConfigError, clear_build_locks, lock_holders
from grpo.obs.stages import overdue

ROOT = Path(__file__).resolve().parents[2]
HOLD = ("import os, sys, time; fd = os.open(sys.argv[1], os.O_CREAT | os.O_EXCL); print('held', flush=True); "
        "time.sleep(float(sys.argv[2])); os.close(fd); os.remove(sys.argv[1])")


def holder(lock: Path, seconds: float) -> subprocess.Popen:
    """A process that builds the way torch's FileBaton does: the lock file open until it is done."""
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(lock), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_stale_lock_is_removed(tmp_path, caplog):
    lock = tmp_path / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir()
    lock.write_text("")                  # left behind: no process has it open
    assert lock_holders(lock) == []
    with caplog.at_level(logging.INFO, logger="grpo.learner.engine"):
        assert clear_build_locks(tmp_path) == [lock]
    assert not lock.exists()
    assert f"removed a stale build lock {lock}" in caplog.text


def test_a_live_build_is_waited_for_with_a_word(tmp_path, caplog):
    lock = tmp_path / "op" / "lock"
    lock.parent.mkdir()
    p = holder(lock, 2.5)
    try:
        assert lock_holders(lock) == [p.pid]
        t0 = time.monotonic()
        with caplog.at_level(logging.INFO, logger="grpo.learner.engine"):
            assert clear_build_locks(tmp_path, note_every_s=0.5) == []   # the builder removes its own lock
        assert 2.0 < time.monotonic() - t0 < 15
        assert f"waiting for pid(s) {p.pid}, which hold {lock}" in caplog.text
    finally:
        p.kill()
        p.wait()


def test_a_build_that_never_ends_is_named_after_the_bound(tmp_path):
    lock = tmp_path / "op" / "lock"
    lock.parent.mkdir()
    p = holder(lock, 60)
    try:
        with pytest.raises(ConfigError) as exc:
            clear_build_locks(tmp_path, timeout_s=1.0, note_every_s=0.5)
        msg = str(exc.value)
        assert str(lock) in msg and str(p.pid) in msg and f"kill {p.pid}" in msg and "\n" not in msg
        assert lock.exists()             # a live builder's lock is never taken away
    finally:
        p.kill()
        p.wait()


def test_overdue_by_hand():
    started = {"learner0": 100.0, "sampler0": 100.0}
    reached = {"learner0": ("bound", 105.0), "sampler0": ("model_loaded", 90.0)}   # sampler0's is an old one
    noted: dict[str, float] = {}
    assert overdue(started, reached, now=150.0, bound_s=60, noted=noted) == []
    late = overdue(started, reached, now=170.0, bound_s=60, noted=noted)
    assert [(p, last, nxt, round(w)) for p, last, nxt, _, w in late] == [
        ("learner0", "bound", "engine_ready", 65), ("sampler0", "(none)", "started", 70)]
    assert overdue(started, reached, now=171.0, bound_s=60, noted=noted) == []   # said once per bound
    assert len(overdue(started, reached, now=240.0, bound_s=60, noted=noted)) == 2
    done = {"learner0": ("first_step", 110.0), "sampler0": ("first_group", 110.0)}
    assert overdue(started, done, now=1e6, bound_s=60, noted={}) == []           # past the last stage


@pytest.mark.slow
def test_a_stuck_learner_says_so_and_the_launcher_names_it(tmp_path):
    """A real run whose learner finds a DeepSpeed build lock held by another process: the learner
    logs what it waits for, and the launcher names it and the stage it has not reached."""
    ext = tmp_path / "ext"
    stale = ext / "stale_op" / "lock"
    stale.parent.mkdir(parents=True)
    stale.write_text("")
    lock = ext / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir()
    p = holder(lock, 120)
    data, sync = free_ports(2)
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(ext), CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
    run_dir = tmp_path / "run"
    launcher = subprocess.Popen(
        [sys.executable, str(ROOT / "run_distributed.py"), "--device", "cpu", "--model", "tiny-random",
         "--dataset", "rg:basic_arithmetic", "--max-steps", "1", "--stage-timeout-s", "3", "--data-port", str(data),
         "--sync-port", str(sync), "--run-dir", str(run_dir)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            line = launcher.stdout.readline()
            assert line, "".join(lines[-30:])
            lines.append(line)
            if "learner0 has not reached 'engine_ready'" in line:
                break
        else:
            pytest.fail("the launcher never named the stuck learner:\n" + "".join(lines[-30:]))
        assert "(last stage: bound)" in lines[-1]
        log = (run_dir / "learner0.log").read_text()
        assert f"removed a stale build lock {stale}" in log
        assert f"waiting for pid(s) {p.pid}, which hold {lock}" in log
    finally:
        os.killpg(launcher.pid, signal.SIGTERM)
        launcher.wait(timeout=60)
        p.kill()
        p.wait()
