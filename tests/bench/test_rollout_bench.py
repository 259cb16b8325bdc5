"""bench/rollout.py's refusals: a vLLM flag without the measurement it belongs to is one line, exit
code 2, before any model loads."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(*flags):
    return subprocess.run([sys.executable, str(ROOT / "bench" / "rollout.py"), "--device", "cpu", "--model",
                           "tiny-random", *flags], capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_vllm_flags_without_their_measurement_are_refused_in_one_line():
    r = run("--vllm-engine-process")
    assert r.returncode == 2 and r.stderr.strip() == (
        "bench/rollout.py: error: --vllm-engine-process sets how --vllm runs vLLM's engine: give --vllm "
        "GPU_MEMORY_UTILIZATION too") and not r.stdout
    r = run("--vllm", "0.3")
    assert r.returncode == 2 and r.stderr.strip().startswith(
        "bench/rollout.py: error: --vllm measures the in-flight workload on CUDA: add --workload-only")
