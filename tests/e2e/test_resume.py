"""Save and resume through run_distributed.py: real processes, DeepSpeed (gloo) and plain PyTorch."""
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from netutil import free_port_run, free_ports

ROOT = Path(__file__).resolve().parents[2]
GSM8K = ROOT.parent / "shared" / "data" / "gsm8k"


def launch(run_dir, *extra, timeout=600):
    d, s = free_ports(2)
    env = dict(os.environ, PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    args = [sys.executable, "run_distributed.py", "--device", "cpu", "--model", "tiny-random", "--dataset", str(GSM8K),
            "--num-generations", "4", "--prompts-per-round", "1", "--train-batch-size", "4",
            "--max-new-tokens", "8", "--learning-rate", "1e-3", "--data-port", str(d), "--sync-port", str(s),
            "--run-dir", str(run_dir), *extra]
    r = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(run_dir.glob("*.log")))
    assert r.returncode == 0, r.stdout + r.stderr + logs
    return r


def metric_steps(run_dir):
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["policy_version"]) for r in recs if not r.get("final")]


@pytest.mark.slow
def test_resume_latest_continues_numbering(tmp_path):
    """DeepSpeed here; the --no-deepspeed state round trip is exact-tested in test_checkpoint.py."""
    engine = []
    run_dir = tmp_path / "run"
    launch(run_dir, "--max-steps", "2", "--save-every", "1", "--keep-checkpoints", "1", *engine)
    root = run_dir / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step_2"]          # keep 1: step_1 was pruned
    state = json.loads((root / "step_2" / "trainer_state.json").read_text())
    assert state["step"] == 2 and state["samplers"]["0"]["rounds"] >= 1
    assert (root / "step_2" / ("torch_state.safetensors" if engine else "deepspeed")).exists()

    launch(run_dir, "--max-steps", "4", "--save-every", "1", "--keep-checkpoints", "2", "--resume", "latest", *engine)
    # No step repeated or skipped; policy version == step throughout.
    assert metric_steps(run_dir) == [(1, 1), (2, 2), (3, 3), (4, 4)]
    assert sorted(p.name for p in root.iterdir()) == ["step_3", "step_4"]
    log0 = (run_dir / "learner0.log").read_text()
    assert "resumed from" in log0 and "continuing at step 3" in log0
    # The second run's sampler (a fresh process) only ever received the resumed weights or newer.
    second = (run_dir / "sampler0.log").read_text().split("learner says stop")[1]
    got = [int(v) for v in re.findall(r"now running policy version (\d+)", second)]
    assert got and min(got) >= 2, got


def test_the_launchers_resume_check_imports_no_torch(tmp_path):
    """A --resume launch checks its checkpoint before any worker starts, without torch or numpy (their
    import would come before every worker's own): main() in a fresh interpreter, stopped by a busy
    data port, the last check before the workers start."""
    step = tmp_path / "run" / "checkpoints" / "step_2"
    step.mkdir(parents=True)
    (step / "trainer_state.json").write_text(json.dumps({"step": 2}))
    code = ("import sys\nfrom grpo.launch.main import main\nrc = main(sys.argv[1:])\n"
            "print(rc, sorted(n for n in ('torch', 'numpy', 'transformers') if n in sys.modules))\n")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", free_port_run(2)))   # and the next one (the sync port) free
        busy.listen()
        port = busy.getsockname()[1]
        r = subprocess.run([sys.executable, "-c", code, "--device", "cpu", "--run-dir", str(tmp_path / "run"),
                            "--max-steps", "4", "--resume", "latest", "--data-port", str(port),
                            "--sync-port", str(port + 1)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert f"port {port} on 127.0.0.1 is already in use" in r.stderr, r.stdout + r.stderr
    assert r.stdout.splitlines()[-1].split(maxsplit=1) == ["2", "[]"], r.stdout   # after the launcher's lines
