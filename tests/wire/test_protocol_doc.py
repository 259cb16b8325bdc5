"""docs/protocol.md is enough to write a sampler: its section 6 client, run as printed, against a
real learner process until the learner has trained on its groups; and a sampler whose settings
disagree with the learner's run facts stops with one line."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from netutil import free_ports

from grpo.config import SamplerConfig, from_flat
from grpo.sampler.weights_client import run_mismatches
from grpo.wire import messages as M

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "protocol.md"
# A local file: the disagreeing sampler reaches the learner without importing reasoning-gym's tasks.
GSM8K = ROOT.parent / "shared" / "data" / "gsm8k"
ENV = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def learner(tmp_path: Path, data: int, sync: int, steps: int, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "training_worker.py"), "--device", "cpu", "--model", "tiny-random",
         "--no-deepspeed", "--beta", "0", "--num-generations", "2", "--train-batch-size", "4",
         "--max-new-tokens", "8", "--max-steps", str(steps), "--report-to", "none", "--data-port", str(data),
         "--sync-port", str(sync), "--run-dir", str(tmp_path / "run"), *extra],
        cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "learner.log", "wb"))


@pytest.mark.slow
def test_the_documented_client_drives_a_learner_to_n_steps(tmp_path):
    code = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)[-1]
    assert "import torch" not in code and "grpo" not in code.split('"""', 2)[-1]   # the page alone
    client = tmp_path / "client.py"
    client.write_text(code)
    data, sync = free_ports(2)
    proc = learner(tmp_path, data, sync, steps=3)
    try:
        out = subprocess.run([sys.executable, str(client), "127.0.0.1", str(data), str(sync)], env=ENV,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        assert proc.wait(timeout=120) == 0, (tmp_path / "learner.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    # have_version -1 got version 0's weights (bytes, as tcp), and the first answer the run's facts.
    first = out.stdout.splitlines()[0]
    assert re.fullmatch(r"learner: model tiny-random, vocabulary 49152, G=2, version 0 in [1-9]\d* bucket\(s\)",
                        first), out.stdout
    # The last version the client holds is whichever the learner had published when it last asked:
    # a learner that trains its last steps between two requests answers the next one with stop
    # (seen: version 2 of 3), so any version up to the last.
    last = re.fullmatch(r"stopped at version (\d+) after sending (\d+) groups", out.stdout.splitlines()[-1])
    assert last and int(last[1]) <= 3 and int(last[2]) >= 3 * 2, out.stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["groups"]["trained"] == 3 * 2
    assert summary["groups"]["balanced"] and summary["samplers_without_final_status"] == []
    assert summary["messages"] == {}   # nothing the client sent was refused


def test_run_mismatches_by_hand():
    facts = M.RunFacts(schema=2, model="smollm2", vocab_size=49152, dtype="bfloat16", num_generations=8,
                       max_new_tokens=256, max_prompt_tokens=4096, temperature=1.0, needs_ref_logprobs=True,
                       max_staleness=4)
    assert run_mismatches(facts, SamplerConfig(), 49152) == []
    cfg = from_flat(SamplerConfig, num_generations=4, temperature=0.7)
    assert run_mismatches(facts, cfg, 151936) == [
        "vocabulary: 151936 here, 49152 at the learner (--model smollm2 here, smollm2 there)",
        "--num-generations: 4 here, 8 at the learner", "--temperature: 0.7 here, 1.0 at the learner"]


@pytest.mark.slow
def test_a_sampler_that_disagrees_with_the_learner_stops_with_one_line(tmp_path):
    data, sync = free_ports(2)
    proc = learner(tmp_path, data, sync, steps=1)
    try:
        out = subprocess.run(
            [sys.executable, str(ROOT / "sampling_worker.py"), "--device", "cpu", "--model", "tiny-random",
             "--dataset", str(GSM8K), "--dataset-limit", "8", "--num-generations", "4",
             "--max-new-tokens", "8", "--data-port", str(data), "--sync-port", str(sync),
             "--run-dir", str(tmp_path / "run")], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    finally:
        proc.kill()
        proc.wait()
    err = out.stderr.strip().splitlines()
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert err[-1] == ("sampling_worker.py: error: this sampler disagrees with the learner; --num-generations: "
                       "4 here, 2 at the learner: give both the same settings")
