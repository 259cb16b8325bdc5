"""Which off-policy objective learns most per step at the staleness the pipeline runs at?

Compared by the sampled (train) reward per policy version, never by held-out accuracy: each
variant runs ours' time-to-accuracy command (bench/time_to_accuracy.py's SHARED and OURS_ONLY
settings) for --seconds of training with no evaluation, and the sampler's round lines give the
mean reward of every completion it generated (before the zero-signal filter) at the version
that generated it.

Run on a GPU machine (variants run one after another; about 40 s of start-up each):
  python bench/objectives.py run --work-dir runs/obj --seconds 150 --variants ppo,tis2,mask,decoupled2
Summarise finished runs (here or there) into bench/results/objectives_<device>[_<label>].json:
  python bench/objectives.py summarise --device "NVIDIA H100" --work-dir runs/obj [--label letter_counting]
"""
from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import ROOT, commit, read_run_file, reward_by_time, rounds_of, versions  # noqa: E402,F401
from time_to_accuracy import OURS_ONLY, SHARED  # noqa: E402

# name -> the flags appended to the fixed command (a later flag wins in argparse).
VARIANTS = {
    "ppo": "--tis-cap 0",                                    # PPO clip around the behaviour policy (TRL's)
    "tis2": "--tis-cap 2",                                   # truncated IS weight, one update a step (default)
    "mask": "--is-mask-low 0.125 --is-mask-high 8",          # prime-rl's masked IS, one update a step
    "decoupled2": "--tis-cap 2 --ppo-minibatches 2",         # AReaL-style: clip around the proximal policy
    "decoupled4": "--tis-cap 2 --ppo-minibatches 4",
    "mask_decoupled2": "--is-mask-low 0.125 --is-mask-high 8 --ppo-minibatches 2",
    "fresh": "--max-staleness 0 --prompts-per-round 8",      # on-policy reference: no lag to correct
    # TRL's numerics: fp32 weights with bf16 autocast (one rank, plain AdamW) instead of
    # DeepSpeed's bf16 weights with fp32 master copies; alone, and with fresh data (TRL's whole setup).
    "fp32": "--no-deepspeed",
    "fresh_fp32": "--max-staleness 0 --prompts-per-round 8 --no-deepspeed",
    # The staleness table (with the default objective): --max-staleness S, rounds of R prompts.
    # fresh is S0/R8. (The runs of tis2, ppo, mask and decoupled* in bench/results were made when the
    # base command had S8/R64; each run's command is in its objective_launch.json.)
    "s8r64": "--max-staleness 8 --prompts-per-round 64",
    "s1r16": "--max-staleness 1 --prompts-per-round 16",
    "s2r16": "--max-staleness 2 --prompts-per-round 16",
    "s2r32": "--max-staleness 2 --prompts-per-round 32",
    "s4r32": "--max-staleness 4 --prompts-per-round 32",
    "s4r64": "--max-staleness 4 --prompts-per-round 64",
    "s8r64_inflight": "--max-staleness 8 --prompts-per-round 64 --in-flight-rows 512",  # groups leave as they finish
    "s2r16_inflight": "--max-staleness 2 --prompts-per-round 16 --in-flight-rows 256",
    # After the peak: raise the tasks' difficulty as groups turn all-correct.
    "curriculum": "--curriculum",
}
BUCKET = 10   # versions per row of the reward-by-version table


def command(task: str, seconds: float, seed: int, run_dir: Path, extra: str) -> list[str]:
    shared = [f"--{k.replace('_', '-')}={v}" for k, v in SHARED.items()]
    return [sys.executable, str(ROOT / "run_distributed.py"), "--dataset", task, *shared, *OURS_ONLY,
            "--max-time-s", str(seconds), "--max-steps", "100000", "--eval-every", "0", "--seed", str(seed),
            "--run-dir", str(run_dir), *shlex.split(extra)]


def clock_of(epoch: float) -> int:
    """Seconds since local midnight, as the log lines' HH:MM:SS count them."""
    t = time.localtime(epoch)
    return t.tm_hour * 3600 + t.tm_min * 60 + t.tm_sec


