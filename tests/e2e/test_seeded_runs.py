"""Parallel seeded runs through run_distributed.py --seeds, and a learner on another address.

One launch starts two instances (seeds 7 and 8); a second, plain run with seed 7 must train the
same first batch. That second run also stands for multi-node on one host: its learner binds
127.0.0.2 (a second loopback address) while 127.0.0.1 holds the same port numbers, as another
machine would, and its sampler reaches it through --host.
"""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from netutil import free_port_run, free_ports

ROOT = Path(__file__).resolve().parents[2]
GSM8K = ROOT.parent / "shared" / "data" / "gsm8k"
SAME = ("batch_crc32", "loss", "kl", "tokens", "completion_len_mean", "reward_mean", "ratio_mean")


def launch(*extra) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    args = [sys.executable, "run_distributed.py", "--device", "cpu", "--model", "tiny-random", "--no-deepspeed",
            "--dataset", str(GSM8K), "--num-generations", "4", "--prompts-per-round", "1", "--train-batch-size", "4",
            "--max-new-tokens", "6", "--max-steps", "1", *extra]
    return subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(p: subprocess.Popen) -> subprocess.CompletedProcess:
    out, err = p.communicate(timeout=600)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def first_step(run_dir):
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return next(r for r in recs if r.get("step") == 1)


@pytest.mark.slow
def test_same_seed_same_first_step_separate_instances_and_learner_on_another_address(tmp_path):
    d = free_port_run(4)   # instance k takes --data-port + 2k and --sync-port + 2k
    d2, s2 = free_ports(2)
    while {d2, s2} & set(range(d, d + 4)):
        d2, s2 = free_ports(2)
    blockers = []
    for port in (d2, s2):                    # "the other host" uses these ports on 127.0.0.1
        blocker = socket.socket()
        blocker.bind(("127.0.0.1", port))
        blocker.listen()
        blockers.append(blocker)
    # The two launches are independent (other ports, other folders): they run at the same time,
    # so one's start-up and shutdown waits overlap the other's.
    procs = []
    try:
        procs.append(launch("--seeds", "7,8", "--name", "exp", "--run-dir", str(tmp_path), "--data-port", str(d),
                            "--sync-port", str(d + 1)))
        procs.append(launch("--seed", "7", "--host", "127.0.0.2", "--run-dir", str(tmp_path / "again"),
                            "--data-port", str(d2), "--sync-port", str(s2)))
        r, r2 = (finish(p) for p in procs)
    finally:
        for p in procs:
            p.kill()
        for blocker in blockers:
            blocker.close()
    logs = "".join(p.read_text()[-2000:] for p in tmp_path.glob("exp_*/*.log"))
    assert r.returncode == 0, r.stdout + r.stderr + logs
    a, b = tmp_path / "exp_seed7", tmp_path / "exp_seed8"
    for run_dir, seed, port in ((a, 7, d), (b, 8, d + 2)):
        assert (run_dir / "launcher.log").exists() and (run_dir / "learner0.log").exists()
        cfg = json.loads((run_dir / "config_learner.json").read_text())
        assert (cfg["seed"], cfg["data_port"]) == (seed, port)

    assert r2.returncode == 0, r2.stdout + r2.stderr
    assert "learner ready on 127.0.0.2" in r2.stdout
    again = tmp_path / "again"
    assert json.loads((again / "config_sampler0.json").read_text())["host"] == "127.0.0.2"
    summary = json.loads((again / "summary.json").read_text())
    assert summary["samplers"]["0"]["final"] and summary["groups"]["balanced"]

    s7, s8, s7b = first_step(a), first_step(b), first_step(again)
    assert {k: s7[k] for k in SAME} == {k: s7b[k] for k in SAME}      # exact: same tokens, same loss
    assert s7["batch_crc32"] != s8["batch_crc32"]                      # another seed, another batch
