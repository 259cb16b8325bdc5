"""One learner step on a shared GPU, profiled: the benchmark's one-GPU settings in several layouts.

Each variant runs ours as the benchmark's one-GPU row would (bench/benchmark.py's shared settings,
the same model and data), for --steps steps, with `--profile-steps K-K`: the learner writes a
torch.profiler trace of step K, and the sampler one of its chunk K, the making of a step's groups
(grpo.obs.profile). Each trace is summarised here (the device's kernel time against the span, the
time the device ran any of the process's kernels and its idle gaps over 1 ms, the kernels by time,
each host thread's top-level operators), beside the run's step records (median step, training
seconds, the share both were busy). Variants:

  rounds     --sampling-gpu 0 --training-gpus 0 --share-gpus: one process at a time, weights shared
  inflight   --gpus 0: the launcher's choice, rows in flight, weights swapped by CUDA IPC
  inflight-torch  the same with --no-deepspeed (plain AdamW: what ZeRO-2's hooks cost on one rank)
  inflight-unfused  --gpus 0 with the decode of 2026-11-29: torch's sampling ops, Hugging Face's layers
  inflight-bf16  --gpus 0 with --precision bf16 (bf16 weights, DeepSpeed's fp32 master copies)
  inflight-padded  --gpus 0 with --no-padding-free (the learner's passes over right-padded rows)
  inflight-sdpa  --gpus 0 with SDPA's decode attention and torch's log-prob ops (--no-fused-attention
             --no-fused-logprobs: the kernels of 2026-11-30 off)

    python bench/step_profile.py --model /tmp/gguf/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
        --dataset /tmp/data/gsm8k --variants rounds,inflight --out-dir $OUT

Writes <out-dir>/step_profile_<device>.json (command, commit: $GRPO_GIT_COMMIT on a copy without
.git, seeds, device and versions; the traces themselves, tens of MB, are not kept: the command
makes them again). CPU check:
`--model tiny-random --device cpu --steps 3 --step 2` (the trace then has host time only).
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchmark as rw  # noqa: E402
from benchutil import ROOT, pick, write_result  # noqa: E402  (also puts the repo root on sys.path)

# variant -> (bench/benchmark.py's layout, flags added to ours' command)
VARIANTS = {"rounds": ("1gpu", ""), "inflight": ("1gpu-chosen", ""), "inflight-torch": ("1gpu-chosen", "--no-deepspeed"),
            "inflight-unfused": ("1gpu-chosen", "--no-fused-sampling --no-liger-decode"),
            "inflight-bf16": ("1gpu-chosen", "--precision bf16"),
            "inflight-padded": ("1gpu-chosen", "--no-padding-free"),
            "inflight-sdpa": ("1gpu-chosen", "--no-fused-attention --no-fused-logprobs")}


def summarise_trace(trace: dict, top: int = 12) -> dict:
    """A Chrome trace's span, its kernels' total time (the device busy for this process), the
    kernels by time, and per host thread the top-level operators (those not inside another)."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    ops = [e for e in events if e.get("cat") in ("cpu_op", "user_annotation")]
    by_kernel: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for e in kernels:
        k = by_kernel[e["name"][:90]]
        k[0] += e["dur"]
        k[1] += 1
    threads = {}
    for tid in {e["tid"] for e in ops}:
        mine = sorted((e for e in ops if e["tid"] == tid), key=lambda e: (e["ts"], -e["dur"]))
        outer, end = [], float("-inf")
        for e in mine:
            if e["ts"] >= end:
                outer.append(e)
                end = e["ts"] + e["dur"]
        agg: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
        for e in outer:
            a = agg[e["name"]]
            a[0] += e["dur"]
            a[1] += 1
        threads[str(tid)] = {"ops": len(mine), "top_level_ms": round(sum(e["dur"] for e in outer) / 1e3, 1),
                             "top": [{"name": n, "ms": round(t / 1e3, 1), "calls": c}
                                     for n, (t, c) in sorted(agg.items(), key=lambda x: -x[1][0])[:top]]}
    span = (max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events)) / 1e3 if events else 0.0
    kernel_ms = sum(e["dur"] for e in kernels) / 1e3
    busy_ms, gaps = device_busy(kernels)
    main = max(threads.values(), key=lambda t: t["top_level_ms"]) if threads else {"top": []}
    return {"span_ms": round(span, 1), "kernels": len(kernels), "kernel_ms": round(kernel_ms, 1),
            "kernel_share_of_span": round(kernel_ms / span, 3) if span else None,
            "device_busy_ms": round(busy_ms, 1), "device_gaps_over_1ms": {"count": len(gaps), "ms": round(sum(gaps), 1)},
            "host_ops": len(ops),
            "top_kernels": [{"name": n, "ms": round(t / 1e3, 1), "calls": c}
                            for n, (t, c) in sorted(by_kernel.items(), key=lambda x: -x[1][0])[:top]],
            "main_thread_top": main["top"]}


