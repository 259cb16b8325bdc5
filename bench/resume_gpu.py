"""Save and resume of a two-GPU run through run_distributed.py, with its figures.

Usage (GPU machine with 2 GPUs, from the repo root):
  python bench/resume_gpu.py --dataset PATH_TO_GSM8K --steps 20 --save-every 10 --more 10
Quick local check on CPU (tiny-random model):
  python bench/resume_gpu.py --device cpu --model tiny-random --steps 3 --save-every 2 --more 2

Phase 1 runs `run_distributed.py --sampling-gpu 0 --training-gpus 1 --max-steps STEPS
--save-every K`; phase 2 runs it again in the same run directory with `--resume latest
--max-steps STEPS+MORE`. It writes bench/results/resume_<device>.json: the steps each phase
logged, whether the numbering continued (1..STEPS+MORE, each once, policy version == step),
the save times and checkpoint size (from the learner's log and the disk), the resume (load)
time and each phase's wall time.
"""
from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from run_e2e import device_name, versions  # noqa: E402

SAVED = re.compile(r"checkpoint step (\d+) saved to \S+ in ([\d.]+) s \(([\d.]+) MB\)")
RESUMED = re.compile(r"resumed from (\S+) in ([\d.]+) s: continuing at step (\d+)")


def default_dataset() -> str:
    for cand in (ROOT.parent / "shared" / "data" / "gsm8k", ROOT / "shared" / "data" / "gsm8k"):
        if cand.is_dir():
            return str(cand)
    return "rg:gsm_symbolic"


def steps_logged(run_dir: Path) -> list[tuple[int, int]]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    return [(r["step"], r["policy_version"]) for r in recs if not r.get("final")]


def run_phase(cmd: list[str], run_dir: Path, timeout: float) -> dict:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        print(r.stdout[-3000:] + r.stderr[-3000:], file=sys.stderr)
    return {"exit_code": r.returncode, "wall_s": wall, "command": shlex.join(cmd)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--model", default="", help="default: smollm2 on cuda, tiny-random on cpu")
    ap.add_argument("--dataset", default=default_dataset())
    ap.add_argument("--steps", type=int, default=20, help="steps of the first run")
    ap.add_argument("--save-every", type=int, default=10)
    ap.add_argument("--more", type=int, default=10, help="steps added by the resumed run")
    ap.add_argument("--common", default="", help="more flags for run_distributed.py, as one string")
    ap.add_argument("--run-dir", default="", help="default: runs/resume_bench_<time> (removed first if it exists)")
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--out-dir", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    model = args.model or ("smollm2" if args.device == "cuda" else "tiny-random")
    run_dir = Path(args.run_dir or ROOT / "runs" / time.strftime("resume_bench_%Y%m%d-%H%M%S")).resolve()
    if run_dir.exists():
        shutil.rmtree(run_dir)
    place = (["--sampling-gpu", "0", "--training-gpus", "1"] if args.device == "cuda"
             else ["--device", "cpu", "--num-generations", "4", "--prompts-per-round", "1",
                   "--train-batch-size", "4", "--max-new-tokens", "16"])
    base = [sys.executable, "run_distributed.py", *place, "--model", model, "--dataset", args.dataset,
            "--run-dir", str(run_dir), "--save-every", str(args.save_every), *shlex.split(args.common)]
    total = args.steps + args.more

    first = run_phase(base + ["--max-steps", str(args.steps)], run_dir, args.timeout)
    before = steps_logged(run_dir)
    log1 = (run_dir / "learner0.log").read_text(errors="replace") if (run_dir / "learner0.log").exists() else ""
    ckpts = sorted((run_dir / "checkpoints").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    ckpt_bytes = sum(f.stat().st_size for f in ckpts[-1].rglob("*") if f.is_file()) if ckpts else 0
    second = run_phase(base + ["--max-steps", str(total), "--resume", "latest"], run_dir, args.timeout)
    after = steps_logged(run_dir)[len(before):]
    log_all = (run_dir / "learner0.log").read_text(errors="replace") if (run_dir / "learner0.log").exists() else ""
    saves = [{"step": int(s), "seconds": float(t), "mb": float(mb)} for s, t, mb in SAVED.findall(log_all)]
    resumed = RESUMED.search(log_all[len(log1):])
    all_steps = before + after
    out = {
        "device": device_name() if args.device == "cuda" else "cpu", "versions": versions(), "model": model,
        "phase1": first, "phase2": second,
        "steps_before": [s for s, _ in before], "steps_after": [s for s, _ in after],
        "numbering_continued": (all_steps == [(i, i) for i in range(1, total + 1)]
                                and bool(after) and after[0][0] == args.steps + 1),
        "resumed_from": resumed.group(1) if resumed else None,
        "resume_load_s": float(resumed.group(2)) if resumed else None,
        "saves": saves,
        "save_s_mean": sum(x["seconds"] for x in saves) / len(saves) if saves else None,
        "checkpoint_bytes": ckpt_bytes,
        "checkpoint_files": sorted(str(p.relative_to(ckpts[-1])) for p in ckpts[-1].iterdir()) if ckpts else [],
        "run_dir": str(run_dir),
    }
    tag = re.sub(r"[^A-Za-z0-9]+", "_", out["device"]).strip("_")
    out_path = Path(args.out_dir) / f"resume_{tag}.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"steps before {out['steps_before']}, after {out['steps_after']}; numbering continued: "
          f"{out['numbering_continued']}; save {out['save_s_mean']} s mean, resume load {out['resume_load_s']} s, "
          f"checkpoint {ckpt_bytes / 1e6:.1f} MB -> {out_path}")
    ok = first["exit_code"] == 0 and second["exit_code"] == 0 and out["numbering_continued"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
