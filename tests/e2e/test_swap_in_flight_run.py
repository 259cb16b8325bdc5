"""--swap-in-flight end to end on CPU: a learner and a sampler as real processes over tcp weights.
The sampler streams on 2 rows (one group of G=2 at a time) while the learner trains one group a
step, so versions are published while it decodes and the sampler takes them between decode steps;
with --prompts-per-round 0 it ends a round only for an evaluation: a prompt starts whenever a row
is free and the learner's budget allows. Every group still reaches the learner's books, which balance."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from netutil import free_ports

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_run_swaps_weights_in_flight_and_its_books_balance(tmp_path):
    data, sync = free_ports(2)
    run_dir = tmp_path / "run"
    r = subprocess.run(
        [sys.executable, str(ROOT / "run_distributed.py"), "--device", "cpu", "--model", "tiny-random",
         "--no-deepspeed", "--dataset", "rg:basic_arithmetic", "--num-generations", "2", "--prompts-per-round", "0",
         "--train-batch-size", "2", "--max-new-tokens", "64", "--max-steps", "8", "--max-staleness", "4",
         "--beta", "0", "--generation-backend", "fast", "--in-flight-rows", "2", "--swap-in-flight",
         "--eval-every", "3", "--eval-size", "2",
         "--report-to", "none", "--data-port", str(data), "--sync-port", str(sync), "--run-dir", str(run_dir)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env=dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    groups = summary["groups"]
    assert groups["balanced"] and groups["trained"] == 8, groups
    # every group judged for training is counted at its age, none past --max-staleness 4 (none dropped)
    assert sum(summary["ages"].values()) == 8 and max(map(int, summary["ages"])) <= 4, summary["ages"]
    assert summary["staleness_note"] is None
    stats = summary["samplers"]["0"]["stats"]
    log = (run_dir / "sampler0.log").read_text()
    assert "fast generation, in flight on 2 rows, weights swapped in flight, prompts started as the learner's budget allows" in log
    assert stats["swaps"] >= 1, stats
    # --prompts-per-round 0 with swaps: no round boundaries. Every chunk of groups the run sent came
    # out of round 0, across the versions the learner published while it streamed
    # and its rounds end only for sampler 0's evaluations (--eval-every 3), each of the version due:
    # the baseline is version 0's although the learner published newer ones while round 0 ended
    rounds = [(int(r), int(v)) for r, v in re.findall(r"round (\d+) \(v(\d+)\): ", log)]
    evals = [json.loads(line)["version"] for line in (run_dir / "eval.jsonl").read_text().splitlines()
             if json.loads(line)["by"] == "sampler0"]
    assert evals[0] == 0 and all(a // 3 < b // 3 for a, b in zip(evals, evals[1:])), evals
    assert max(r for r, _ in rounds) <= len(evals) and rounds[0][1] == 0 and rounds[-1][1] >= 4, (rounds, evals)
    # a swap between rounds is a weight sync too, never more swaps than syncs
    assert stats["weight_syncs"] >= stats["swaps"]
    assert stats["weight_syncs"] == len(re.findall(r"now running policy version \d+", log))
    # a group that spans a swap says so: its tokens are of two versions, the older one its version
    spans = [(int(a), int(b)) for a, b in re.findall(r"swapped in flight: tokens of v(\d+)-v(\d+)", log)]
    assert spans and all(a < b for a, b in spans), spans
