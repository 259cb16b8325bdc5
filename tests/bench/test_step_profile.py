"""bench/step_profile.py's reading of a trace, by hand."""
from benchload import load_bench

sp = load_bench("step_profile")


def test_a_trace_is_summarised_by_hand():
    # one thread: a step (0-10 ms) holding a matmul (1-3 ms) and, after it, a loose op (12-13 ms);
    # two kernels of 1.5 and 0.5 ms: the device busy 2 ms of the 13 ms span
    ev = [{"ph": "X", "cat": "cpu_op", "name": "step", "ts": 0, "dur": 10_000, "tid": 1},
          {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1_000, "dur": 2_000, "tid": 1},
          {"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "ts": 12_000, "dur": 1_000, "tid": 1},
          {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 1_500, "dur": 1_500, "tid": 7},
          {"ph": "X", "cat": "kernel", "name": "copy", "ts": 12_100, "dur": 500, "tid": 7},
          {"ph": "i", "cat": "cpu_op", "name": "instant", "ts": 50, "tid": 1}]   # not a span: left out
    got = sp.summarise_trace({"traceEvents": ev})
    assert (got["span_ms"], got["kernels"], got["kernel_ms"], got["kernel_share_of_span"]) == (13.0, 2, 2.0, 0.154)
    assert got["top_kernels"] == [{"name": "gemm", "ms": 1.5, "calls": 1}, {"name": "copy", "ms": 0.5, "calls": 1}]
    # the device ran the two kernels 2 ms in all; idle from 3.0 to 12.1 ms: one gap over 1 ms, 9.1 ms
    assert (got["device_busy_ms"], got["device_gaps_over_1ms"]) == (2.0, {"count": 1, "ms": 9.1})
    # top level only: the matmul inside the step is not counted again
    assert got["main_thread_top"] == [{"name": "step", "ms": 10.0, "calls": 1},
                                      {"name": "aten::copy_", "ms": 1.0, "calls": 1}]


def test_each_variant_is_the_benchmark_row_with_its_flags(tmp_path):
    import argparse
    args = argparse.Namespace(device="auto", dataset="/data/gsm8k", seed=7, steps=5, step=3, model="tiny-random")
    cmds = {name: sp.variant_command(name, args, tmp_path / name) for name in sp.VARIANTS}
    joined = {name: " ".join(cmd) for name, cmd in cmds.items()}
    assert "--share-gpus" in cmds["rounds"] and "--gpus" not in cmds["rounds"]
    for name in ("inflight", "inflight-torch", "inflight-unfused", "inflight-bf16", "inflight-padded", "inflight-sdpa"):
        assert cmds[name][cmds[name].index("--gpus") + 1] == "0" and "--share-gpus" not in cmds[name]
    assert "--no-deepspeed" in cmds["inflight-torch"] and "--no-deepspeed" not in cmds["inflight"]
    assert "--no-fused-sampling --no-liger-decode" in joined["inflight-unfused"]
    assert "--precision bf16" in joined["inflight-bf16"]
    assert cmds["inflight-padded"].count("--no-padding-free") == 1 and "--no-padding-free" not in cmds["inflight"]
    assert "--no-fused-attention --no-fused-logprobs" in joined["inflight-sdpa"] and "fused" not in joined["inflight"]
    for name, cmd in cmds.items():   # the benchmark's settings, then the profile's stop and trace
        assert "--seed 7" in joined[name] and "--num-generations=16" in joined[name]
        assert cmd[-4:] == ["--max-steps", "5", "--profile-steps", "3-3"]
        assert cmd[cmd.index("--run-dir") + 1] == str(tmp_path / name)


def test_device_busy_is_the_union_of_the_kernels():
    # 0-2 ms and 1-3 ms on two streams overlap: busy 3 ms, not 4; then 3.5-4 ms (a 0.5 ms gap, not
    # counted) and 6-7 ms (a 2 ms gap)
    ks = [{"ts": 0, "dur": 2_000}, {"ts": 1_000, "dur": 2_000}, {"ts": 3_500, "dur": 500}, {"ts": 6_000, "dur": 1_000}]
    assert sp.device_busy(ks) == (4.5, [2.0])
    assert sp.device_busy([]) == (0.0, [])
