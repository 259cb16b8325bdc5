"""The demo's evidence: bench/demo_summary.py rebuilds the committed result from the committed run
files; bench/task_probe.py's scoring uses each task's own scorer (a right answer scores 1)."""
import json
from pathlib import Path

from benchload import load_bench

from grpo.data.sources import load_problems

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"


def test_the_committed_demo_result_is_what_its_run_files_say():
    ds = load_bench("demo_summary")
    committed = json.loads((RESULTS / "demo_NVIDIA_H200.json").read_text())
    for row in committed["runs"]:
        again = ds.summarise(RESULTS / "demo" / row["run"], row["command_wall_seconds"])
        assert again == row, row["run"]
    best = [r for r in committed["runs"] if r["run"].startswith("run_240s")]
    assert all(r["ratio"] >= 2.0 for r in best)                       # the make demo-run settings
    assert {r["baseline_accuracy"] for r in committed["runs"]} == {0.145}


class _Tok:
    def decode(self, ids, skip_special_tokens=True):
        return ids


def test_task_probe_scores_with_the_task_scorer():
    tp = load_bench("task_probe")
    problems = load_problems("rg:letter_counting", limit=4, seed=0)
    right, wrong = [f"So #### {p.answer}" for p in problems], ["#### 999"] * 4
    assert tp.score(_Tok(), problems, right, 1) == [1.0] * 4
    assert tp.score(_Tok(), problems, wrong, 1) == [0.0] * 4
