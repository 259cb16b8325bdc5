"""End to end at the sizes GRPO users train, on one GPU shared by sampler and learner: Qwen2.5
0.5B, 1.5B, 3B (full fine-tuning) and 7B (LoRA), random weights of the real shapes.

Usage (GPU machine, repo root; sizes can go in separate calls, each merges into the JSON):
  python bench/scale.py --sizes 0.5b,1.5b --max-time-s 120 --dataset PATH_TO_GSM8K
  python bench/scale.py --sizes 3b,7b --max-time-s 120 --dataset PATH_TO_GSM8K
CPU smoke check of the plumbing (tiny model, two steps):
  python bench/scale.py --sizes tiny --device cpu --max-steps 2 --dataset ../shared/data/gsm8k

Each size runs `run_distributed.py --sampling-gpu 0 --training-gpus 0 --share-gpus --model
random:qwen2.5-<size>` with fixed round and batch sizes (FIXED below: one round of 16 prompts x 8
completions is one optimizer step, so the step time is the pipeline's). Random weights give no
reward signal and rarely stop at EOS: --filter-zero-signal stays off and every completion runs to
--max-new-tokens. While it runs, the GPU memory of each process is read from the driver
(`nvidia-smi --query-compute-apps`, every 0.5 s: the allocator's reserve and the CUDA context
count) and its peak kept; the launcher's printed memory plan is the estimate beside it.

Per row: the weight-sync method, step time (median, the first two steps left out: graph capture
and warm-up), completions and tokens trained per second (completion tokens, the ones the loss
covers), the sampler's rollout tokens/s, learner
MFU (6 x parameters x tokens/s for full fine-tuning, 4 x for LoRA, whose frozen weights get no
weight gradient; over the dense bf16 peak), the weight-sync stall (the learner's publish, the
sampler's apply), peak memory of each process against the plan, and what bound the step
(`bound_by`). Writes bench/results/scale_<device>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import PEAK_BF16_FLOPS, ROOT, commit, versions  # noqa: E402  (also puts the repo root on sys.path)

from grpo.config import ALLOC_ENV, ALLOC_ENVS, allocator_conf  # noqa: E402  (light: no torch)
from grpo.rules.memory import RESERVE  # noqa: E402
from grpo.stats import bf16_peak_share  # noqa: E402

GSM8K = ROOT.parent / "shared" / "data" / "gsm8k"
# size -> (--model, extra flags): 7B's full state (16 bytes a parameter) cannot share one GPU
LAYOUT = {"0.5b": ("random:qwen2.5-0.5b", []), "1.5b": ("random:qwen2.5-1.5b", []),
          "3b": ("random:qwen2.5-3b", []), "7b": ("random:qwen2.5-7b", ["--lora-r", "16"]),
          "tiny": ("tiny-random", []), "smollm2": ("smollm2", [])}
# Sizes run as a user first runs them: the README's one-GPU command with every default (rounds,
# batch, precision, micro-batches), not FIXED: the default model's memory against its plan.
DEFAULT_RUN = frozenset({"smollm2"})
# One round is one step: 16 prompts x 8 completions, 128 completions trained per step in
# micro-batches of MICRO (the DeepSpeed config's train_micro_batch_size_per_gpu, accumulating
# the rest). GSM8K's chat prompts are 72-161 tokens with this tokenizer: --max-prompt-tokens 192
# bounds them and is the prompt length the memory plan assumes.
FIXED = ["--prompts-per-round", "16", "--num-generations", "8", "--train-batch-size", "128",
         "--max-new-tokens", "256", "--max-prompt-tokens", "192", "--save-every", "0", "--report-to", "none"]
MICRO = 8
SKIP = 2
PLAN_LINE = re.compile(r"memory plan: (\S+) ([\d.]+) GiB")


def plan_estimates(log: str) -> dict[str, float]:
    """{process: GiB} from the launcher's printed memory plan lines (the last plan printed)."""
    return {name: float(g) for name, g in PLAN_LINE.findall(log)}


def parse_compute_apps(text: str) -> dict[int, float]:
    """nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits: {pid: MiB}."""
    out = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].replace(".", "", 1).isdigit():
            out[int(parts[0])] = float(parts[1])
    return out


def role_of(cmdline: str) -> str | None:
    """learner / sampler from a process's command line (the launcher's argv, grpo.launch.plan)."""
    if "training_worker.py" in cmdline:
        return "learner"
    if "sampling_worker.py" in cmdline:
        return "sampler"
    return None


