"""A run that is stopped keeps its work, and every run ends by saying what it made: real launches
(CPU, tiny-random), stopped with SIGINT (Ctrl+C) and SIGTERM (`timeout`, systemd), then resumed
with the command the launcher printed.

What must hold after a stop: the launcher exits 128 + the signal; the last trained step is saved
as a complete checkpoint (the format of a scheduled save: the resume below loads it); summary.json
holds balanced books; learner.ready is gone; every process has exited; one line says what was
saved and the command that resumes it, and that command continues the step numbering.
"""
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from faultutil import alive
from netutil import free_ports

ROOT = Path(__file__).resolve().parents[2]
GSM8K = ROOT.parent / "shared" / "data" / "gsm8k"
ENV = dict(os.environ, PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
# A small evaluation: sampler 0 scores version 0 during the run, the learner its final weights.
EVAL = ["--eval-every", "1000", "--eval-size", "2", "--eval-batch-size", "2"]
STOP_LINE = re.compile(r"^\[launcher\] (SIG\w+): saved step (\d+) to (\S+); resume with: (.+)$", re.M)


def start(run_dir: Path, *extra: str) -> subprocess.Popen:
    """The launcher, as a user starts it, its output to a file (read by out()); a run long enough
    never to end by itself while the test looks."""
    d, s = free_ports(2)
    args = [sys.executable, "run_distributed.py", "--device", "cpu", "--model", "tiny-random",
            "--dataset", str(GSM8K), "--num-generations", "4", "--prompts-per-round", "1",
            "--train-batch-size", "4", "--max-new-tokens", "8", "--learning-rate", "1e-3", "--max-steps", "100000",
            "--data-port", str(d), "--sync-port", str(s), "--run-dir", str(run_dir), *EVAL, *extra]
    out = run_dir.parent / f"{run_dir.name}.out"
    with open(out, "w") as fh:
        proc = subprocess.Popen(args, cwd=ROOT, env=ENV, stdout=fh, stderr=subprocess.STDOUT)
    proc.out_path = out
    return proc


def out(proc) -> str:
    return proc.out_path.read_text(errors="replace")


def steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    recs = []
    for line in path.read_text().splitlines():
        try:
            recs.append(json.loads(line))
        except ValueError:   # the learner's write in progress
            pass
    return [r["step"] for r in recs if not r.get("final")]


def wait_steps(proc, run_dir: Path, n: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while len(steps(run_dir)) < n:
        assert proc.poll() is None, out(proc)
        assert time.monotonic() < deadline, f"no {n} steps within {timeout} s:\n{out(proc)}"
        time.sleep(0.2)


def stop_and_check(proc, run_dir: Path, sig: int) -> tuple[int, str, float]:
    """Send `sig` to the launcher and check what every stopped run must leave; returns the saved
    step, the resume command and the seconds from the signal to the launcher's exit."""
    workers = [pid for name, pid in json.loads((run_dir / "pids.json").read_text()).items() if name != "launcher"]
    t0 = time.monotonic()
    proc.send_signal(sig)
    try:
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    took = time.monotonic() - t0
    text = out(proc)
    assert proc.returncode == 128 + sig, text
    assert not [p for p in workers if alive(p)], text
    assert not (run_dir / "learner.ready").exists(), text
    # the one line: what was saved and how to resume
    found = STOP_LINE.findall(text)
    assert len(found) == 1, text
    name, step, path, resume = found[0]
    step = int(step)
    assert name == signal.Signals(sig).name
    # the last completed step: the last step record the learner wrote, saved in full
    trained = steps(run_dir)
    assert trained and trained[-1] == step == len(trained), (trained, text)
    assert Path(path) == run_dir / "checkpoints" / f"step_{step}"
    state = json.loads((Path(path) / "trainer_state.json").read_text())
    assert state["step"] == step and state["policy_version"] == step
    assert (Path(path) / "hf" / "config.json").exists()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == step and summary["ended_by"] == name, summary
    assert summary["checkpoint"] == {"step": step, "path": path}
    assert summary["groups"]["balanced"] and summary["balance"]["text"] == "balanced", summary["groups"]
    assert summary["samplers_without_final_status"] == [], summary   # the learner told them to stop
    assert summary["final_eval"] is None   # skipped: whoever stops a run wants it to end
    books = next(line for line in text.splitlines() if line.startswith("[launcher] groups: "))
    assert f"the run stopped on {name}" in books or summary["groups"]["queued"] == 0, books
    return step, resume, took


@pytest.mark.slow
def test_ctrl_c_saves_the_last_step_and_the_printed_command_resumes_it(tmp_path):
    run_dir = tmp_path / "run"
    proc = start(run_dir)
    try:
        wait_steps(proc, run_dir, 3)
        step, resume, took = stop_and_check(proc, run_dir, signal.SIGINT)
    finally:
        if proc.poll() is None:
            proc.kill()
    first = out(proc)
    print(f"SIGINT to exit: {took:.1f} s (saved step {step})")
    assert took < 60, first
    # The run's lines: the folder, steps and time, the last evaluation (sampler 0's of version 0:
    # the learner's final one is skipped on a stop), the books, the report command.
    assert re.search(rf"^\[launcher\] run folder {re.escape(str(run_dir))}: {step} steps, the run stopped on SIGINT; "
                     r"\d+ s of training, \d+ s since launch$", first, re.M), first
    assert re.search(r"^\[launcher\] last evaluation: greedy pass@1 \d\.\d{3} \(\d+/2\) at version 0, by sampler0$",
                     first, re.M), first

    # The printed command, as a user would paste it, for two more steps: it goes on from the saved
    # step, numbering continued, each step once.
    argv = shlex.split(resume)
    assert argv[argv.index("--resume") + 1] == "latest" and str(run_dir) in argv
    log = tmp_path / "resumed.out"
    with open(log, "w") as fh:
        r = subprocess.run(argv + ["--max-steps", str(step + 2)], cwd=ROOT, env=ENV, stdout=fh,
                           stderr=subprocess.STDOUT, timeout=600)
    second = log.read_text(errors="replace")
    assert r.returncode == 0, second
    assert steps(run_dir) == list(range(1, step + 3)), (steps(run_dir), second)
    learner_log = (run_dir / "learner0.log").read_text(errors="replace")
    assert f"resumed from {run_dir / 'checkpoints' / f'step_{step}'}" in learner_log
    assert f"continuing at step {step + 1}" in learner_log
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["steps"], summary["steps_at_start"], summary["ended_by"]) == (step + 2, step, "max_steps")
    check_end_lines(second, run_dir, summary, step)


def check_end_lines(text: str, run_dir: Path, summary: dict, start: int) -> None:
    """A run that ends by itself says what it made: folder, steps and time, the last evaluation, the
    newest checkpoint, the books in words (the queued groups named truthfully, balanced), and a
    report command that works."""
    n = summary["steps"]
    lines = [line.removeprefix("[launcher] ") for line in text.splitlines() if line.startswith("[launcher] ")]
    assert lines[-5].startswith(f"run folder {run_dir}: {n} steps ({n - start} in this launch, resumed at step "
                                f"{start}), the run stopped at --max-steps {n}; "), lines[-5:]
    final = summary["final_eval"]
    assert final is not None and final["version"] == n
    assert lines[-4] == f"last evaluation: greedy pass@1 {final['accuracy']:.3f} ({final['correct']}/2) at version {n}, " \
                        f"by learner", lines[-4]
    g = summary["groups"]
    dropped = sum(g["dropped"].values())
    assert lines[-3].startswith(f"groups: {g['sent']} sent = {g['trained']} trained + {dropped} dropped"), lines[-3]
    assert f"+ {g['queued']} queued: balanced" in lines[-3], lines[-3]
    assert g["sent"] == g["trained"] + dropped + g["queued"] and g["trained"] == n
    if g["queued"]:
        _, hi = summary["queued_versions"]
        assert hi <= n, summary["queued_versions"]   # made by versions the learner had published
        assert (f"{g['queued']} group{'s' * (g['queued'] != 1)} (made at version" in lines[-3]
                and f"still queued when the run stopped at --max-steps {n}: generated ahead, never trained"
                in lines[-3]), lines[-3]
    assert lines[-2] == f"newest checkpoint: {run_dir / 'checkpoints' / f'step_{n}'} (step {n})", lines[-2]
    m = re.fullmatch(r"report: (.+) \(writes report\.png and report\.md there\)", lines[-1])
    assert m, lines[-1]
    r = subprocess.run(shlex.split(m.group(1)), cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (run_dir / "report.png").exists() and (run_dir / "report.md").exists()


@pytest.mark.slow
def test_sigterm_stops_two_learner_ranks_together_and_keeps_the_work(tmp_path):
    """SIGTERM (what `timeout` and service managers send) to a 2-rank DeepSpeed (gloo) learner: rank 0
    decides for both, both save their shard of the same step, and both exit."""
    run_dir = tmp_path / "run"
    proc = start(run_dir, "--training-ranks", "2")
    try:
        wait_steps(proc, run_dir, 2)
        step, _, took = stop_and_check(proc, run_dir, signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
    print(f"SIGTERM to exit, 2 ranks: {took:.1f} s (saved step {step})")
    ckpt = run_dir / "checkpoints" / f"step_{step}"
    assert sorted(p.name for p in ckpt.glob("rng_rank*.json")) == ["rng_rank0.json", "rng_rank1.json"]
    assert json.loads((ckpt / "trainer_state.json").read_text())["world_size"] == 2
    assert "SIGTERM: stopping after step" in (run_dir / "learner0.log").read_text()
