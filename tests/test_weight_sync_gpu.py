"""GPU only: ipc, nccl, shared and tcp between two real processes, bit-exact weights at the sampler.

Runs bench/weight_sync.py on a tiny model (one GPU is enough: CUDA IPC also works between two
processes on one device). Skipped without CUDA; run on a GPU machine with `pytest -m gpu`.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("methods,extra", [("ipc,nccl,tcp", []), ("shared,ipc", ["--same-gpu"])])
def test_every_method_delivers_bit_exact_weights(tmp_path, methods, extra):
    out = tmp_path / "ws.json"
    r = subprocess.run([sys.executable, "bench/weight_sync.py", "--models", "tiny", "--syncs", "4", "--methods", methods,
                        "--floors", "none", "--port", "47400", "--out", str(out), *extra],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(out.read_text())["results"]["tiny"]["methods"]
    for method in methods.split(","):
        assert res[method]["bit_exact"] and res[method]["final_version"] == 4, res
        assert res[method]["versions_applied"] >= 1
