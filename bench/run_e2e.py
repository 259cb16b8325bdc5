"""End-to-end GRPO runs through run_distributed.py, summarised from their run directories.

Usage (GPU machine, from the repo root):
  python bench/run_e2e.py --dataset PATH_TO_GSM8K --max-steps 16 --name e2e_issue2 \
      --config "split:--sampling-gpu 0 --training-gpus 1" --config "shared:--sampling-gpu 0 --training-gpus 0" \
      --config "nods:--sampling-gpu 0 --training-gpus 1 --no-deepspeed"

Each --config is NAME:FLAGS (flags for run_distributed.py, split like a shell would). For each
run it reports the median step time (step 1, which includes warm-up, left out), learner
samples/s, the learner's weight-publish stall, the sampler's weight apply time, and the
group accounting; it prints a table and writes bench/results/<name>_<device>.json.
"""
from __future__ import annotations

import argparse
import json
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def versions() -> dict:
    out = {"python": platform.python_version()}
    for mod in ("torch", "deepspeed", "transformers", "zmq"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception as exc:  # noqa: BLE001 - a missing package is reported, not fatal
            out[mod] = f"unavailable ({type(exc).__name__})"
    return out


def device_name() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return f"{torch.cuda.device_count()}x {torch.cuda.get_device_name(0)}"
    except Exception:  # noqa: BLE001
        pass
    return platform.processor() or "cpu"


def summarise(run_dir: Path) -> dict:
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in recs if not r.get("final")]
    final = next(r for r in recs if r.get("final"))
    body = steps[1:] or steps
    samplers = final.get("samplers", {})
    apply = [s["stats"]["apply_s"] / s["stats"]["weight_syncs"] for s in samplers.values()
             if s.get("stats", {}).get("weight_syncs")]
    return {
        "steps": len(steps),
        "wall_s": steps[-1]["time_s"],
        "step_time_median_s": statistics.median(r["step_time_s"] for r in body),
        "train_time_median_s": statistics.median(r["train_s"] for r in body),
        "data_wait_median_s": statistics.median(r["data_wait_s"] for r in body),
        "samples_per_s": steps[-1]["samples_per_s"],
        "publish_stall_median_s": statistics.median(r["sync_publish_s"] for r in body),
        "sampler_apply_mean_s": statistics.mean(apply) if apply else None,
        "weight_syncs": sum(s.get("stats", {}).get("weight_syncs", 0) for s in samplers.values()),
        "sampler_tokens_per_s": [s["stats"]["tokens"] / max(s["stats"]["gen_s"], 1e-9)
                                 for s in samplers.values() if s.get("stats")],
        # Where each sampler's rounds went: generation, old/ref log-prob passes, reward scoring
        # (seconds per round; the rest of a round's cadence is sending and weight sync).
        "sampler_round_split_s": [{k: s["stats"].get(k, 0.0) / max(s["stats"].get("rounds", 0.0), 1.0)
                                   for k in ("gen_s", "logprob_s", "reward_s")}
                                  for s in samplers.values() if s.get("stats")],
        "loss_first_last": [steps[0]["loss"], steps[-1]["loss"]],
        "reward_mean_first_last": [steps[0]["reward_mean"], steps[-1]["reward_mean"]],
        "groups": final["groups"],
        "sampler_versions": {k: v["version"] for k, v in samplers.items()},
        "sync_method": steps[-1].get("sync_method"),
        "weight_sync_verified": final.get("weight_sync_verified"),   # with --verify-weight-sync
    }


def _verified(v: dict | None) -> str:
    return "-" if not v else f"{v['matched']}/{v['versions_checked']} ok"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", action="append", required=True, help="NAME:flags for run_distributed.py")
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--max-steps", type=int, default=30)
    ap.add_argument("--name", default="e2e")
    ap.add_argument("--common", default="", help="flags added to every run")
    ap.add_argument("--out-dir", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    results = {}
    device = device_name()
    slug = device.replace(" ", "_").replace("/", "_")
    path = Path(args.out_dir) / f"{args.name}_{slug}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    for item in args.config:
        name, _, flags = item.partition(":")
        run_dir = ROOT / "runs" / f"{args.name}_{name}_{int(time.time())}"
        cmd = [sys.executable, str(ROOT / "run_distributed.py"), *shlex.split(flags),
               *shlex.split(args.common), "--dataset", args.dataset,
               "--max-steps", str(args.max_steps), "--run-dir", str(run_dir)]
        print("$", " ".join(cmd), flush=True)
        t0 = time.time()
        rc = subprocess.run(cmd, cwd=ROOT).returncode
        entry = {"command": cmd[1:], "exit_code": rc, "launcher_wall_s": time.time() - t0}
        if rc == 0:
            entry.update(summarise(run_dir))
        results[name] = entry
        # Written after every run, so a run cut short by a time limit keeps the earlier ones.
        out = {"device": device, "versions": versions(), "max_steps": args.max_steps, "runs": results}
        path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"\n{'run':10} {'rc':>3} {'steps':>5} {'step s':>7} {'train s':>7} {'wait s':>7} {'samples/s':>9} "
          f"{'publish ms':>10} {'apply ms':>9} {'balanced':>8} {'method':>7} {'verified':>12}")
    for name, r in results.items():
        if r["exit_code"]:
            print(f"{name:10} {r['exit_code']:>3} (failed; see runs/)")
            continue
        ap_ms = f"{r['sampler_apply_mean_s'] * 1e3:9.1f}" if r["sampler_apply_mean_s"] else "        -"
        print(f"{name:10} {0:>3} {r['steps']:>5} {r['step_time_median_s']:7.3f} {r['train_time_median_s']:7.3f} "
              f"{r['data_wait_median_s']:7.3f} {r['samples_per_s']:9.1f} {r['publish_stall_median_s'] * 1e3:10.1f} "
              f"{ap_ms} {str(r['groups'].get('balanced')):>8} {str(r.get('sync_method')):>7} "
              f"{_verified(r.get('weight_sync_verified')):>12}")
    print(f"wrote {path}")
    return 0 if all(r["exit_code"] == 0 for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
