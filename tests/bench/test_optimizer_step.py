"""bench/optimizer_step.py's CPU smoke check, in a process of its own (it starts a process group):
both engines step a tiny Qwen2 and the result file names them."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_both_engines_step_the_tiny_shape_on_cpu(tmp_path):
    r = subprocess.run([sys.executable, "bench/optimizer_step.py", "--device", "cpu", "--shape", "tiny", "--reps", "2",
                        "--results-dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads((tmp_path / "optimizer_step_tiny_cpu.json").read_text())
    assert out["shape"] == "tiny" and out["parameters"] > 0 and out["seeds"] == [0] and out["command_line"]
    assert len(out["torch_adamw_s"]) == len(out["deepspeed_zero2_s"]) == 2
    assert out["deepspeed_zero2_median_s"] > 0 and out["torch_adamw_median_s"] > 0


def test_with_micro_batches_both_engines_time_a_learner_step_on_cpu(tmp_path):
    r = subprocess.run([sys.executable, "bench/optimizer_step.py", "--device", "cpu", "--shape", "tiny", "--reps", "2",
                        "--micro-batches", "2", "--rows", "2", "--length", "8", "--results-dir", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads((tmp_path / "optimizer_step_tiny_passes2x2x8_cpu.json").read_text())
    assert out["step_shape"] == {"micro_batches": 2, "rows": 2, "length": 8, "tokens": 32}
    for k in ("torch_forward_backward_s", "deepspeed_forward_backward_s", "torch_step_after_passes_s",
              "deepspeed_step_after_passes_s"):
        assert len(out[k]) == 2 and all(x > 0 for x in out[k]) and out[k[:-2] + "_median_s"] > 0, k