def device_busy(kernels: list[dict], gap_ms: float = 1.0) -> tuple[float, list[float]]:
    """(ms the device ran any of the process's kernels: the union of their intervals, so kernels on
    two streams at once count once; the idle gaps longer than gap_ms between them, in ms). A
    sampler's gaps are where it queued no work: its host was busy, or it waited."""
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in kernels)
    busy, gaps, start, end = 0.0, [], None, None
    for a, b in spans:
        if end is None or a > end:
            if end is not None:
                busy += end - start
                if (a - end) / 1e3 > gap_ms:
                    gaps.append((a - end) / 1e3)
            start, end = a, b
        else:
            end = max(end, b)
    if end is not None:
        busy += end - start
    return busy / 1e3, gaps


def step_figures(run: Path) -> dict:
    """The run's step records: steps, medians of the step, its training seconds, its tokens, its bf16
    peak share and the both-busy share (the first step, which waits for round 0, left out)."""
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in recs if "step_time_s" in r]
    later = steps[1:] or steps
    def med(key: str) -> float | None:
        vals = [r[key] for r in later if r.get(key) is not None]
        return round(statistics.median(vals), 4) if vals else None

    return {"steps": len(steps), "median_step_s": med("step_time_s"), "median_train_s": med("train_s"),
            "median_data_wait_s": med("data_wait_s"), "median_tokens": med("tokens"),
            "median_bf16_peak_share": med("bf16_peak_share"),
            "both_busy_share_median": rw.both_busy_medians(steps),
            "per_step": [{k: r.get(k) for k in ("step", "step_time_s", "data_wait_s", "train_s", "tokens",
                                                "both_busy_share")} for r in steps]}


def variant_command(name: str, args: argparse.Namespace, run: Path) -> list[str]:
    """Ours' command for a variant: the benchmark's one-GPU row in the variant's layout with its
    flags, stopped after --steps, the learner tracing step --step."""
    layout, flags = VARIANTS[name]
    bm = argparse.Namespace(device=args.device, dataset=args.dataset, eval_size=16, seconds=3600,
                            save_schedule="100000", ours_flags=flags)
    cmd = rw.ours_command(bm, {"seed": args.seed, "layout": layout, "trainer": "ours"}, run, model=args.model)
    return cmd + ["--max-steps", str(args.steps), "--profile-steps", f"{args.step}-{args.step}"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="--model for ours (a GGUF file, a folder, tiny-random)")
    ap.add_argument("--dataset", required=True, help="the GSM8K folder")
    ap.add_argument("--variants", default="rounds,inflight", help=f"comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--steps", type=int, default=14, help="steps each variant runs")
    ap.add_argument("--step", type=int, default=12, help="the step profiled (well after start-up)")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu"), help="cpu: a smoke check")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--work-dir", default="/tmp/step_profile", help="the runs' folders")
    ap.add_argument("--out-dir", default="", help="where the result JSON goes (default: bench/results)")
    args = ap.parse_args(argv)
    names = [v for v in args.variants.split(",") if v]
    if bad := [v for v in names if v not in VARIANTS]:
        raise SystemExit(f"step_profile: unknown variant {bad[0]!r}; give some of {', '.join(VARIANTS)}")
    out: dict = {"seeds": [args.seed], "step_profiled": args.step, "variants": {}}
    for name in names:
        run = Path(args.work_dir) / name
        shutil.rmtree(run, ignore_errors=True)   # a run folder is appended to: start each variant afresh
        cmd = variant_command(name, args, run)
        t0 = time.perf_counter()
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        entry = {"command": cmd, "exit": r.returncode, "wall_s": round(time.perf_counter() - t0, 1)}
        if r.returncode != 0:
            entry["tail"] = (r.stdout + r.stderr)[-3000:]
        else:
            entry.update(step_figures(run))
            for trace in sorted((run / "profile").glob("*.json.gz")):
                entry[trace.name.split(".")[0]] = summarise_trace(json.loads(gzip.decompress(trace.read_bytes())))
        out["variants"][name] = entry
        print(f"step_profile: {name}: exit {r.returncode}, {entry.get('steps')} steps, median "
              f"{entry.get('median_step_s')} s (train {entry.get('median_train_s')}), both busy "
              f"{entry.get('both_busy_share_median')}", flush=True)
    # the children are done: asking CUDA for the device's name here holds no GPU from them
    path = write_result("step_profile", pick(args.device), out, results_dir=Path(args.out_dir) if args.out_dir else None)
    print("wrote", path)
    return 0 if all(v["exit"] == 0 for v in out["variants"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