class DriverMemory(threading.Thread):
    """Peak GPU memory per process as the driver sees it, polled every `every` seconds."""

    def __init__(self, every: float = 0.5):
        super().__init__(daemon=True)
        self.every, self.peaks_mib, self.roles = every, {}, {}
        self.stop = threading.Event()
        self.polls = 0

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                text = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                       "--format=csv,noheader,nounits"], capture_output=True, text=True,
                                      timeout=10).stdout
            except (OSError, subprocess.TimeoutExpired):
                return
            self.polls += 1
            for pid, mib in parse_compute_apps(text).items():
                self.peaks_mib[pid] = max(mib, self.peaks_mib.get(pid, 0.0))
                if pid not in self.roles:
                    try:
                        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                    except OSError:
                        cmd = ""
                    self.roles[pid] = role_of(cmd)
            self.stop.wait(self.every)

    def by_role(self) -> dict[str, float]:
        """{learner0/sampler0: peak GiB}: one learner and one sampler on this GPU."""
        out: dict[str, float] = {}
        for pid, mib in self.peaks_mib.items():
            role = self.roles.get(pid)
            if role:
                key = f"{role}0"
                out[key] = max(out.get(key, 0.0), mib / 1024)
        return out


def bound_by(train_s: float, data_wait_s: float, publish_s: float = 0.0) -> str:
    """What a step spent most of its time on: the learner computing (train), waiting for the
    sampler's next groups (data wait), or publishing the new weights (publish). Shared GPU: the
    learner and sampler also contend for it, so 'learner' includes training slowed by generation."""
    parts = {"learner (training)": train_s, "sampler (generation)": data_wait_s, "weight publish": publish_s}
    return max(parts, key=parts.get)


def mfu(params: int, tokens_per_s: float, lora: bool) -> float:
    """The learner's share of one GPU's bf16 peak at `tokens_per_s` (grpo.stats.bf16_peak_share)."""
    return bf16_peak_share(params, tokens_per_s, 1.0, 1, PEAK_BF16_FLOPS / 1e12, lora)


def summarise(run_dir: Path, params: int, lora: bool) -> dict:
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in recs if not r.get("final")]
    final = next((r for r in recs if r.get("final")), {})
    body = steps[SKIP:] or steps
    med = lambda k: statistics.median(r[k] for r in body)  # noqa: E731
    step_s, train_s, wait_s = med("step_time_s"), med("train_s"), med("data_wait_s")
    tokens = statistics.median(r["tokens"] for r in body)
    seqs = statistics.median(r["sequences"] for r in body)
    learner_tok_s = statistics.median(r["rank_tokens_per_s"][0] for r in body)
    stats = next(iter(final.get("samplers", {}).values()), {}).get("stats", {})
    return {
        "steps": len(steps), "steps_measured": len(body),
        "weight_sync": steps[-1].get("sync_method"),
        "step_s": step_s, "train_s": train_s, "data_wait_s": wait_s,
        "completions_per_s": seqs / step_s, "tokens_trained_per_s": tokens / step_s,
        "learner_tokens_per_s": learner_tok_s, "learner_mfu": mfu(params, learner_tok_s, lora),
        "rollout_tokens_per_s": stats["tokens"] / stats["gen_s"] if stats.get("gen_s") else None,
        "sampler_round_split_s": {k: stats.get(k, 0.0) / max(stats.get("rounds", 0.0), 1.0)
                                  for k in ("gen_s", "logprob_s", "reward_s", "sync_s")},
        "publish_stall_s": med("sync_publish_s"),
        "sampler_apply_s": stats["apply_s"] / stats["weight_syncs"] if stats.get("weight_syncs") else None,
        # torch's allocator peaks (GiB), below the driver's figures by the reserve and the context
        "learner_torch_peak_gib": max(r["rank_peak_mem_gb"][0] for r in steps),
        "sampler_torch_peak_gib": stats.get("peak_mem_gb") if stats else None,
        # torch's reserved peaks (GiB): its segments at their largest. Driver minus reserved is what
        # the allocator does not hold (the CUDA context, libraries' workspaces); reserved minus
        # allocated is its cache. Rank 0's from each step's record (GB there), the sampler's stats.
        "learner_reserved_peak_gib": max((r["gpu"]["mem_reserved_peak_gb"] * 1e9 / 2**30 for r in steps
                                          if "mem_reserved_peak_gb" in r.get("gpu", {})), default=None),
        "sampler_reserved_peak_gib": stats.get("peak_reserved_gb") if stats else None,
        "truncated_frac": statistics.mean(r.get("truncated_frac", 0.0) for r in body),
        "groups": final.get("groups"), "balanced": (final.get("groups") or {}).get("balanced"),
        "bound_by": bound_by(train_s, wait_s, med("sync_publish_s")),
    }