def reward_by_version(rounds: list[dict], bucket: int = BUCKET) -> list[dict]:
    """Completion-weighted mean sampled reward per bucket of generating versions [k*bucket, (k+1)*bucket)."""
    out: dict[int, list[float]] = {}
    for r in rounds:
        acc = out.setdefault(r["version"] // bucket, [0.0, 0])
        acc[0] += r["reward_mean"] * r["n"]
        acc[1] += r["n"]
    return [{"versions": f"{k * bucket}-{(k + 1) * bucket - 1}", "reward_mean": s / n, "completions": n}
            for k, (s, n) in sorted(out.items())]


def summarise_run(run_dir: Path) -> dict:
    steps = [json.loads(x) for x in read_run_file(run_dir, "metrics.jsonl").splitlines() if x.strip()]
    steps = [s for s in steps if not s.get("final") and "step" in s]
    rounds = rounds_of(read_run_file(run_dir, "sampler0.log"))
    launch = json.loads((run_dir / "objective_launch.json").read_text())
    mean = (lambda key: statistics.fmean(s[key] for s in steps if s.get(key) is not None)
            if any(s.get(key) is not None for s in steps) else None)
    summary = {}
    if (run_dir / "summary.json").exists():
        summary = json.loads((run_dir / "summary.json").read_text())
    return {"flags": launch["flags"], "command": launch["command"], "exit_code": launch["exit_code"],
            "commit": launch.get("commit"), "seed": launch.get("seed"), "note": launch.get("note"),
            "wall_s": launch["wall_s"], "steps": len(steps),
            "step_time_median_s": statistics.median(s["step_time_s"] for s in steps) if steps else None,
            "first_step_s": summary.get("first_step_s"),
            "train_s": steps[-1]["time_s"] if steps else None,
            "clip_frac_mean": mean("clip_frac"), "is_weight_mean": mean("is_weight_mean"),
            "is_weight_max": max((s.get("is_weight_max", 0.0) for s in steps), default=None),
            "is_limited_frac_mean": mean("is_limited_frac"), "staleness_mean": mean("staleness_mean"),
            "completion_len_mean": mean("completion_len_mean"),
            "reward_by_version": reward_by_version(rounds),
            # runs launched before started_at was recorded have no clock to count from
            **({"reward_by_time": reward_by_time(rounds, clock_of(launch["started_at"]))}
               if "started_at" in launch else {}),
            "last_rounds_reward": (statistics.fmean(r["reward_mean"] for r in rounds[-5:]) if rounds else None),
            "groups": summary.get("groups")}


def run(args) -> None:
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    for name in args.variants.split(","):
        run_dir = work / name
        cmd = command(args.task, args.seconds, args.seed, run_dir, VARIANTS[name] + " " + args.extra)
        print(f"objectives: {name}: {shlex.join(cmd)}", flush=True)
        t0 = time.time()
        with open(work / f"{name}.out", "w") as out:
            code = subprocess.call(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                   timeout=args.seconds + 300)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "objective_launch.json").write_text(json.dumps(
            {"flags": VARIANTS[name] + " " + args.extra, "command": cmd, "exit_code": code,
             "wall_s": time.time() - t0, "started_at": t0, "seed": args.seed, "commit": args.commit or commit()}, indent=2))
        s = summarise_run(run_dir)
        print(f"objectives: {name} exit {code}: {s['steps']} steps, reward by version "
              f"{[round(b['reward_mean'], 3) for b in s['reward_by_version']]}, clip {s['clip_frac_mean']}, "
              f"limited {s['is_limited_frac_mean']}", flush=True)


PRINTED_CMD = re.compile(r"objectives: (\S+): (/\S+python \S+run_distributed\.py .*)")
PRINTED_END = re.compile(r"objectives: (\S+) exit 0: (\d+) steps, reward by version \[([^\]]*)\]")


def runs_from_printed(text: str, task: str, seconds: float) -> list[dict]:
    """The runs of one `run` as its printed lines give them (each variant's command, steps and reward
    by version): what is left of a run whose directories did not come back from the GPU machine."""
    cmds = dict(PRINTED_CMD.findall(text))
    return [{"variant": name, "task": task, "training_s": seconds, "steps": int(steps),
             "reward_by_version": [float(x) for x in rbv.split(",")], "command": cmds.get(name)}
            for name, steps, rbv in PRINTED_END.findall(text)]


def summarise(args) -> None:
    work = Path(args.work_dir)
    runs = {p.name: summarise_run(p) for p in sorted(work.iterdir()) if (p / "objective_launch.json").exists()}
    rec = {"device": args.device, "task": args.task, "seconds": args.seconds, "seed": args.seed,
           "command_line": shlex.join(sys.argv), "commit": args.commit or commit(), "versions": versions(), "variants": VARIANTS, "runs": runs,
           "note": args.note}
    suffix = f"_{args.label}" if args.label else ""
    out = ROOT / "bench" / "results" / f"objectives_{args.device.replace(' ', '_')}{suffix}.json"
    out.write_text(json.dumps(rec, indent=2) + "\n")
    print(f"wrote {out}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("run", "summarise"))
    ap.add_argument("--work-dir", default="runs/objectives")
    ap.add_argument("--task", default="rg:basic_arithmetic:min_terms=2,max_terms=2,max_digits=1")
    ap.add_argument("--seconds", type=float, default=150.0, help="training seconds per variant")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--variants", default="ppo,tis2,mask,decoupled2")
    ap.add_argument("--extra", default="", help="flags appended to every variant")
    ap.add_argument("--device", default="")
    ap.add_argument("--note", default="")
    ap.add_argument("--label", default="", help="summarise: objectives_<device>_<label>.json, beside earlier comparisons")
    ap.add_argument("--commit", default="", help="the commit the runs were made at, where the tree has no .git")
    args = ap.parse_args(argv)
    unknown = [v for v in args.variants.split(",") if v not in VARIANTS]
    if unknown:
        ap.error(f"--variants: unknown {unknown}; choose from {', '.join(VARIANTS)}")
    run(args) if args.what == "run" else summarise(args)


if __name__ == "__main__":
    main()
