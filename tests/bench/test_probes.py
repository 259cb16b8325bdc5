"""The probes' own rules by hand: bench/task_probe.py scores with each task's scorer, and
bench/profile_summary.py reads a --profile-steps trace into kernel and host time."""
from benchload import load_bench

from grpo.data.sources import load_problems


class _Tok:
    def decode(self, ids, skip_special_tokens=True):
        return ids


def test_task_probe_scores_with_the_task_scorer():
    tp = load_bench("task_probe")
    problems = load_problems("rg:letter_counting", limit=4, seed=0)
    right, wrong = [f"So #### {p.answer}" for p in problems], ["#### 999"] * 4
    assert tp.score(_Tok(), problems, right, 1) == [1.0] * 4
    assert tp.score(_Tok(), problems, wrong, 1) == [0.0] * 4


def test_profile_summary_counts_top_level_operators_and_kernels():
    profile_summary = load_bench("profile_summary")
    x = lambda name, cat, ts, dur, tid=1: {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "tid": tid}  # noqa: E731
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