def plan_rules() -> dict:
    """The memory plan's fitted reserve factors, as a row records them (JSON keys: "true" is the
    allocator with expandable segments): a row whose plan_rules equal this code's printed the plan
    that --replan gives it."""
    return {str(k).lower(): v for k, v in RESERVE.items()}


def replan(row: dict) -> dict[str, float]:
    """The memory plan's estimate, GiB per process, for a row's command by this code's rules: the
    launcher's own plan of that command and its memory plan (grpo.launch.main.memory_plan), as
    the launcher prints it. A row's estimate_gib is what it printed at the row's commit."""
    argv = shlex.split(row["command"])[1:]
    if not row.get("default_run"):   # a default run's command leaves these to the defaults, as it ran
        if "--precision" not in argv:   # rows from before the flag ran bf16 weights, its only mode then
            argv += ["--precision", "bf16"]
        if "--micro-batch-tokens" not in argv:   # and fixed micro-batches, the only kind before this flag
            argv += ["--micro-batch-tokens", "-1"]
    # the allocator the row's workers ran with: rows from before the default have neither key and ran
    # torch's own (no expandable segments), which an empty PYTORCH_CUDA_ALLOC_CONF stands for
    saved = {k: os.environ.pop(k) for k in ALLOC_ENVS if k in os.environ}
    os.environ[ALLOC_ENV] = row.get("allocator_conf") or row.get("PYTORCH_CUDA_ALLOC_CONF") or ""
    try:
        return _replan(row, argv)
    finally:
        os.environ.pop(ALLOC_ENV, None)
        os.environ.update(saved)


def _replan(row: dict, argv: list[str]) -> dict[str, float]:
    import tempfile

    from grpo.rules import memory
    from grpo.launch.main import memory_plan
    from grpo.launch.plan import parse, plan
    from grpo.model.zoo import resolve_model

    with tempfile.TemporaryDirectory() as tmp:   # the run's DeepSpeed config, as run_size wrote it
        ds = Path(tmp) / "ds.json"
        cfg = json.loads((ROOT / "deepspeed.json").read_text())
        cfg["train_micro_batch_size_per_gpu"] = row.get("micro_batch", MICRO)
        ds.write_text(json.dumps(cfg))
        if "--deepspeed-config" in argv:
            argv[argv.index("--deepspeed-config") + 1] = str(ds)
        launch, to_s, to_l = parse(argv)
        resolve_model(launch.run.model)   # the config folder the plan reads
        specs = plan(launch, 1, to_s, to_l, 29500)
        procs = {role: [s for s in specs if s.role == role] for role in ("learner", "sampler")}
        p = memory_plan(launch, procs["learner"][0].flags, procs["sampler"][0].flags,
                        len(procs["learner"]), len(procs["sampler"]))
    return {name: round(sum(b for _, b in items) / memory.GiB, 2) for name, items in p.items()}


