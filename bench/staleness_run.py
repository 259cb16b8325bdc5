"""The rollouts issue's 240 s run on one GPU (rg:letter_counting, sampler and learner sharing the GPU):
how much of what the sampler made was wasted, and how fast the learner trained.

Run it on a GPU machine (one command, about 5 minutes):
  python bench/staleness_run.py run --run-dir runs/staleness
Summarise one or more finished runs (here or there) into bench/results/staleness_<device>.json:
  python bench/staleness_run.py summarise --device "NVIDIA H200" NAME=RUN_DIR [NAME=RUN_DIR ...]

Figures per run (the issue's goals): the share of groups sent that arrived too stale to train
(<= 2%), the learner's time waiting for data over its step time (< 10%), and completions trained
per second from the first step to the last (>= 1.5x the run before the changes).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import ROOT, read_run_file  # noqa: E402

FLAGS = ["--sampling-gpu", "0", "--training-gpus", "0", "--share-gpus", "--dataset", "rg:letter_counting",
         "--max-time-s", "240", "--max-steps", "100000", "--eval-every", "15", "--eval-size", "200",
         "--num-generations", "16", "--prompts-per-round", "64", "--train-batch-size", "128",
         "--learning-rate", "2e-5", "--beta", "0.0", "--loss-type", "dapo", "--filter-zero-signal",
         "--max-new-tokens", "256", "--max-staleness", "8", "--generation-backend", "fast"]


def figures(run: Path) -> dict:
    """The issue's three figures, and what they are made of, from a run directory."""
    recs = [json.loads(x) for x in read_run_file(run, "metrics.jsonl").splitlines()]
    steps = [r for r in recs if not r.get("final")]
    groups = next((r for r in recs if r.get("final")), steps[-1])["groups"]
    trained = sum(r["sequences"] for r in steps)
    span = steps[-1]["time_s"] - steps[0]["time_s"]
    wait, step_time = sum(r["data_wait_s"] for r in steps[1:]), sum(r["step_time_s"] for r in steps[1:])
    return {"steps": len(steps), "groups": groups,
            "stale_fraction": round(groups["dropped"].get("stale", 0) / groups["sent"], 4),
            "data_wait_fraction": round(wait / step_time, 4) if step_time else None,   # step 1 left out
            "trained_completions_per_s": round(trained / span, 2) if span else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--run-dir", required=True)
    s = sub.add_parser("summarise")
    s.add_argument("--device", required=True)
    s.add_argument("runs", nargs="+", help="NAME=RUN_DIR; the first is the run the others are compared with")
    s.add_argument("--note", default="")
    args, extra = ap.parse_known_args()
    if args.cmd == "run":
        return subprocess.call([sys.executable, str(ROOT / "run_distributed.py"), *FLAGS, *extra,
                                "--run-dir", args.run_dir], cwd=ROOT)
    rows = {}
    for spec in args.runs:
        name, _, path = spec.partition("=")
        rows[name] = figures(Path(path))
    base = next(iter(rows.values()))["trained_completions_per_s"]
    for row in rows.values():
        row["trained_per_s_vs_first"] = round(row["trained_completions_per_s"] / base, 3)
    out = ROOT / "bench" / "results" / f"staleness_{args.device.replace(' ', '_')}.json"
    out.write_text(json.dumps({"device": args.device, "flags": FLAGS, "note": args.note, "runs": rows},
                              indent=2) + "\n")
    for name, row in rows.items():
        print(f"{name}: stale {row['stale_fraction']:.1%}, waiting {row['data_wait_fraction']:.1%} of step time, "
              f"{row['trained_completions_per_s']} completions trained/s ({row['trained_per_s_vs_first']}x)")
    print("wrote", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
