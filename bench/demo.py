"""`make demo` on a GPU, timed from launch and written down: greedy accuracy before and after on the
held-out subset, steps, the groups' books, and the seconds from launch to the report.

    python bench/demo.py run --out bench/results/demo_gsm8k_<device>.json [-- DEMO_ARGS...]
    python bench/demo.py summarise RUN_DIR --launch T0 --end T1 --command "..." --out FILE [--device-json F]

Each call adds its run to the --out file's "runs". `run` calls `make demo-run` (with the extra flags after `--`, e.g. `--dataset /tmp/data/gsm8k` on a
machine without the hub) and then `summarise`. `summarise` reads a finished demo's run folder
(eval.jsonl, summary.json, config_*.json) and the launch and end times (epoch seconds).
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import ROOT, device_name, pick, versions  # noqa: E402


def summarise(run_dir: Path, launch: float, end: float, command: str, device: str, vers: dict) -> dict:
    evals = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines() if line.strip()]
    summary = json.loads((run_dir / "summary.json").read_text())
    sampler = json.loads((run_dir / "config_sampler0.json").read_text())
    before, after = evals[0], evals[-1]
    return {
        "device": device, "versions": vers, "command": command, "commit": summary.get("commit"),
        "seed": sampler.get("seed"), "model": sampler.get("model"), "dataset": sampler.get("dataset"),
        "in_flight_rows": sampler.get("in_flight_rows"),
        "eval_size": after["n"], "before": before["accuracy"], "after": after["accuracy"],
        "points": round(100 * (after["accuracy"] - before["accuracy"]), 1),
        "after_version": after["version"], "after_by": after["by"],
        "launch_to_end_s": round(end - launch, 1),
        "after_eval_s_from_launch": round(after["time"] - launch, 1),
        "steps": summary["steps"], "train_s": round(summary["elapsed_s"], 1),
        "first_step_s": summary.get("first_step_s"), "groups": summary.get("groups"),
        "evaluations": [{k: e[k] for k in ("version", "by", "accuracy", "correct", "n", "seconds")} for e in evals],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--run-dir", type=Path, default=Path("/tmp/rw/demo"))
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("demo_args", nargs=argparse.REMAINDER, help="flags after the config, after --")
    s = sub.add_parser("summarise")
    s.add_argument("run_dir", type=Path)
    s.add_argument("--launch", type=float, required=True)
    s.add_argument("--end", type=float, required=True)
    s.add_argument("--command", required=True)
    s.add_argument("--device-json", type=Path, help="device and versions from this file (bench/benchmark.py's)")
    s.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.cmd == "run":
        extra = [a for a in args.demo_args if a != "--"]
        cmd = ["make", "-C", str(ROOT), "demo-run", f"PYTHON={sys.executable}", f"DEMO_RUN={args.run_dir}",
               f"DEMO_ARGS={shlex.join(extra)}"]
        launch = time.time()
        rc = subprocess.run(cmd).returncode
        end = time.time()
        if rc != 0:
            print(f"demo: make demo-run exited {rc}", file=sys.stderr)
            return rc
        result = summarise(args.run_dir, launch, end, shlex.join(cmd), device_name(pick("auto")), versions())
    else:
        dev = json.loads(args.device_json.read_text()) if args.device_json else {}
        result = summarise(args.run_dir, args.launch, args.end, args.command,
                           dev.get("device") or device_name(pick("auto")), dev.get("versions") or versions())
    # one file holds a demo's repeats: a run is added to the file's "runs"
    runs = json.loads(args.out.read_text())["runs"] if args.out.is_file() else []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"runs": runs + [result]}, indent=1) + "\n")
    print(f"demo: {result['before']:.3f} -> {result['after']:.3f} ({result['points']:+.1f} points, "
          f"{result['eval_size']} problems), {result['steps']} steps, {result['launch_to_end_s']:.0f} s from launch "
          f"to the report; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