def run_size(size: str, a, work: Path) -> dict:
    from grpo.launch.probe import read_shape
    from grpo.model.zoo import resolve_model

    model, extra = LAYOUT[size]
    resolve_model(model)   # build the config folder now, so the launcher's memory plan has a config.json
    shape, note = read_shape(model)
    run_dir = work / f"scale_{a.label or size}"
    ds = work / f"deepspeed_micro{a.micro}.json"
    cfg = json.loads((ROOT / "deepspeed.json").read_text())
    cfg["train_micro_batch_size_per_gpu"] = a.micro
    ds.write_text(json.dumps(cfg, indent=2))
    layout = (["--device", "cpu"] if a.device == "cpu" else
              ["--sampling-gpu", "0", "--training-gpus", "0", "--share-gpus"])
    if size in DEFAULT_RUN:
        run_flags = ["--save-every", "0", "--report-to", "none"]
    else:
        # On the GPU --precision bf16: bf16 weights with DeepSpeed's fp32 master copies, what every
        # committed row ran (before --precision existed); autocast's float32 weights, the default for
        # full fine-tuning, leave no room for a sampler beside a 3B learner. --micro-batch-tokens 0
        # (the default token budget) is written out so that replan can tell these rows from those
        # that ran before the flag, with fixed micro-batches.
        run_flags = [*([] if a.device == "cpu" else ["--precision", "bf16"]), *FIXED, *extra,
                     "--micro-batch-tokens", "0", "--deepspeed-config", str(ds)]
    cmd = [sys.executable, str(ROOT / "run_distributed.py"), *layout, "--model", model, "--dataset", a.dataset,
           *run_flags, "--max-steps", str(a.max_steps),
           "--max-time-s", str(a.max_time_s), "--run-dir", str(run_dir), "--seed", str(a.seed), *a.extra]
    print("$", shlex.join(cmd), flush=True)
    mem = DriverMemory()
    if a.device != "cpu":
        mem.start()
    t0 = time.time()
    log = work / f"scale_{a.label or size}.log"
    with log.open("w") as f:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
    mem.stop.set()
    text = log.read_text()
    row = {"size": size, "model": model, "lora_r": 16 if "--lora-r" in extra else 0,
           "params": shape.params if shape else None, "command": shlex.join(cmd[1:]), "exit_code": rc,
           "launcher_wall_s": time.time() - t0, "estimate_gib": plan_estimates(text),
           "measured_peak_gib": mem.by_role(), "driver_polls": mem.polls}
    if size in DEFAULT_RUN:
        row["default_run"] = True
    if note:
        row["plan_note"] = note
    if rc != 0 or not (run_dir / "metrics.jsonl").is_file():
        row["error_tail"] = text.splitlines()[-15:]
        return row
    row.update(summarise(run_dir, shape.params if shape else 0, bool(row["lora_r"])))
    est, got = row["estimate_gib"], row["measured_peak_gib"]
    row["estimate_over_measured"] = {k: est[k] / got[k] for k in est if got.get(k)}
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="0.5b,1.5b,3b,7b", help=f"comma-separated, of {', '.join(LAYOUT)}")
    ap.add_argument("--max-time-s", type=float, default=120.0, help="seconds of training per size")
    ap.add_argument("--max-steps", type=int, default=1000)
    ap.add_argument("--dataset", default=str(GSM8K))
    ap.add_argument("--device", default="cuda", help="cuda (one GPU, shared) or cpu (smoke check)")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--micro", type=int, default=MICRO, help=f"learner micro-batch (default {MICRO})")
    ap.add_argument("--work-dir", default=str(ROOT / "runs" / "scale"))
    ap.add_argument("--out", default="", help="results file (default bench/results/scale_<device>.json)")
    ap.add_argument("--label", default="", help="the row's key in the JSON (default: the size), e.g. for a "
                                                "run with other flags after --")
    ap.add_argument("--replan", default="", help="only apply this code's memory plan (estimate_gib_now) and step-bound "
                                                 "rule to every row of this results file, and exit")
    ap.add_argument("extra", nargs=argparse.REMAINDER, help="after --: more flags for run_distributed.py")
    a = ap.parse_args(argv)
    a.extra = [x for x in a.extra if x != "--"]
    if a.replan:
        path = Path(a.replan)
        doc = json.loads(path.read_text())
        for row in doc["rows"].values():
            row["estimate_gib_now"] = replan(row)
            if row.get("train_s") is not None:   # the step-bound rule, as this code has it
                row["bound_by"] = bound_by(row["train_s"], row["data_wait_s"], row["publish_stall_s"])
            got = row.get("measured_peak_gib") or {}
            row["estimate_now_over_measured"] = {k: round(v / got[k], 3) for k, v in row["estimate_gib_now"].items()
                                                 if got.get(k)}
        doc["replanned_at_commit"] = commit()
        path.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {path}")
        return 0
    sizes = [s.strip() for s in a.sizes.split(",") if s.strip()]
    if bad := [s for s in sizes if s not in LAYOUT]:
        ap.error(f"--sizes: unknown {bad}; choose from {', '.join(LAYOUT)}")
    if a.label and len(sizes) > 1:
        ap.error("--label names one row: give one size with it")
    device = "cpu"
    if a.device != "cpu":
        q = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
        device = q.stdout.splitlines()[0].strip() if q.returncode == 0 and q.stdout.strip() else "unknown GPU"
    out = Path(a.out) if a.out else ROOT / "bench" / "results" / f"scale_{device.replace(' ', '_')}.json"
    work = Path(a.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    doc = json.loads(out.read_text()) if out.is_file() else {"device": device, "rows": {}}
    for size in sizes:
        row = run_size(size, a, work)
        row.update({"command_line": shlex.join([Path(sys.executable).name, *sys.argv]), "commit": commit(),
                    "seed": a.seed, "micro_batch": a.micro, "versions": versions(("zmq",)),
                    "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
                    # what the workers ran with: the user's settings, or the default they apply
                    "allocator_conf": allocator_conf(os.environ)[0],
                    # the reserve rules the launcher printed its plan by (estimate_gib)
                    "plan_rules": plan_rules()})
        row["label"] = a.label or size
        doc["rows"][a.label or size] = row
        doc["device"] = device
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=2) + "\n")
        keys = ("size", "exit_code", "weight_sync", "steps", "step_s", "completions_per_s", "tokens_trained_per_s",
                "rollout_tokens_per_s", "learner_mfu", "publish_stall_s", "estimate_gib", "measured_peak_gib",
                "bound_by")
        print(json.dumps({k: row.get(k) for k in keys}), flush=True)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
