"""bench/staleness_run.py: the committed figures are what the committed run files say, and its run
mode passes the rollouts issue's flags."""
import json
from pathlib import Path

from benchload import load_bench

ROOT = Path(__file__).resolve().parents[2]


def test_committed_figures_come_from_the_committed_runs():
    sr = load_bench("staleness_run")
    committed = json.loads((ROOT / "bench" / "results" / "staleness_NVIDIA_H200.json").read_text())
    runs = {"before": "run_240s_seed42", "after": "run_240s_seed42_budget"}
    for name, folder in runs.items():
        again = sr.figures(ROOT / "bench" / "results" / "demo" / folder)
        row = {k: v for k, v in committed["runs"][name].items() if k != "trained_per_s_vs_first"}
        assert again == row, name
    assert committed["runs"]["after"]["stale_fraction"] <= 0.02 < committed["runs"]["before"]["stale_fraction"]
    flags = sr.FLAGS
    assert flags[flags.index("--max-time-s") + 1] == "240" and "--share-gpus" in flags
