"""Parallel seeded runs through run_distributed.py --seeds: same seed, same first step; own dirs and ports."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from netutil import free_ports

ROOT = Path(__file__).resolve().parents[1]
GSM8K = ROOT.parent / "shared" / "data" / "gsm8k"
SAME = ("batch_crc32", "loss", "kl", "tokens", "completion_len_mean", "reward_mean", "ratio_mean")


def launch(*extra):
    env = dict(os.environ, PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    args = [sys.executable, "run_distributed.py", "--device", "cpu", "--model", "tiny-random", "--no-deepspeed",
            "--dataset", str(GSM8K), "--num-generations", "4", "--prompts-per-round", "1", "--train-batch-size", "4",
            "--max-new-tokens", "6", "--max-steps", "1", *extra]
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def first_step(run_dir):
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return next(r for r in recs if r.get("step") == 1)


@pytest.mark.slow
def test_same_seed_same_first_step_and_separate_instances(tmp_path):
    d = free_ports(1)[0]
    r = launch("--seeds", "7,8", "--name", "exp", "--run-dir", str(tmp_path), "--data-port", str(d),
               "--sync-port", str(d + 1))
    logs = "".join(p.read_text()[-2000:] for p in tmp_path.glob("*/*.log"))
    assert r.returncode == 0, r.stdout + r.stderr + logs
    a, b = tmp_path / "exp_seed7", tmp_path / "exp_seed8"
    for run_dir, port in ((a, d), (b, d + 2)):
        assert (run_dir / "launcher.log").exists() and (run_dir / "learner0.log").exists()
        cfg = json.loads((run_dir / "config_learner.json").read_text())
        assert (cfg["seed"], cfg["data_port"]) == (7 if run_dir == a else 8, port)
    d2 = free_ports(1)[0]
    r = launch("--seed", "7", "--run-dir", str(tmp_path / "again"), "--data-port", str(d2), "--sync-port", str(d2 + 1))
    assert r.returncode == 0, r.stdout + r.stderr
    s7, s8, again = first_step(a), first_step(b), first_step(tmp_path / "again")
    assert {k: s7[k] for k in SAME} == {k: again[k] for k in SAME}     # exact: same tokens, same loss
    assert s7["batch_crc32"] != s8["batch_crc32"]                      # another seed, another batch
