"""bench/decode_attention.py end to end on CPU under Triton's interpreter (a process of its own, as
TRITON_INTERPRET must be set before Triton is imported): one size, two rows counts, the split path
included; each record's kernel agrees with SDPA, and the file carries what made it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_bench_writes_both_paths_and_their_errors(tmp_path):
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "bench/decode_attention.py", "--device", "cpu", "--rows", "1,9",
                          "--slots", "130", "--sizes", "0.5b", "--calls", "1", "--replays", "1", "--seed", "3", "--out-dir", str(tmp_path)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    doc = json.loads((tmp_path / "decode_attention_cpu.json").read_text())
    assert doc["seed"] == 3 and doc["dtype"] == "float32" and "--rows 1,9" in doc["command_line"]
    assert doc["made_by"] == "bench/decode_attention.py"   # and the command again from the repo root:
    assert doc["command"].startswith("python3 bench/decode_attention.py --device cpu --rows 1,9 --slots 130")
    assert "triton" in doc["versions"]
    recs = doc["records"]
    assert [(r["size"], r["rows"], r["heads"], r["kv_heads"], r["head_dim"]) for r in recs] == \
        [("0.5b", 1, 14, 2, 64), ("0.5b", 9, 14, 2, 64)]
    for r in recs:
        assert r["kernel_max_abs_err"] < 1e-4 and r["sdpa_max_abs_err"] < 1e-4
        assert r["speedup"] == round(r["sdpa_us"] / r["kernel_us"], 3)
