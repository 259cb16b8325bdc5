"""What a --profile-steps record says, in numbers: a Chrome trace (grpo.obs.profile) summarised.

For a trace of a learner's steps or a sampler's rounds: the time the device spent in kernels
against the host's operator time, the kernels by total time, and, per host thread, the top-level
operators (those not inside another) by total time: where a step's host time goes when its
kernels need a tenth of it.

    python bench/profile_summary.py runs/x/profile/learner0_20-21.json.gz --out bench/results/profile_x.json \
        --run-command "the command that made the trace" --run-commit <its commit>

The JSON records this script's command and commit, and the run's (--run-command, --run-commit):
the trace itself (tens of MB) is not kept, so the run is how to make it again.
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from grpo.obs.rundir import provenance  # noqa: E402


def summarise(trace: dict, top: int = 15) -> dict:
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    ops = [e for e in events if e.get("cat") in ("cpu_op", "user_annotation")]
    by_kernel: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for e in kernels:
        k = by_kernel[e["name"][:100]]
        k[0] += e["dur"]
        k[1] += 1
    threads = {}
    for tid in {e["tid"] for e in ops}:
        mine = sorted((e for e in ops if e["tid"] == tid), key=lambda e: (e["ts"], -e["dur"]))
        outer, end = [], float("-inf")
        for e in mine:   # top level: not inside the operator before it
            if e["ts"] >= end:
                outer.append(e)
                end = e["ts"] + e["dur"]
        agg: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
        for e in outer:
            a = agg[e["name"]]
            a[0] += e["dur"]
            a[1] += 1
        threads[str(tid)] = {
            "ops": len(mine), "top_level_ms": round(sum(e["dur"] for e in outer) / 1e3, 1),
            "top": [{"name": n, "ms": round(t / 1e3, 1), "calls": c}
                    for n, (t, c) in sorted(agg.items(), key=lambda x: -x[1][0])[:top]]}
    span = (max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events)) / 1e3 if events else 0.0
    annotations = collections.Counter(e["name"] for e in events if e.get("cat") == "user_annotation")
    return {"span_ms": round(span, 1), "kernels": len(kernels),
            "kernel_ms": round(sum(e["dur"] for e in kernels) / 1e3, 1),
            "host_ops": len(ops), "annotations": dict(annotations),
            "top_kernels": [{"name": n, "ms": round(t / 1e3, 1), "calls": c}
                            for n, (t, c) in sorted(by_kernel.items(), key=lambda x: -x[1][0])[:top]],
            "threads": dict(sorted(threads.items(), key=lambda x: -x[1]["top_level_ms"]))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", help="a .json or .json.gz Chrome trace")
    ap.add_argument("--out", default="", help="also write the summary here as JSON")
    ap.add_argument("--note", default="", help="recorded in the JSON: what the trace is of")
    ap.add_argument("--run-command", default="", help="recorded: the command whose run wrote the trace")
    ap.add_argument("--run-commit", default="", help="recorded: the commit that run ran")
    args = ap.parse_args(argv)
    raw = Path(args.trace).read_bytes()
    trace = json.loads(gzip.decompress(raw) if args.trace.endswith(".gz") else raw)
    out = {"trace": Path(args.trace).name, "note": args.note, **provenance(),
           "run_command": args.run_command, "run_commit": args.run_commit, **summarise(trace)}
    print(f"span {out['span_ms']} ms, {out['kernels']} kernels for {out['kernel_ms']} ms, {out['host_ops']} host ops")
    for tid, t in out["threads"].items():
        print(f"thread {tid}: {t['ops']} ops, top level {t['top_level_ms']} ms")
        for row in t["top"][:8]:
            print(f"   {row['ms']:9.1f} ms {row['calls']:6d}  {row['name']}")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
