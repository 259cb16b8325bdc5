"""What a step costs, variant against variant, on one GPU shared by sampler and learner.

Runs ours with the time-to-accuracy settings (bench/time_to_accuracy.py: task, G, batch, learning
rate, loss; no weight saves) once per variant per repeat, the variants alternating so that a
machine's drift (file cache, clocks) falls on all of them alike, and reads each run's files:
seconds from launch to the first optimizer step, steps made, and the median step time, train time
and data wait of the steps after the first three; the sampled (train) reward by version shows
whether a variant learns alike per step. Nothing is scored on held-out problems.

    python bench/step_cost.py --variant base="--micro-batch-tokens -1 --cudnn-attention --no-warm-up" \
        --variant new="" --repeats 2 --seconds 50 --git-commit $(git rev-parse HEAD) --label ab
    python bench/step_cost.py --variant fresh="" --repeats 1 --max-steps 3 --seed 1 --label fresh   # first run
    python bench/step_cost.py --variant base@ab_base="" --variant new="" --task rg:letter_counting ...

A variant named NAME@DIR runs DIR's run_distributed.py: another commit's code (e.g. `git archive
<commit> grpo run_distributed.py sampling_worker.py training_worker.py deepspeed.json | tar -x -C
ab_base`), against this tree's, on the same machine.

Writes bench/results/step_cost_<device>.json (with --label: step_cost_<device>_<label>.json).
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import ROOT, versions  # noqa: E402
from time_to_accuracy import OURS_ONLY, SHARED  # noqa: E402

from grpo.obs.rundir import provenance  # noqa: E402
from grpo.obs.stages import history  # noqa: E402

SKIP_STEPS = 3   # the first steps pay start-up (round 0, first kernels): left out of the medians


def run_figures(run: Path, launched: float) -> dict:
    """One run's figures from its stage files and metrics.jsonl."""
    stages = json.loads((run / "stages" / "learner0.json").read_text())["history"]
    first = next((e["time"] - launched for e in stages if e["stage"] == "first_step"), None)
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [s for s in steps if "step" in s and not s.get("final")]
    later = steps[SKIP_STEPS:] or steps

    def median(key):
        return round(statistics.median(s[key] for s in later), 3) if later else None

    return {"first_step_s": None if first is None else round(first, 2), "steps": len(steps),
            "step_time_s": median("step_time_s"), "train_s": median("train_s"), "data_wait_s": median("data_wait_s"),
            "first_train_s": round(steps[0]["train_s"], 3) if steps else None,
            "tokens_median": median("tokens"),
            "reward_by_step": [round(s["reward_mean"], 4) for s in steps],
            "stages": stage_seconds(run, launched), "sampler": sampler_split(run)}


def stage_seconds(run: Path, launched: float) -> dict:
    """{process: {stage: seconds from launch}}, each stage's first time."""
    out: dict[str, dict[str, float]] = {}
    for process, entries in history(run).items():
        for e in entries:
            out.setdefault(process, {}).setdefault(e["stage"], round(e["time"] - launched, 2))
    return out


def sampler_split(run: Path) -> dict | None:
    """Sampler 0's rounds and its seconds a round generating, in log-prob passes and scoring."""
    path = run / "sampler0_result.json"
    if not path.is_file():
        return None
    r = json.loads(path.read_text())
    n = max(1, int(r["rounds"]))
    return {"rounds": int(r["rounds"]),
            **{f"{k}_per_round": round(r[k] / n, 3) for k in ("gen_s", "logprob_s", "reward_s")}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", action="append", required=True,
                    help='NAME="flags appended to ours\' command" (repeat for each variant)')
    ap.add_argument("--task", default="rg:basic_arithmetic:min_terms=2,max_terms=2,max_digits=1")
    ap.add_argument("--seconds", type=float, default=50.0, help="each run's --max-time-s")
    ap.add_argument("--max-steps", type=int, default=0,
                    help="each run stops after this many steps instead (0: --seconds); with --repeats 1 on a "
                         "machine's first run, the first step of a fresh machine")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--work-dir", default="/tmp/step_cost")
    ap.add_argument("--git-commit", default="", help="the commit to record where the tree has no .git")
    ap.add_argument("--label", default="")
    ap.add_argument("--results-dir", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args(argv)
    variants = dict(v.split("=", 1) for v in args.variant)
    rows = []
    for rep in range(args.repeats):
        for name, flags in variants.items():
            label, _, tree = name.partition("@")   # NAME@DIR: DIR's code
            run = Path(args.work_dir) / f"{label}_{rep}"
            launcher = (ROOT / tree if tree else ROOT) / "run_distributed.py"
            cmd = [sys.executable, str(launcher), "--model", "smollm2", "--dataset", args.task,
                   *[f"--{k.replace('_', '-')}={v}" for k, v in SHARED.items()], *OURS_ONLY,
                   *(["--max-steps", str(args.max_steps)] if args.max_steps else
                     ["--max-time-s", str(args.seconds), "--max-steps", "100000"]), "--eval-every", "0",
                   "--save-every", "0", "--seed", str(args.seed), "--run-dir", str(run), *shlex.split(flags)]
            launched = time.time()
            code = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
            row = {"variant": label, "code": tree or ".", "flags": flags, "repeat": rep, "exit_code": code,
                   "command": shlex.join(cmd[1:])}
            row.update(run_figures(run, launched) if code == 0 else {})
            subprocess.run(["rm", "-rf", str(run / "checkpoints")])   # the final checkpoint: GBs, not read
            rows.append(row)
            print(f"{label} #{rep}: exit {code}, first step {row.get('first_step_s')} s, {row.get('steps')} steps, "
                  f"step {row.get('step_time_s')} s (train {row.get('train_s')}, wait {row.get('data_wait_s')}), "
                  f"first train {row.get('first_train_s')} s; sampler {row.get('sampler')}; stages {row.get('stages')}",
                  flush=True)
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    prov = provenance()
    if args.git_commit:
        prov["commit"] = args.git_commit
    out = Path(args.results_dir) / f"step_cost_{device.replace(' ', '_')}{'_' + args.label if args.label else ''}.json"
    out.write_text(json.dumps({"device": device, "versions": versions(), **prov, "seed": args.seed,
                               "task": args.task, "seconds": args.seconds, "max_steps": args.max_steps,
                               "skip_steps": SKIP_STEPS,
                               "variants": variants, "runs": rows}, indent=2) + "\n")
    print("wrote", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
