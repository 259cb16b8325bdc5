"""A run as a user makes it, `run_distributed.py` with their flags, summarised into bench/results/:
what the launcher chose (its start-up lines), steps, rates, the bf16 peak share, books and evaluations.

    python bench/launcher_run.py --name gpus0_chosen --device-name "NVIDIA H200" -- \
        --gpus 0 --model /tmp/gguf/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --dataset /tmp/gsm8k \
        --num-generations 16 --train-batch-size 128 --max-new-tokens 512 --learning-rate 2e-6 --beta 0 \
        --loss-type dapo --filter-zero-signal --reward correctness --eval-every 100000 --eval-size 500 \
        --max-time-s 150 --max-steps 100000 --seed 42 --run-dir /tmp/r4
    python bench/launcher_run.py --name gpus0_chosen --device-name "NVIDIA H200" --from-run DIR   # summarise only

The run's folder gets launcher.log (the launcher's output); --from-run summarises a folder that holds
it with summary.json, metrics.jsonl and eval.jsonl (results/real_workload/gpus0_1x_H200_e2590c3.tgz).
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import ROOT, write_result  # noqa: E402  (also puts the repo root on sys.path)
from benchmark import both_busy_medians  # noqa: E402

import torch  # noqa: E402


def summarise(run: Path) -> dict:
    """The run's figures; the first step (it waits for the first groups) is left out of the medians."""
    lines = (run / "launcher.log").read_text().splitlines()
    steps = [r for r in map(json.loads, filter(str.strip, (run / "metrics.jsonl").read_text().splitlines()))
             if "step_time_s" in r]
    summary = json.loads((run / "summary.json").read_text())
    evals = [json.loads(x) for x in (run / "eval.jsonl").read_text().splitlines() if x.strip()]
    later = steps[1:] or steps
    return {"launcher_lines": [x for x in lines if not x.startswith(("[launcher] step", "memory plan"))][:4],
            "steps": len(steps), "train_seconds": round(steps[-1]["time_s"], 1),
            "steps_per_s": round(len(steps) / steps[-1]["time_s"], 4),
            "median_step_s": round(statistics.median(r["step_time_s"] for r in later), 3),
            "learner_busy_share_median": round(statistics.median(r["learner_busy_share"] for r in later), 3),
            "bf16_peak_share_median": (round(statistics.median(r["bf16_peak_share"] for r in later), 4)
                                       if later[0].get("bf16_peak_share") is not None else None),
            **({"both_busy_share_median": both} if (both := both_busy_medians(steps)) else {}),
            "groups": summary["groups"], "balance": summary["balance"]["text"], "ages": summary["ages"],
            "evaluations": [{k: e[k] for k in ("version", "by", "accuracy", "correct", "n")} for e in evals]}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, flags = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--name", required=True, help="the result file: bench/results/<name>_<device>.json")
    ap.add_argument("--device-name", default="", help="the device as the file names it (default: CUDA's name)")
    ap.add_argument("--from-run", default="", help="summarise this run folder instead of running")
    ap.add_argument("--note", default="", help="kept in the result's notes")
    ap.add_argument("--commit", default="", help="--from-run: the commit the run's tree was (default: this tree's)")
    ap.add_argument("--versions", default="", help="--from-run: the run machine's versions, as JSON")
    args = ap.parse_args(ours)
    if args.from_run:
        run = Path(args.from_run)
        command = json.loads((run / "launch_command.json").read_text())["command"]
    else:
        if "--run-dir" not in flags:
            ap.error("give the run's flags after --, --run-dir among them")
        run = Path(flags[flags.index("--run-dir") + 1])
        command = [sys.executable, str(ROOT / "run_distributed.py"), *flags]
        run.mkdir(parents=True, exist_ok=True)
        (run / "launch_command.json").write_text(json.dumps({"command": command}) + "\n")
        with open(run / "launcher.log", "w") as fh:
            code = subprocess.call(command, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT)
        if code:
            print(f"launcher_run: the run exited {code}; see {run / 'launcher.log'}", file=sys.stderr)
            return code
    payload = {"run_command": shlex.join(command), **summarise(run), **({"notes": [args.note]} if args.note else {}),
               # a run made on another machine: its commit and versions, not this one's
               **({"commit": args.commit} if args.commit else {}),
               **({"versions": json.loads(args.versions)} if args.versions else {})}
    device = torch.device("cuda" if args.device_name or torch.cuda.is_available() else "cpu")
    path = write_result(args.name, device, payload, label=args.device_name or None)
    print(f"launcher_run: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
