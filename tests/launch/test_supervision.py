"""Launcher supervision with real processes: restart a dead sampler, stop on failure, SIGTERM, no orphans."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from faultutil import alive, finish
from netutil import free_ports

ROOT = Path(__file__).resolve().parents[2]
GSM8K = ROOT.parent / "shared" / "data" / "gsm8k"


def start(run_dir, ports, *extra):
    env = dict(os.environ, PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    args = [sys.executable, "run_distributed.py", "--device", "cpu", "--model", "tiny-random", "--no-deepspeed",
            "--dataset", str(GSM8K), "--num-generations", "2", "--prompts-per-round", "1", "--train-batch-size", "2",
            "--max-new-tokens", "4", "--max-steps", "100000", "--save-every", "0", "--data-port", str(ports[0]),
            "--sync-port", str(ports[1]), "--run-dir", str(run_dir), *extra]
    # The launcher's output goes to a file (finish reads it): a run may go on for a while before its
    # test looks at it, and a full pipe would block the launcher's status lines.
    out_path = run_dir.parent / "launcher.out"
    with open(out_path, "w") as out:
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
    proc.out_path = out_path
    return proc


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


def assert_clean(all_pids, ports):
    assert not [p for p in all_pids if alive(p)], "orphans left"
    for port in ports:
        with socket.socket() as s:       # what a new run's learner does: bind the port again
            # ZeroMQ binds with SO_REUSEADDR (and so does the launcher's port check): connections
            # of the old run left in TIME_WAIT do not block it, a process still listening does.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
            s.listen()


# The runs of the two tests below, by test name: each test's launcher arguments beyond start()'s.
RUNS = {"test_dead_sampler_is_restarted_then_failure_stops_everything": ["--restart-samplers", "1"],
        "test_sigterm_stops_every_process_and_frees_the_ports": []}


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
    """{test name: (launcher process, run dir, ports)} for the tests of RUNS selected in this session,
    all started at once: the runs' starts (imports, the model) overlap instead of adding up. Each test
    ends its own run; what is still running at the module's end is killed."""
    names = [item.originalname for item in request.session.items
             if item.module is request.module and item.originalname in RUNS]
    ports = free_ports(2 * len(names))
    started = {}
    try:
        for i, name in enumerate(names):
            run_dir = tmp_path_factory.mktemp(name[5:25]) / "run"
            started[name] = (start(run_dir, ports[2 * i:2 * i + 2], *RUNS[name]), run_dir, ports[2 * i:2 * i + 2])
        yield started
    finally:
        for proc, _, _ in started.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.slow
def test_dead_sampler_is_restarted_then_failure_stops_everything(runs):
    proc, run_dir, ports = runs["test_dead_sampler_is_restarted_then_failure_stops_everything"]
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
def test_sigterm_stops_every_process_and_frees_the_ports(runs):
    proc, run_dir, ports = runs["test_sigterm_stops_every_process_and_frees_the_ports"]
    try:
        # a trained step, so that the stop has one to save
        wait_for(lambda: sampler_running(run_dir) and (run_dir / "metrics.jsonl").exists(), 300,
                 "the sampler's first round and the learner's first step")
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
    # the learner saves (tests/e2e/test_stop_keeps_work.py checks what), then every process ends
    assert "SIGTERM: the learner finishes the step in hand, saves it" in out
    assert "[launcher] SIGTERM: saved step " in out
    assert took < 60, took
    assert_clean(children, ports)


