"""The launcher's side of a stop, with stand-in processes: a 'learner' that writes its ready file
and then, asked to stop, takes as long as a big save would (it ignores SIGINT and SIGTERM), and a
'sampler' that sleeps. What a user must be able to count on: a second Ctrl+C ends every process at
once, without the save; a save that outlasts --stop-save-timeout-s is given up, said in a line;
the launcher says that it waits while it does; and no ready file is left behind either way.
(tests/e2e/test_stop_keeps_work.py stops real runs.)"""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from faultutil import alive, finish

ROOT = Path(__file__).resolve().parents[2]

# A learner in a long save: the first SIGINT/SIGTERM (passed on by the launcher) changes nothing.
SAVING = ("import pathlib, signal, sys, time; d = pathlib.Path(sys.argv[1]); "
          "[signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)]; "
          "(d / 'learner.ready').write_text('{}'); time.sleep(300)")


def launcher(run_dir: Path, stop_save_timeout_s: float) -> subprocess.Popen:
    script = f"""
import os, sys
from pathlib import Path
from grpo.config import LaunchConfig, from_flat
from grpo.launch import supervisor
from grpo.launch.plan import ProcSpec
supervisor.STOP_NOTE_S = 0.5   # the word while it waits, at a test's pace
run_dir = Path({str(run_dir)!r})
env = dict(os.environ)
specs = [ProcSpec("learner0", [sys.executable, "-c", {SAVING!r}, str(run_dir)], env, "learner"),
         ProcSpec("sampler0", [sys.executable, "-c", "import time; time.sleep(300)"], env, "sampler")]
cfg = from_flat(LaunchConfig, stop_timeout_s=2.0, stage_timeout_s=0, stop_save_timeout_s={stop_save_timeout_s})
sys.exit(supervisor.run(cfg, specs, run_dir, resume="python run_distributed.py --resume latest"))
"""
    run_dir.mkdir(parents=True)
    out = run_dir.parent / "launcher.out"
    with open(out, "w") as fh:
        p = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
    p.out_path = out
    deadline = time.monotonic() + 60
    while not (run_dir / "pids.json").exists() or len(json.loads((run_dir / "pids.json").read_text())) < 3 \
            or not (run_dir / "learner.ready").exists():
        assert p.poll() is None and time.monotonic() < deadline, out.read_text()
        time.sleep(0.1)
    time.sleep(0.5)   # past the launcher's ready poll: it watches the run now
    return p


def test_a_second_ctrl_c_stops_everything_at_once_without_the_save(tmp_path):
    run_dir = tmp_path / "run"
    p = launcher(run_dir, stop_save_timeout_s=300)
    pids = json.loads((run_dir / "pids.json").read_text())
    p.send_signal(signal.SIGINT)
    time.sleep(1.5)   # the launcher passed the stop on, and waits on the 'save' (a word every 0.5 s)
    assert p.poll() is None, p.out_path.read_text()
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    out = finish(p, 30)
    took = time.monotonic() - t0
    assert p.returncode == 128 + signal.SIGINT, out
    assert "[launcher] SIGINT: the learner finishes the step in hand, saves it" in out
    assert "[launcher] still waiting for the learner to save and write its summary" in out
    assert "[launcher] SIGINT again: stopping every process now, without saving" in out
    assert took < 5, (took, out)   # at once: the learner, deaf to signals mid-save, is killed
    assert not alive(pids["learner0"]) and not alive(pids["sampler0"])
    assert not (run_dir / "learner.ready").exists()
    assert "resume with" not in out   # nothing new was saved


def test_a_save_past_its_bound_is_given_up_and_said(tmp_path):
    run_dir = tmp_path / "run"
    p = launcher(run_dir, stop_save_timeout_s=2)
    pids = json.loads((run_dir / "pids.json").read_text())
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    out = finish(p, 60)
    took = time.monotonic() - t0
    assert p.returncode == 128 + signal.SIGTERM, out
    assert "the learner has not finished saving within 2 s (--stop-save-timeout-s); stopping every process" in out
    # the bound, then the stop (SIGTERM, ignored; SIGKILL after --stop-timeout-s 2)
    assert 2 <= took < 15, (took, out)
    assert not alive(pids["learner0"]) and not alive(pids["sampler0"])
    assert not (run_dir / "learner.ready").exists()
