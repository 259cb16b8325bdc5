"""Multi-node on one host: the learner on a second loopback address (127.0.0.2), samplers connecting to it.

127.0.0.1 holds the same port numbers meanwhile, as another machine would: the run only works if
the learner binds the address given by --host and the samplers connect there.
"""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from netutil import free_ports

ROOT = Path(__file__).resolve().parents[1]
GSM8K = ROOT.parent / "shared" / "data" / "gsm8k"


@pytest.mark.slow
def test_samplers_reach_a_learner_on_another_address(tmp_path):
    d, s = free_ports(2)
    blockers = []
    for port in (d, s):                      # "the other host" uses these ports on 127.0.0.1
        b = socket.socket()
        b.bind(("127.0.0.1", port))
        b.listen()
        blockers.append(b)
    env = dict(os.environ, PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    run_dir = tmp_path / "run"
    try:
        r = subprocess.run([sys.executable, "run_distributed.py", "--device", "cpu", "--host", "127.0.0.2",
                            "--model", "tiny-random", "--no-deepspeed", "--dataset", str(GSM8K),
                            "--num-generations", "2", "--prompts-per-round", "1", "--train-batch-size", "2",
                            "--max-new-tokens", "4", "--max-steps", "2", "--data-port", str(d), "--sync-port", str(s),
                            "--run-dir", str(run_dir)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    finally:
        for b in blockers:
            b.close()
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["samplers"]["0"]["final"] and summary["groups"]["balanced"]
    assert json.loads((run_dir / "config_sampler0.json").read_text())["host"] == "127.0.0.2"
    assert "learner ready on 127.0.0.2" in r.stdout
