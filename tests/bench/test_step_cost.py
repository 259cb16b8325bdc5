"""bench/step_cost.py's figures from a run's files, and bench/profile_summary.py's reading of a
trace, by hand; and the committed step-cost result rebuilt from its committed run files."""
import gzip
import json
from pathlib import Path

import pytest

from benchload import load_bench

ROOT = Path(__file__).resolve().parents[2]
step_cost = load_bench("step_cost")
profile_summary = load_bench("profile_summary")


def _run(tmp_path: Path, launched: float, steps: list[dict]) -> Path:
    (tmp_path / "stages").mkdir()
    (tmp_path / "stages" / "learner0.json").write_text(json.dumps(
        {"stage": "first_step", "history": [{"stage": "started", "time": launched + 0.5},
                                            {"stage": "first_step", "time": launched + 12.25}]}))
    lines = [json.dumps({"step": i + 1, **s}) for i, s in enumerate(steps)] + [json.dumps({"final": True})]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return tmp_path


def test_run_figures_leave_out_the_first_steps_hand_worked(tmp_path):
    steps = [{"step_time_s": t, "train_s": t - w, "data_wait_s": w, "tokens": n, "reward_mean": r}
             for t, w, n, r in [(9.0, 5.0, 17000, 0.1), (3.0, 1.0, 16000, 0.2), (2.0, 0.5, 9000, 0.3),
                                (1.0, 0.5, 3000, 0.4), (1.5, 0.25, 2000, 0.5), (0.5, 0.0, 1000, 0.6)]]
    run = _run(tmp_path, 1000.0, steps)
    (run / "sampler0_result.json").write_text(json.dumps({"rounds": 4, "gen_s": 8.0, "logprob_s": 1.0, "reward_s": 0.5}))
    got = step_cost.run_figures(run, 1000.0)
    assert step_cost.SKIP_STEPS == 3
    # steps 4-6: step times 1.0, 1.5, 0.5 -> 1.0; train 0.5, 1.25, 0.5 -> 0.5; wait 0.5, 0.25, 0 -> 0.25;
    # the sampler's 4 rounds: 8 / 4 = 2 s generating, 1 / 4 in log-prob passes, 0.5 / 4 scoring
    assert got == {"first_step_s": 12.25, "steps": 6, "step_time_s": 1.0, "train_s": 0.5, "data_wait_s": 0.25,
                   "first_train_s": 4.0, "tokens_median": 2000, "reward_by_step": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6],
                   "stages": {"learner0": {"started": 0.5, "first_step": 12.25}},
                   "sampler": {"rounds": 4, "gen_s_per_round": 2.0, "logprob_s_per_round": 0.25,
                               "reward_s_per_round": 0.125}}


def test_profile_summary_counts_top_level_operators_and_kernels():
    x = lambda name, cat, ts, dur, tid=1: {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "tid": tid}
    trace = {"traceEvents": [
        x("aten::linear", "cpu_op", 0, 100), x("aten::mm", "cpu_op", 10, 80),     # mm inside linear
        x("aten::linear", "cpu_op", 200, 50), x("aten::to", "cpu_op", 300, 30),
        x("backward", "cpu_op", 0, 400, tid=2),
        x("gemm", "kernel", 20, 60, tid=7), x("gemm", "kernel", 210, 40, tid=7), x("cast", "kernel", 305, 5, tid=7),
        {"ph": "i", "name": "marker", "ts": 5}]}
    got = profile_summary.summarise(trace)
    assert (got["span_ms"], got["kernels"], got["kernel_ms"], got["host_ops"]) == (0.4, 3, 0.1, 5)
    assert got["top_kernels"][0] == {"name": "gemm", "ms": 0.1, "calls": 2}
    assert list(got["threads"]) == ["2", "1"]             # by top-level time: 400 us, then 180 us
    one = got["threads"]["1"]
    assert (one["ops"], one["top_level_ms"]) == (4, 0.2)   # 100 + 50 + 30 us, the mm inside not again
    assert one["top"][0] == {"name": "aten::linear", "ms": 0.1, "calls": 2}


@pytest.mark.parametrize(("result", "folder"), [("step_cost_NVIDIA_H100_80GB_HBM3_ab.json", "step_cost"),
                                               ("step_cost_NVIDIA_H100_80GB_HBM3_startup_ab.json", "step_cost/startup_ab")])
def test_committed_step_cost_result_matches_its_run_files(result, folder):
    doc = json.loads((ROOT / "bench" / "results" / result).read_text())
    for row in doc["runs"]:
        run = ROOT / "bench" / "results" / folder / f"{row['variant']}_{row['repeat']}"
        steps = [json.loads(line) for line in gzip.decompress((run / "metrics.jsonl.gz").read_bytes()).splitlines()
                 if line.strip()]
        steps = [s for s in steps if "step" in s and not s.get("final")]
        assert len(steps) == row["steps"]
        assert [round(s["reward_mean"], 4) for s in steps] == row["reward_by_step"]
        assert round(steps[0]["train_s"], 3) == row["first_train_s"]
        if "sampler" in row:   # the sampler's split per round, from its result file
            assert step_cost.sampler_split(run) == row["sampler"]
