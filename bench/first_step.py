"""Seconds from launch to the first optimizer step (issue 26's goal: at most 10 s with a warm cache,
40 s on a fresh machine), for the benchmark's command: bench/time_to_accuracy.py's `ours`, stopped
after 3 steps. N launches one after another on this machine: on a fresh machine the first is the
fresh figure (the GGUF conversion, cold page cache and first kernels), the rest are warm.

Each run records first_step_s from its launch (time_to_accuracy.first_step_ours: the learner's
'first_step' mark against the launch time), every process's stage marks as seconds from that
launch, and whether the default model's converted folder existed before it. Rows go to
bench/results/first_step_<device>.json under --label, with the command, commit, seed and versions.

    . bench/device_setup.sh && python bench/first_step.py --runs 3 --label today
"""
from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import time_to_accuracy as tta  # noqa: E402
from benchutil import ROOT, commit, versions  # noqa: E402

STEPS = 3


def stage_offsets(stages: dict[str, list[dict]], launch_time: float) -> dict[str, dict[str, float]]:
    """{process: {stage: seconds after launch}} from summary.json's "stages" (each process's marks,
    {"stage", "time"} with Unix times); a stage marked twice keeps its first mark at or after the
    launch, and marks from before it (an earlier launch's, in a reused folder) are left out."""
    out: dict[str, dict[str, float]] = {}
    for proc, marks in stages.items():
        mine: dict[str, float] = {}
        for m in sorted(marks, key=lambda m: float(m["time"])):
            t = float(m["time"]) - launch_time
            if t >= 0 and m["stage"] not in mine:
                mine[m["stage"]] = round(t, 2)
        out[proc] = mine
    return out


def command(a, run_dir: Path) -> list[str]:
    ns = argparse.Namespace(model=a.model, task=a.task, ours_seconds=600.0, save_schedule=tta.SAVE_SCHEDULE,
                            ours_flags=a.ours_flags)
    # argparse keeps a flag's last value: the benchmark's command, stopped after STEPS steps
    return [*tta.ours_command(ns, a.seed, run_dir), "--max-steps", str(STEPS)]


def run_once(a, run_dir: Path) -> dict:
    from grpo.launch.memory import model_folder

    folder = model_folder(a.model)
    cached = bool(folder and (folder / "config.json").is_file())
    cmd = command(a, run_dir)
    tta.check_ours(cmd)
    # launch.json, beside the run: what made it (this script's command line, the code's commit, the seed)
    rec = tta._launch(cmd, run_dir, "ours", {"seed": a.seed, "commit": commit(),
                                             "command_line": shlex.join([Path(sys.executable).name, *sys.argv])})
    first, source = tta.first_step_ours(run_dir, rec["launch_time"])
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        summary = {}
    return {"exit_code": rec["exit_code"], "first_step_s": first, "first_step_from": source,
            "model_cache_existed": cached, "wall_s": round(rec["wall_s"], 2),
            "stages_s": stage_offsets(summary.get("stages") or {}, rec["launch_time"])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="launches, one after another")
    ap.add_argument("--task", default="rg:basic_arithmetic:min_terms=2,max_terms=2,max_digits=1")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--ours-flags", default="", help="appended to ours' command, as time_to_accuracy.py's")
    ap.add_argument("--work-dir", default="/tmp/first_step")
    ap.add_argument("--label", default="first_step")
    ap.add_argument("--results-dir", default=str(ROOT / "bench" / "results"))
    a = ap.parse_args(argv)
    q = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
    device = q.stdout.splitlines()[0].strip() if q.returncode == 0 and q.stdout.strip() else "cpu"
    work = Path(a.work_dir)
    runs = []
    for i in range(a.runs):
        run_dir = work / f"{a.label}_{i}"
        shutil.rmtree(run_dir, ignore_errors=True)   # time_to_accuracy refuses a folder that holds a run
        runs.append(run_once(a, run_dir))
        print(f"first_step: run {i}: {runs[-1]['first_step_s']} s (model cache existed: "
              f"{runs[-1]['model_cache_existed']})", flush=True)
    out = Path(a.results_dir) / f"first_step_{device.replace(' ', '_')}.json"
    doc = json.loads(out.read_text()) if out.is_file() else {"device": device, "rows": {}}
    doc["rows"][a.label] = {"runs": runs, "command": shlex.join(command(a, work / f"{a.label}_N")),
                           "command_line": shlex.join([Path(sys.executable).name, *sys.argv]),
                           "commit": commit(), "seed": a.seed, "versions": versions(("zmq",))}
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
