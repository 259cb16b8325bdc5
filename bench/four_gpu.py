"""Issue 8's run: one sampler and a three-rank DeepSpeed ZeRO-2 learner, recorded per rank.

Usage (a 4-GPU machine, from the repo root; --name picks the entry in the JSON):
  python bench/four_gpu.py --name smollm2 --max-time-s 300 -- --dataset .data/gsm8k
  python bench/four_gpu.py --name qwen2.5-3b-shapes --max-time-s 300 -- --model random:qwen2.5-3b --dataset .data/gsm8k
  python bench/four_gpu.py --name cpu-check --layout "--device cpu --training-ranks 3" --max-time-s 30 -- \
      --model tiny-random --dataset ../shared/data/gsm8k --max-new-tokens 16 --num-generations 4 \
      --prompts-per-round 1 --train-batch-size 8

Runs `run_distributed.py --sampling-gpu 0 --training-gpus 1,2,3` (or --layout) with a time
limit, then reads the run directory and records: steps/s, completions/s, learner tokens/s
per rank, weight-sync times (learner publish stall, sampler apply), peak memory per GPU,
and the per-rank weight checksums with whether they agree. Each run is merged into
bench/results/four_gpu_<device>.json, so the two runs can be made in separate calls.
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
from run_e2e import ROOT, device_name, summarise, versions  # noqa: E402


def per_rank(run_dir: Path) -> dict:
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in recs if not r.get("final")]
    final = next(r for r in recs if r.get("final"))
    body = steps[1:] or steps   # step 1 includes warm-up
    ranks = len(steps[-1]["rank_tokens_per_s"])
    samplers = final.get("samplers", {})
    return {
        "steps_per_s": len(steps) / steps[-1]["time_s"],
        "completions_per_s": sum(r["sequences"] for r in steps) / steps[-1]["time_s"],
        "learner_tokens_per_s_per_rank_median": [statistics.median(r["rank_tokens_per_s"][i] for r in body)
                                                 for i in range(ranks)],
        "learner_peak_mem_gb_per_rank": steps[-1]["rank_peak_mem_gb"],
        "learner_rank0_peak_mem_gb_at_end": final.get("peak_mem_gb"),
        "sampler_peak_mem_gb": {k: v.get("stats", {}).get("peak_mem_gb") for k, v in samplers.items()},
        "weight_sync_method": steps[-1].get("sync_method", "tcp"),
        "publish_stall_s_median": statistics.median(r["sync_publish_s"] for r in body),
        "rank_weight_checksums": final.get("rank_weight_checksums"),
        "ranks_identical": final.get("ranks_identical"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", required=True)
    ap.add_argument("--layout", default="--sampling-gpu 0 --training-gpus 1,2,3")
    ap.add_argument("--max-time-s", type=float, default=300.0)
    ap.add_argument("--max-steps", type=int, default=100000)
    ap.add_argument("--out-dir", default=str(ROOT / "bench" / "results"))
    ap.add_argument("rest", nargs=argparse.REMAINDER, help="after --: flags for run_distributed.py")
    args = ap.parse_args()
    rest = [a for a in args.rest if a != "--"]
    run_dir = ROOT / "runs" / f"four_gpu_{args.name}_{int(time.time())}"
    cmd = [sys.executable, str(ROOT / "run_distributed.py"), *shlex.split(args.layout), *rest,
           "--max-steps", str(args.max_steps), "--max-time-s", str(args.max_time_s), "--run-dir", str(run_dir)]
    print("$", " ".join(cmd), flush=True)
    t0 = time.time()
    rc = subprocess.run(cmd, cwd=ROOT).returncode
    entry = {"command": cmd[1:], "exit_code": rc, "launcher_wall_s": time.time() - t0, "run_dir": str(run_dir)}
    if rc == 0:
        entry.update(summarise(run_dir))
        entry.update(per_rank(run_dir))
    device = device_name()
    path = Path(args.out_dir) / f"four_gpu_{device.replace(' ', '_').replace('/', '_')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = json.loads(path.read_text()) if path.exists() else {"device": device, "runs": {}}
    doc["versions"] = versions()
    doc["runs"][args.name] = entry
    path.write_text(json.dumps(doc, indent=2) + "\n")
    if rc == 0:
        print(f"{args.name}: {entry['steps']} steps in {entry['wall_s']:.0f} s, {entry['steps_per_s']:.3f} steps/s, "
              f"{entry['completions_per_s']:.2f} completions/s, tokens/s per rank "
              f"{[round(x) for x in entry['learner_tokens_per_s_per_rank_median']]}, peak GB per rank "
              f"{[round(x, 1) for x in entry['learner_peak_mem_gb_per_rank']]}, sampler peak GB "
              f"{entry['sampler_peak_mem_gb']}, publish {entry['publish_stall_s_median'] * 1e3:.0f} ms, "
              f"checksums {entry['rank_weight_checksums']} identical={entry['ranks_identical']}")
    print(f"wrote {path}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
