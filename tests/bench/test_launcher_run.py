"""bench/results/gpus0_chosen_NVIDIA_H200.json is what bench/launcher_run.py makes of its committed run files."""
import json
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT / "bench"))

import launcher_run  # noqa: E402


def test_the_committed_result_is_what_its_run_files_say(tmp_path):
    committed = json.loads((RESULTS / "gpus0_chosen_NVIDIA_H200.json").read_text())
    with tarfile.open(RESULTS / "real_workload" / "gpus0_1x_H200_e2590c3.tgz") as t:
        t.extractall(tmp_path, filter="data")
    mine = launcher_run.summarise(tmp_path)
    assert {k: committed[k] for k in mine} == mine
    assert committed["run_command"] == " ".join(json.loads((tmp_path / "launch_command.json").read_text())["command"])
    assert (mine["steps"], mine["balance"], mine["evaluations"][-1]["accuracy"]) == (51, "balanced", 0.336)
    assert mine["launcher_lines"][1].startswith("run_distributed.py: --in-flight-rows 320 on each sampler")
