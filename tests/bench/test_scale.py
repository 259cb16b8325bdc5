"""bench/scale.py: its parsing rules by hand, the memory plan lines as the launcher prints them, and
one real run of its plumbing on CPU (the tiny model through run_distributed.py)."""
import json
import sys
from pathlib import Path

import pytest
from netutil import free_ports

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import scale  # noqa: E402

from grpo.rules import memory  # noqa: E402

GiB = 1 << 30


def test_plan_estimates_read_the_launchers_lines():
    p = {"learner0": [("weights", 3 * GiB), ("optimizer state", GiB // 2)],
         "sampler0": [("weights", GiB), ("KV cache", GiB // 4)]}
    log = "run_distributed.py: starting\n" + memory.format_plan(p) + "\nlearner0 | step 1\n"
    assert scale.plan_estimates(log) == {"learner0": 3.5, "sampler0": 1.25}


def test_compute_apps_and_roles():
    text = "4242, 10240\n4243, 512\n[Not Supported]\n\n"
    assert scale.parse_compute_apps(text) == {4242: 10240.0, 4243: 512.0}
    assert scale.role_of("/usr/bin/python3 /w/training_worker.py --gpu-id 0") == "learner"
    assert scale.role_of("python3 /w/sampling_worker.py --sampler-id 0") == "sampler"
    assert scale.role_of("python3 run_distributed.py --share-gpus") is None
    mem = scale.DriverMemory()
    mem.peaks_mib, mem.roles = {1: 2048.0, 2: 1024.0, 3: 5.0}, {1: "learner", 2: "sampler", 3: None}
    assert mem.by_role() == {"learner0": 2.0, "sampler0": 1.0}


def test_mfu_and_what_bound_the_step_by_hand():
    # 1e9 parameters at 1e5 tokens/s: 6e14 FLOP/s of 989e12 for full fine-tuning, 4e14 with LoRA
    assert scale.mfu(10**9, 1e5, lora=False) == pytest.approx(6e14 / 989e12)
    assert scale.mfu(10**9, 1e5, lora=True) == pytest.approx(4e14 / 989e12)
    assert scale.bound_by(train_s=2.0, data_wait_s=3.0) == "sampler (generation)"
    assert scale.bound_by(train_s=2.0, data_wait_s=0.1) == "learner (training)"
    assert scale.bound_by(train_s=7.1, data_wait_s=0.0, publish_s=11.6) == "weight publish"   # 7B over tcp


@pytest.mark.slow
def test_a_cpu_run_of_the_tiny_model_fills_a_row(tmp_path):
    out = tmp_path / "scale.json"
    # 2 prompts x 2 completions a step in micro-batches of 2 (2 accumulated): the row's plumbing
    # with as little CPU training as still has a group per prompt and gradient accumulation
    rc = scale.main(["--sizes", "tiny", "--device", "cpu", "--max-steps", "3", "--micro", "2", "--dataset",
                     str(ROOT.parent / "shared" / "data" / "gsm8k"), "--work-dir", str(tmp_path), "--out", str(out),
                     "--", "--max-new-tokens", "16", "--prompts-per-round", "2", "--num-generations", "2",
                     "--train-batch-size", "4",
                     *[f"--{k}-port={p}" for k, p in zip(("data", "sync"), free_ports(2))]])
    assert rc == 0
    row = json.loads(out.read_text())["rows"]["tiny"]
    assert row["exit_code"] == 0 and row["steps"] == 3 and row["balanced"] is True
    assert row["weight_sync"] == "tcp" and row["truncated_frac"] == 1.0   # random weights: no EOS in 16 tokens
    # 4 completions a step, each 16 new tokens (the loss's tokens; prompts carry none)
    assert row["completions_per_s"] == pytest.approx(4 / row["step_s"])
    assert row["tokens_trained_per_s"] == pytest.approx(4 * 16 / row["step_s"])
    assert row["rollout_tokens_per_s"] > 0 and row["command_line"] and row["seed"] == 42


@pytest.mark.parametrize("device", ["NVIDIA_H200", "NVIDIA_H100_80GB_HBM3"])
def test_committed_tables_carry_this_codes_memory_plan(device):
    """estimate_gib_now in the committed scale tables is what this code's memory plan says for each
    row's command (rerun `bench/scale.py --replan FILE` after changing the rules); rows that ran
    under the current reserve rules (plan_rules, recorded since they were refitted) printed the same."""
    doc = json.loads((ROOT / "bench" / "results" / f"scale_{device}.json").read_text())
    assert {"0.5b", "1.5b", "3b", "7b"} <= set(doc["rows"])
    for label, row in doc["rows"].items():
        assert row["estimate_gib_now"] == scale.replan(row), label
        if row.get("plan_rules") == scale.plan_rules():   # the launcher printed these rules' plan
            assert row["estimate_gib"] == row["estimate_gib_now"], label