def exited(pid):
    """Gone, or a zombie its parent (the launcher) has not reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.slow
def test_a_learner_that_finishes_ends_the_run_cleanly(tmp_path):
    """1 step of 1 group; rounds of 2 prompts (4 rows x 300 new tokens, then a teacher-forced pass
    over them, many seconds on CPU) under a bound that would allow 11 groups ahead. The learner's
    budget stops at the one group its one step trains, so the sampler makes its round 0 (one prompt
    where the learner's first answer came before it, else two) and no other, and waits (budget 0)
    until the learner has finished. It stops within 5 s of the
    learner's stop; the launcher exits 0; the books balance with nothing queued; the summary
    carries every process's stage history and the seconds to the first step. (A round the learner's
    stop cuts short is abandoned: tests/sampler/test_sampler_end.py.)"""
    ports, run_dir = free_ports(2), tmp_path / "run"
    env = dict(os.environ, PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [sys.executable, "run_distributed.py", "--device", "cpu", "--model", "tiny-random", "--no-deepspeed",
         "--dataset", str(GSM8K), "--num-generations", "2", "--prompts-per-round", "2", "--train-batch-size", "2",
         "--max-new-tokens", "300", "--max-staleness", "10",   # the bound alone: 11 groups ahead
         "--max-steps", "1", "--stop-timeout-s", "5", "--data-port", str(ports[0]),
         "--sync-port", str(ports[1]), "--run-dir", str(run_dir)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out_lines: list[str] = []
    reader = threading.Thread(target=lambda: out_lines.extend(proc.stdout), daemon=True)
    reader.start()
    t_stop = t_exit = None
    deadline = time.monotonic() + 300
    try:
        while proc.poll() is None:
            assert time.monotonic() < deadline, "the run did not end within 300 s:\n" + "".join(out_lines)
            log = run_dir / "learner0.log"
            if t_stop is None and log.exists() and "stopping samplers" in log.read_text(errors="replace"):
                t_stop = time.monotonic()
            if t_stop is not None and t_exit is None and exited(pids(run_dir)["sampler0"]):
                t_exit = time.monotonic()
            time.sleep(0.1)
        reader.join(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "".join(out_lines)
    assert proc.returncode == 0, out
    assert t_stop is not None and t_exit is not None and t_exit - t_stop < 5.0, (t_stop, t_exit, out)
    assert "did not exit" not in out
    slog = (run_dir / "sampler0.log").read_text()
    # round 0 only: sized by the budget (1 prompt) where the learner's first answer came first, else
    # the round's 2 prompts; no round after it, whatever the bound
    assert re.findall(r"round \d+ \(v\d+\): (\d+) completions", slog) in (["2"], ["4"]), slog
    assert "learner says stop (learner finished) at version 1\n" in slog, slog
    summary = json.loads((run_dir / "summary.json").read_text())
    g = summary["groups"]
    assert g["trained"] == 1 and g["dropped"] == {} and g["queued"] == g["sent"] - 1 and g["sent"] in (1, 2), g
    assert g["balanced"] and summary["balance"]["text"] == "balanced"
    assert summary["samplers_without_final_status"] == []
    books = next(line for line in out.splitlines() if line.startswith("[launcher] groups: "))
    assert ": balanced" in books, books
    hist = summary["stages"]
    assert set(hist) == {"learner0", "sampler0"}
    assert [e["stage"] for e in hist["learner0"]] == ["started", "bound", "engine_ready", "weights_published",
                                                      "first_step"]
    assert sorted(e["stage"] for e in hist["sampler0"]) == ["connected", "first_group", "model_loaded", "started"]
    t0 = min(e["time"] for entries in hist.values() for e in entries if e["stage"] == "started")
    assert summary["first_step_s"] == pytest.approx(hist["learner0"][-1]["time"] - t0)
    assert 0 < summary["first_step_s"] < 300


def test_a_process_that_outlives_a_finished_learner_is_stopped_and_the_run_succeeds(tmp_path):
    """The supervisor with stand-in processes: a 'learner' that writes its ready file and summary
    and exits 0, and a 'sampler' that never exits. The launcher names it, stops it, exits 0."""
    run_dir = tmp_path / "run"
    learner = ("import json, pathlib, sys, time; d = pathlib.Path(sys.argv[1]); "
               "(d / 'learner.ready').write_text('{}'); time.sleep(1.0); "
               "(d / 'summary.json').write_text(json.dumps({'groups': {'sent': 0}, 'balance': {'text': 'balanced'}}))")
    script = f"""
import os, sys
from pathlib import Path
from grpo.config import LaunchConfig, from_flat
from grpo.launch.plan import ProcSpec
from grpo.launch.supervisor import run
run_dir = Path({str(run_dir)!r})
env = dict(os.environ)
specs = [ProcSpec("learner0", [sys.executable, "-c", {learner!r}, str(run_dir)], env, "learner"),
         ProcSpec("sampler0", [sys.executable, "-c", "import time; time.sleep(120)"], env, "sampler")]
sys.exit(run(from_flat(LaunchConfig, stop_timeout_s=1.0, stage_timeout_s=0), specs, run_dir))
"""
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert ("[launcher] sampler0 did not exit within 1 s of the learner finishing; stopping them (the run itself "
            "completed)") in out
    assert "[launcher] groups: 0 sent = 0 trained + 0 dropped + 0 queued: balanced" in out
    assert time.monotonic() - t0 < 30
    assert not alive(json.loads((run_dir / "pids.json").read_text())["sampler0"])


def test_status_line_reads_whole_records_only(tmp_path):
    """The launcher polls metrics.jsonl while the learner appends to it: a record caught half
    written is left for the next poll, a damaged line is passed over, and a null figure prints as
    nan; none of them may end the run."""
    from grpo.launch.supervisor import _status_line

    def rec(step, loss=0.5):
        return json.dumps({"step": step, "loss": loss, "reward_mean": 0.25, "accuracy": 0.125,
                           "samples_per_s": 12.0, "sampler_versions": {"0": step - 1},
                           "groups": {"received": 2 * step}}) + "\n"

    path = tmp_path / "metrics.jsonl"
    assert _status_line(tmp_path, 0) == (0, None)               # no file yet
    one, two = rec(1), rec(2)
    path.write_text(one + two[:40])                              # step 2 half written
    seen, line = _status_line(tmp_path, 0)
    assert seen == len(one)
    assert line == ("[launcher] step 1 loss 0.5000 reward 0.250 acc 0.125 12.0 samples/s samplers at "
                    "{'0': 0} groups {'received': 2}")
    assert _status_line(tmp_path, seen) == (seen, None)          # still half: nothing new, nothing lost
    path.write_text(one + two)
    seen, line = _status_line(tmp_path, seen)
    assert seen == len(one + two) and line.startswith("[launcher] step 2 loss 0.5000 ")
    with open(path, "a") as fh:                                  # a damaged line after a good one
        fh.write(rec(3, loss=None) + "{not json\n")
    seen, line = _status_line(tmp_path, seen)
    assert seen == path.stat().st_size and line.startswith("[launcher] step 3 loss nan reward 0.250 ")
    with open(path, "a") as fh:
        fh.write(json.dumps({"final": True, "steps": 3}) + "\n")
    assert _status_line(tmp_path, seen) == (path.stat().st_size, None)
