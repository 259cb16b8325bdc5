"""The defaults drop next to no group as stale, end to end on CPU, in the layout the launcher makes of
them: one learner and one sampler on one device, as on one shared GPU, where a default run dropped a
third of the groups it judged. Its sampler may make round 0 before the learner's first answer (8
groups of version 0, more than the default bound trains with steps of 2 groups: the launcher raises
it, grpo.launch.inflight.fit_first_round), and the learner's first answer carries the budget whenever it
comes (grpo.learner.setup), so that round 0's groups still on their way count against the next."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from netutil import free_ports

ROOT = Path(__file__).resolve().parents[2]
GSM8K = ROOT.parent / "shared" / "data" / "gsm8k"
STEPS = 20   # 40 groups trained (2 a step): 2% of what is judged is less than one group


@pytest.mark.slow
def test_the_default_bound_fits_one_shared_device(tmp_path):
    data, sync = free_ports(2)
    run_dir = tmp_path / "run"
    # the staleness and round defaults (16 completions a step in groups of 8, --max-staleness and
    # --prompts-per-round left alone); short completions only keep it quick
    out = subprocess.run(
        [sys.executable, str(ROOT / "run_distributed.py"), "--device", "cpu", "--model", "tiny-random",
         "--dataset", str(GSM8K), "--max-steps", str(STEPS), "--max-new-tokens", "8", "--report-to", "none",
         "--data-port", str(data), "--sync-port", str(sync), "--run-dir", str(run_dir)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env=dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1"))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "[launcher] --max-staleness 3, not the default 2, so that the learner trains every group of the " \
           "samplers' first round" in out.stdout
    assert json.loads((run_dir / "config_learner.json").read_text())["max_staleness"] == 3
    summary = json.loads((run_dir / "summary.json").read_text())
    groups, ages = summary["groups"], {int(a): n for a, n in summary["ages"].items()}
    assert groups["balanced"] and groups["trained"] == 2 * STEPS, groups
    judged, stale = sum(ages.values()), groups["dropped"].get("stale", 0)
    early = "generating round 0 with version 0" in (run_dir / "sampler0.log").read_text()
    assert judged >= 2 * STEPS and stale <= 0.02 * judged, (stale, ages, f"round 0 before the first answer: {early}")
    assert stale == sum(n for a, n in ages.items() if a > 3)
