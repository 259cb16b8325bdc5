"""The benchmark: a Qwen-class instruct model learning GSM8K, ours against TRL, one row at a time.

A row is MODEL:LAYOUT:TRAINER:SEED. Each runs for --seconds from its launch and saves its policy
(bf16) on --save-schedule; nothing is evaluated while it runs. Afterwards every save, and the base
model, is scored by the project's own evaluator (grpo.evaluate: the training prompt and correctness
rules, greedy, the rollout engine, bf16) on the first 500 GSM8K test problems with 512 new tokens,
spread over --gpus. A point is (seconds from the row's launch to the end of that save, accuracy).

    python bench/benchmark.py rows                    # the standard rows (STANDARD_ROWS below)
    python bench/benchmark.py prepare --rows "..."    # convert their models once, nothing run
    python bench/benchmark.py all --work-dir runs/bm --gpus 0,1,2,3      # run them, each scored and
                                                      # summarised before the next starts
    python bench/benchmark.py all --rows "0.5b:seed:ours:42 0.5b:seed:trl:42" --seconds 600
    python bench/benchmark.py run --row 0.5b:1gpu:ours:42 --work-dir runs/bm
    python bench/benchmark.py score --work-dir runs/bm --gpus 0,1,2,3
    python bench/benchmark.py summarise --work-dir runs/bm
    python bench/benchmark.py figures --work-dir runs/bm   # each run's figures from its running files
                                                      # (a run cut short included), one JSON line each

MODEL: 0.5b or 1.5b (Qwen2.5-Coder-Instruct, the GGUF files of bench/fetch_models.py, looked up in
$GRPO_GGUF_DIR, /tmp/gguf and $GRPO_CACHE/gguf), or any --model value (tiny-random for a CPU check).
LAYOUT: 1gpu (ours: sampler and learner share GPU 0; TRL: one process) or seed (ours:
`--sampling-gpu 0 --training-gpus 1,2,3`; TRL: DDP over 4 processes through torchrun), chosen
(ours: `--gpus 0,1,2,3`) or 2gpu (a two-GPU host; ours: `--sampling-gpu 0 --training-gpus 1`; TRL:
DDP over 2). TRAINER: ours, ours-vllm (ours with vLLM's engine in the sampler),
trl (bench/trl_grpo.py, Hugging Face generate) or trl-vllm (the same with vLLM in TRL's colocate mode). All get the same model, prompts (grpo.data.prompts), reward
(grpo.data.rewards' correctness), G, completions a step, new tokens, learning rate, beta, loss and
temperature (SHARED). On the GPU machine bench/benchmark.sh runs rows as a device plan.

Writes bench/results/real_workload_<device>.json: `rows`, one per row (a row run again replaces its
entry; --label keeps both), and one PNG per model of accuracy against seconds. CPU check: --device
cpu with tiny-random and short --seconds.
"""
from __future__ import annotations

import argparse
import ast
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import ROOT, read_run_file, versions  # noqa: E402  (also puts the repo root on sys.path)

from grpo.launch.ending import screen_totals  # noqa: E402
from grpo.launch.plan import as_visible  # noqa: E402
from grpo.learner.checkpoint import parse_save_schedule  # noqa: E402
from grpo.model import fetch  # noqa: E402
from grpo.model.fetch import MODELS  # noqa: E402
from grpo.obs.rundir import git_head  # noqa: E402

# The standard rows, the set the docs report: `all` without --rows runs them one after another;
# `rows` prints them for bench/benchmark.sh, one-GPU rows side by side on a four-GPU host.
STANDARD_ROWS = (
    "0.5b:seed:ours:42", "0.5b:seed:trl:42",
    "1.5b:seed:ours:42", "1.5b:seed:trl:42",
    "0.5b:chosen:ours:42", "1.5b:chosen:ours:42",
    "0.5b:1gpu-chosen:ours:42", "0.5b:1gpu:trl-vllm:42",
    "1.5b:1gpu-chosen:ours:42", "1.5b:1gpu:trl-vllm:42",
)
HOST_GPUS = 4   # GPUs of the host that bench/benchmark.sh fills with one-GPU rows side by side

SHARED = {"num_generations": 16, "train_batch_size": 128, "max_new_tokens": 512, "learning_rate": 2e-6,
          "beta": 0.0, "loss_type": "dapo", "temperature": 1.0}
# A CPU check of the whole path (--device cpu, tiny-random): the same rows at sizes a CPU finishes,
# without --filter-zero-signal (a random model's groups all lack signal: the filter would send none).
SMALL = {"num_generations": 4, "train_batch_size": 8, "max_new_tokens": 16, "learning_rate": 2e-6,
         "beta": 0.0, "loss_type": "dapo", "temperature": 1.0}
# Ours only: how the samplers feed the learner (TRL has no counterpart: it trains every group it
# generates, zero-signal ones included). --eval-every past the run's end: sampler 0 scores the base
# model and the learner its final weights, on the same problems, so a row also measures the
# learner's final evaluation against sampler 0's baseline.
OURS_ONLY = ["--generation-backend", "fast", "--filter-zero-signal", "--reward", "correctness",
             "--eval-every", "100000"]
LAYOUTS = {"1gpu": {"gpus": 1, "ours": ["--sampling-gpu", "0", "--training-gpus", "0", "--share-gpus"]},
           "seed": {"gpus": 4, "ours": ["--sampling-gpu", "0", "--training-gpus", "1,2,3"]},
           # a host of two GPUs: one sampler, one learner rank; TRL: DDP over the two
           "2gpu": {"gpus": 2, "ours": ["--sampling-gpu", "0", "--training-gpus", "1"]},
           # the split run_distributed.py --gpus chooses (its layout line says which); TRL: DDP over the four
           "chosen": {"gpus": 4, "ours": ["--gpus", "0,1,2,3"]},
           # one GPU as run_distributed.py --gpus 0 uses it (sampler and learner share it, rows in
           # flight); TRL: one process, as in 1gpu
           "1gpu-chosen": {"gpus": 1, "ours": ["--gpus", "0"]}}
# ours' trainers and the flags each adds to ours' command: ours-vllm generates with vLLM's engine
# in the sampler (--generation-backend vllm), everything else as ours
OURS_TRAINERS = {"ours": [], "ours-vllm": ["--generation-backend", "vllm"]}
TRAINERS = (*OURS_TRAINERS, "trl", "trl-vllm")   # trl-vllm: TRL generating with vLLM (colocate)
SHORT = {"0.5b": "qwen2.5-coder-0.5b", "1.5b": "qwen2.5-coder-1.5b"}
SAVE_SCHEDULE = "30x4,60"     # 30, 60, 90, 120 s, then every 60 s
MARKS_S = (60, 120, 240, 600)
EVAL_SIZE, EVAL_TOKENS = 500, 512


# ----------------------------------------------------------------------------- pure rules
def parse_row(spec: str) -> dict:
    """'0.5b:seed:ours:42' -> {model, layout, trainer, seed, name}; a bad spec exits 2 naming it."""
    parts = spec.split(":")
    if len(parts) != 4 or parts[1] not in LAYOUTS or parts[2] not in TRAINERS or not parts[3].isdigit():
        raise SystemExit(f"benchmark: row {spec!r} is not MODEL:LAYOUT:TRAINER:SEED with LAYOUT in "
                         f"{'/'.join(LAYOUTS)} and TRAINER in {'/'.join(TRAINERS)}, e.g. 0.5b:seed:ours:42")
    model, layout, trainer, seed = parts[0], parts[1], parts[2], int(parts[3])
    slug = "".join(c if c.isalnum() or c in "._-" else "_" for c in model)
    return {"model": model, "layout": layout, "trainer": trainer, "seed": seed,
            "name": f"{slug}_{layout}_{trainer}_s{seed}"}


def recipe_groups(specs, host_gpus: int = HOST_GPUS) -> list[str]:
    """The rows as bench/benchmark.sh takes them: one-GPU rows in a row joined by '+' (side by side,
    each on a GPU of its own) up to `host_gpus` a group; every other row alone, in the given order.
    ('0.5b:seed:ours:42', '0.5b:1gpu:ours:42', '0.5b:1gpu:trl:42') -> ['0.5b:seed:ours:42',
    '0.5b:1gpu:ours:42+0.5b:1gpu:trl:42']"""
    groups: list[list[str]] = []
    for spec in specs:
        one = LAYOUTS[parse_row(spec)["layout"]]["gpus"] == 1
        if one and groups and LAYOUTS[parse_row(groups[-1][0])["layout"]]["gpus"] == 1 and len(groups[-1]) < host_gpus:
            groups[-1].append(spec)
        else:
            groups.append([spec])
    return ["+".join(g) for g in groups]


def wilson(correct: int, n: int, z: float = 1.96) -> list[float]:
    """The 95% Wilson score interval of a binomial proportion (sound near 0, unlike p +- 2se)."""
    if n == 0:
        return [0.0, 1.0]
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)]


def seconds_to(points: list[dict], target: float) -> float | None:
    """The first point's seconds whose accuracy is at least `target` (> 0); None if none is."""
    if target <= 0:
        return None
    return next((p["seconds"] for p in sorted(points, key=lambda p: p["seconds"]) if p["accuracy"] >= target), None)


def accuracy_at(points: list[dict], seconds: float) -> float | None:
    """The accuracy of the newest weights saved by `seconds` (a run that ended before: its last)."""
    done = [p for p in points if p["seconds"] <= seconds]
    return max(done, key=lambda p: p["seconds"])["accuracy"] if done else None


def seconds_to_gain(points: list[dict], baseline: float, gain: float) -> float | None:
    """Seconds of the first save whose accuracy is at least baseline + gain (the float sum's rounding
    aside); None if none is. The base model's point at 0 s is no save."""
    return seconds_to([p for p in points if p["step"] > 0], baseline + gain - 1e-9)


def accuracy_marks(saves: list[dict], run_s: float | None, marks=MARKS_S) -> dict[str, float | None]:
    """{'60': accuracy, ...}: the newest save at or before each mark; None for a mark the row did not
    run to (past its --seconds and its last save) or before its first save."""
    last = max((p["seconds"] for p in saves), default=0.0)
    return {str(m): accuracy_at(saves, float(m)) if m <= max(run_s or 0.0, last) else None for m in marks}


def split_items(items: list, workers: int) -> list[list]:
    """Round-robin shares, every worker's items of one model together (each worker loads a model once
    per model it scores): items are (model, ...) tuples, sorted by model first."""
    shares = [[] for _ in range(max(1, workers))]
    for i, item in enumerate(sorted(items, key=lambda x: (x[0], x[2] != ""))):   # a model's base first
        shares[i % len(shares)].append(item)
    return [s for s in shares if s]


def ours_rates(metrics: list[dict], summary: dict, gpus: int) -> dict:
    """Ours' step figures from metrics.jsonl's step records and summary.json: the median step (the
    first, which waits for the first groups, left out), the learner's busy share (seconds training
    over seconds of its steps) and generated tokens/s per GPU of the row (all samplers' tokens over
    the learner's elapsed time, over every GPU of the row)."""
    steps = [m for m in metrics if "step" in m and "step_time_s" in m]
    later = steps[1:] or steps
    tokens = sum(s["stats"].get("tokens", 0.0) for s in (summary.get("samplers") or {}).values())
    elapsed = summary.get("elapsed_s") or (steps[-1]["time_s"] if steps else 0.0)
    return {"median_step_s": round(statistics.median(s["step_time_s"] for s in later), 3) if later else None,
            "learner_busy_share": round(sum(s["train_s"] for s in later) / sum(s["step_time_s"] for s in later), 3)
            if later else None,
            "gen_tokens_per_s_per_gpu": round(tokens / elapsed / gpus, 1) if elapsed else None}


def both_busy_medians(steps: list[dict]) -> dict[str, float]:
    """Each sampler's median share of a step in which it and the learner were both busy (the step
    records' both_busy_share, a lower bound; the first step left out); {} for runs made before the
    record had it."""
    per: dict[str, list[float]] = {}
    for s in steps[1:] or steps:
        for sid, v in (s.get("both_busy_share") or {}).items():
            if v is not None:
                per.setdefault(sid, []).append(v)
    return {sid: round(statistics.median(v), 3) for sid, v in sorted(per.items())}


DECODE_LINE = re.compile(r"completions, (\d+) tokens in ([\d.]+) s")   # a sampler log's round/chunk line
STREAM_LINE = re.compile(r"stream: [\d,]+ decode steps, ([\d.]+) ms each on the device")   # rows in flight


def peak_share_median(steps: list[dict]) -> float | None:
    """The median of the step records' bf16_peak_share (the learner's model FLOPs over the GPUs' bf16
    peak in its training seconds), the first step left out; None where no record has one."""
    shares = [s["bf16_peak_share"] for s in steps[1:] or steps if isinstance(s.get("bf16_peak_share"), (int, float))]
    return round(statistics.median(shares), 4) if shares else None


def stream_step_ms(lines: list[str]) -> float | None:
    """A sampler's device milliseconds a decode step in flight, from its last stream line (the
    stream's whole run); None for a sampler that decoded in rounds."""
    found = [float(m[1]) for m in map(STREAM_LINE.search, lines) if m]
    return found[-1] if found else None


def run_figures(run: Path) -> dict:
    """Ours' figures from the files a run writes while it runs (metrics.jsonl's step records, the
    samplers' logs, eval.jsonl), so that a run cut short (its machine taken back before the row
    ended) still gives them; summary.json, written at the end, is not needed. Steps/s is steps over
    the last step's time_s, as row_result; median step and learner busy leave out the first step
    (it waits for the first groups); the groups' shares are the last step's books: stale over sent
    and over judged (trained + stale), zero-signal over sent; decode tokens/s per sampler is its
    log's tokens over its generating seconds (what summary.json's tokens / gen_s give)."""
    # whole lines only: a snapshot taken while the learner appended may end in half a record
    text = (run / "metrics.jsonl").read_text() if (run / "metrics.jsonl").is_file() else ""
    metrics = [json.loads(x) for x in text.split("\n")[:-1] if x.strip()]
    steps = [m for m in metrics if "step" in m and "step_time_s" in m]
    if not steps:
        raise ValueError(f"{run}: no step records in metrics.jsonl")
    last = steps[-1]
    rates = ours_rates(steps, {}, 1)   # its median step and learner busy share (tokens need summary.json)
    g = last.get("groups") or {}
    drop = g.get("dropped") or {}
    sent, stale = g.get("sent") or 0, drop.get("stale", 0)
    judged = (g.get("trained") or 0) + stale
    decode = {}
    for log in sorted(run.glob("sampler*.log")):
        found = [(int(m[1]), float(m[2])) for m in map(DECODE_LINE.search, _lines(log)) if m]
        tokens, secs = sum(t for t, _ in found), sum(s for _, s in found)
        if secs:
            decode[log.stem] = {"tokens": tokens, "seconds": round(secs, 1), "tokens_per_s": round(tokens / secs)}
    evals = _evals(run)
    final = evals.get("learner_final")
    return {"steps": len(steps), "last_step_s": round(last["time_s"], 1),
            "steps_per_s": round(len(steps) / last["time_s"], 4),
            "median_step_s": rates["median_step_s"], "learner_busy_share": rates["learner_busy_share"],
            "sampler_busy_share": last.get("sampler_busy_share"), "groups": g,
            **({"both_busy_share_median": both} if (both := both_busy_medians(steps)) else {}),
            "stale_of_sent": round(stale / sent, 4) if sent else None,
            "stale_of_judged": round(stale / judged, 4) if judged else None,
            "zero_signal_of_sent": round(drop.get("sampler_zero_signal", 0) / sent, 4) if sent else None,
            "decode": decode, "baseline_accuracy": evals.get("sampler0_baseline", {}).get("accuracy"),
            "learner_final": {"version": final["version"], "accuracy": final["accuracy"]} if final else None,
            "ended": any(m.get("final") for m in metrics)}


def trl_rates(steps: list[dict], gpus: int) -> dict:
    """TRL's: the median gap between step ends (the first from the start of training), generated
    tokens/s per GPU (completions x mean length over the training time). TRL's ranks generate and
    train in turn on every GPU: no learner is separately busy (None)."""
    ends = [s["time_s"] for s in steps]
    gaps = [b - a for a, b in zip([0.0, *ends], ends)][1:] or ends
    tokens = sum(s["tokens"] or 0.0 for s in steps)
    return {"median_step_s": round(statistics.median(gaps), 3) if gaps else None, "learner_busy_share": None,
            "gen_tokens_per_s_per_gpu": round(tokens / ends[-1] / gpus, 1) if ends and ends[-1] else None}


def ours_save_flags(spec: str) -> list[str]:
    """The learner's flags for a save schedule: a constant one is --save-weights-every-s alone; a
    changing one also passes itself as --save-weights-schedule, and --save-weights-every-s its first
    period (that flag turns the saves on)."""
    sched = parse_save_schedule(spec)
    every = ["--save-weights-every-s", f"{sched[0][0]:g}"]
    return every if len(sched) == 1 else every + ["--save-weights-schedule", spec]


def logged_steps(text: str, batch: int) -> list[dict]:
    """The per-step records of a TRL run that died before writing steps.json, from the dicts the
    Trainer printed to its log (logging_steps=1; plain literals, read with ast.literal_eval)."""
    steps = []
    for line in text.splitlines():
        if line.startswith("{'loss'"):
            log = {k: float(v) for k, v in ast.literal_eval(line).items()}
            steps.append({"step": len(steps) + 1, "completions": batch, "reward_mean": log.get("reward"),
                          "frac_reward_zero_std": log.get("frac_reward_zero_std"),
                          "grad_norm": log.get("grad_norm"), "entropy": log.get("entropy")})
    return steps


def last_error(text: str) -> str | None:
    """The exception a command died of: the last 'SomeError: message' line of its log."""
    found = re.findall(r"^(?:[\w.]+\.)?(\w+(?:Error|Exception): .*)$", text, flags=re.M)
    return found[-1][:200] if found else None


# ----------------------------------------------------------------------------- running
def model_path(model: str) -> str:
    """A row's MODEL as --model takes it: the GGUF file of 0.5b / 1.5b, else the value itself."""
    if model not in SHORT:
        return model
    if (found := fetch.find(SHORT[model])) is not None:   # where --model qwen2.5-coder-* looks too
        return str(found)
    raise SystemExit(f"benchmark: {MODELS[SHORT[model]]['file']} is in none of "
                     f"{', '.join(map(str, fetch.search_dirs()))}; "
                     f"run `python bench/fetch_models.py get {SHORT[model]}` (or set GRPO_GGUF_DIR)")


def shared_flags(args) -> list[str]:
    return [f"--{k.replace('_', '-')}={v}" for k, v in (SMALL if args.device == "cpu" else SHARED).items()]


def eval_tokens(args) -> int:
    return SMALL["max_new_tokens"] if args.device == "cpu" else EVAL_TOKENS


def free_ports(n: int) -> list[int]:
    """n distinct ports free now, for a row's data and sync sockets: rows side by side on one host must
    not share the defaults (the launcher checks them free before it starts anything)."""
    import socket

    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def ours_command(args, row: dict, run_dir: Path, model: str | None = None) -> list[str]:
    """ours' command for a row; --model is `model` if given, else the row's MODEL looked up (model_path)."""
    shared = shared_flags(args)
    cpu = ["--device", "cpu", "--prompts-per-round", "2"] if args.device == "cpu" else []
    only = OURS_ONLY if args.device != "cpu" else [f for f in OURS_ONLY if f != "--filter-zero-signal"]
    layout = [] if args.device == "cpu" else LAYOUTS[row["layout"]]["ours"]
    ports = ["--data-port", *map(str, free_ports(2))]
    ports[2:2] = ["--sync-port"]
    model = model_path(row["model"]) if model is None else model
    return [sys.executable, str(ROOT / "run_distributed.py"), "--model", model, *ports,
            "--dataset", args.dataset, *shared, *only, *layout, *cpu, "--eval-size", str(args.eval_size),
            "--max-time-s", str(args.seconds), "--max-steps", "100000", *ours_save_flags(args.save_schedule),
            "--seed", str(row["seed"]), "--run-dir", str(run_dir), *OURS_TRAINERS[row["trainer"]],
            *args.ours_flags.split()]


def trl_command(args, row: dict, run_dir: Path) -> list[str]:
    ranks = LAYOUTS[row["layout"]]["gpus"] if args.device != "cpu" else 1
    head = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
            if ranks > 1 else [sys.executable])
    batch = (SMALL if args.device == "cpu" else SHARED)["train_batch_size"]
    micro = min(args.trl_micro_batch, batch // ranks)
    return [*head, str(ROOT / "bench" / "trl_grpo.py"), "--model", model_path(row["model"]), "--dataset", args.dataset,
            *shared_flags(args), "--dtype", "float32", "--micro-batch", str(micro), "--gradient-checkpointing",
            "--seconds", str(args.seconds), "--launch-time", "{launch}", "--save-schedule", args.save_schedule,
            "--save-dir", str(run_dir / "weights"), "--seed", str(row["seed"]), "--out", str(run_dir / "steps.json"),
            *(["--device", "cpu"] if args.device == "cpu" else []),
            *(["--use-vllm"] if row["trainer"] == "trl-vllm" else [])]


def check_ours(cmd: list[str]) -> None:
    """Parse ours' command as the launcher will (grpo.launch.plan.parse; nothing starts), so that a
    flag it does not know (a typo in --ours-flags) stops this script before any row runs."""
    from grpo.launch.plan import parse

    try:
        parse(cmd[2:])
    except SystemExit as e:
        if e.code:
            raise SystemExit(f"benchmark: run_distributed.py refuses ours' command (its message is above); "
                             f"nothing was run: {' '.join(cmd[2:])}") from None


def check_rows(args, rows: list[dict]) -> None:
    """Every ours row's command through check_ours before anything else happens: a typo in --ours-flags
    stops the script before a model is looked up or converted and before any row (a TRL row listed
    first included) runs. --model stands as the row gives it: the launcher's parse reads flags, not files."""
    for row in rows:
        if row["trainer"] in OURS_TRAINERS:
            check_ours(ours_command(args, row, Path(args.work_dir) / row["name"], model=row["model"]))


def launch(cmd: list[str], run_dir: Path, trainer: str, extra: dict) -> dict:
    """Run one row's command with its output in run_dir/command.log; record the launch time (every
    point's clock starts here), the command as run and `extra` (seed, commit, ...) in
    run_dir/launch.json. '{launch}' in the command becomes the launch's Unix time."""
    if (run_dir / "launch.json").exists():
        # A second run in the same folder would append to the first's metrics and logs and mix
        # their saves under one launch time.
        raise SystemExit(f"benchmark: {run_dir} already holds a run (launch.json); give another --work-dir "
                         f"or remove that folder")
    run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    cmd = [c.replace("{launch}", f"{t0:.3f}") for c in cmd]
    print(f"benchmark: {trainer}: {' '.join(cmd)}", flush=True)
    with open(run_dir / "command.log", "w") as log:
        code = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    rec = {"system": trainer, "launch_time": t0, "wall_s": time.time() - t0, "exit_code": code,
           "command": cmd, **extra}
    (run_dir / "launch.json").write_text(json.dumps(rec, indent=2) + "\n")
    print(f"benchmark: {trainer} exited {code} after {rec['wall_s']:.0f} s", flush=True)
    return rec


def run_row(args, spec: str) -> dict:
    row = parse_row(spec)
    run_dir = Path(args.work_dir) / row["name"]
    cmd = (ours_command if row["trainer"] in OURS_TRAINERS else trl_command)(args, row, run_dir)
    if row["trainer"] in OURS_TRAINERS:
        check_ours(cmd)
    commit = args.git_commit or git_head(ROOT)[0]
    os.environ.setdefault("GRPO_GIT_COMMIT", commit or "")
    parent = os.environ.get("CUDA_VISIBLE_DEVICES")
    if args.device != "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = row_gpus(args.first_gpu, LAYOUTS[row["layout"]]["gpus"], parent)
    try:
        return launch(cmd, run_dir, row["trainer"], {**row, "commit": commit, "save_schedule": args.save_schedule,
                                                     "seconds": args.seconds, "row": spec,
                                                     "eval_tokens": eval_tokens(args),
                                                     **({"label": args.label} if args.label else {})})
    finally:
        if parent is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = parent


def row_gpus(first_gpu: int, count: int, parent: str | None) -> str:
    """A row's CUDA_VISIBLE_DEVICES: `count` GPUs from --first-gpu (a row beside another on one host,
    benchmark.sh's ROW+ROW, takes the GPUs from there), counted within this process's own
    CUDA_VISIBLE_DEVICES when it has one, as the launcher counts them."""
    return as_visible(",".join(str(first_gpu + i) for i in range(count)), parent)


def prepare(args, models: list[str]) -> dict:
    """Convert each model's GGUF once (into the model cache) before any row, so no row's clock pays it."""
    from grpo.model.zoo import resolve_model

    out = {}
    for m in models:
        t = time.perf_counter()
        resolve_model(model_path(m))
        out[m] = round(time.perf_counter() - t, 1)
        print(f"benchmark: {m} ready in {out[m]} s", flush=True)
    return out


# ----------------------------------------------------------------------------- scoring
def load_into(model, folder: Path) -> None:
    """Copy a saved version's tensors into `model`'s parameters in place (the engine's captured
    graphs read that memory), cast to its dtype. Every parameter must be there; a tied head is one
    parameter."""
    import torch
    from safetensors.torch import load_file

    tensors = {}
    for f in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    with torch.no_grad():
        missing = []
        for name, p in model.named_parameters():
            if name in tensors:
                p.copy_(tensors[name].to(p.dtype))
            else:
                missing.append(name)
    if missing:
        raise SystemExit(f"benchmark: {folder} lacks {len(missing)} parameters, e.g. {missing[0]}")


def score(args) -> None:
    """Score each model's base weights once and every unscored save, spread over --gpus (one process each)."""
    work = Path(args.work_dir)
    items = []
    for launch_file in sorted(work.glob("*/launch.json")):
        run, launch = launch_file.parent, json.loads(launch_file.read_text())
        done = {json.loads(x)["step"] for f in run.glob("scores*.jsonl") for x in f.read_text().splitlines() if x}
        for meta in sorted((run / "weights").glob("step_*/weights.json")):
            rec = json.loads(meta.read_text())
            if rec["step"] not in done:
                items.append((launch["model"], str(run), str(meta.parent), rec["step"],
                              rec["wall_time"] - launch["launch_time"]))
    for model in sorted({i[0] for i in items} | {json.loads(f.read_text())["model"] for f in work.glob("*/launch.json")}):
        if not (work / f"base_{model}.json").is_file():
            items.append((model, "", "", 0, 0.0))
    if not items:
        print("benchmark: nothing to score", flush=True)
        return
    gpus = args.gpus.split(",") if args.device != "cpu" else ["cpu"]
    procs = []
    for k, share in enumerate(split_items(items, len(gpus))):
        todo = work / f".score_{k}.json"
        todo.write_text(json.dumps(share))
        env = {**os.environ, **({"CUDA_VISIBLE_DEVICES": as_visible(gpus[k], os.environ.get("CUDA_VISIBLE_DEVICES"))}
                                if gpus[k] != "cpu" else {})}
        cmd = [sys.executable, __file__, "score-worker", "--items", str(todo), "--work-dir", str(work),
               "--eval-tokens", str(eval_tokens(args)),
               "--dataset", args.dataset, "--eval-size", str(args.eval_size), "--device", args.device, "--worker", str(k)]
        procs.append(subprocess.Popen(cmd, env=env, cwd=ROOT))
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"benchmark: a scoring process failed (exit codes {codes})")


def score_worker(args) -> None:
    import torch

    from grpo.evaluate import eval_problems, greedy_accuracy
    from grpo.generate.greedy import eval_engine
    from grpo.model.load import compute_dtype, load_causal_lm, load_tokenizer, pick_device, start_runtime
    from grpo.model.zoo import resolve_model

    device = pick_device(args.device, -1 if args.device == "cpu" else 0)
    start_runtime(device, {})   # the workers' attention kernels (no cuDNN), as python -m grpo.evaluate
    problems = eval_problems(args.dataset, args.eval_size)
    loaded = None
    for model, run, folder, step, seconds in json.loads(Path(args.items).read_text()):
        if loaded != model:
            path = resolve_model(model_path(model))
            tok = load_tokenizer(path)
            net = load_causal_lm(path, device, compute_dtype(device))
            engine = eval_engine(net, tok, "auto", device)
            loaded, fresh = model, True
        if folder:
            t0 = time.perf_counter()
            load_into(net, Path(folder))
            fresh = False
            load_s = time.perf_counter() - t0
        elif not fresh:   # the base model after a save in this process: load its weights again
            net = load_causal_lm(path, device, compute_dtype(device))
            engine = eval_engine(net, tok, "auto", device)
            fresh, load_s = True, 0.0
        else:
            load_s = 0.0
        r = greedy_accuracy(net, tok, problems, args.eval_tokens, 64, device, engine)
        keep = {k: r[k] for k in ("accuracy", "correct", "n", "truncated_frac", "mean_completion_len", "top_answers",
                                  "decoder", "decode_s", "reward_failures", "reward_failed") if k in r}
        keep["eval_s"] = r.get("seconds")   # the evaluation's own time; "seconds" is the save's, from launch
        if folder:
            line = {"step": step, "seconds": round(seconds, 2), **keep, "load_s": round(load_s, 2)}
            with open(Path(run) / f"scores_w{args.worker}.jsonl", "a") as fh:
                fh.write(json.dumps(line) + "\n")
            print(f"benchmark: {Path(run).name} step {step} at {seconds:.0f} s: {r['accuracy']:.3f}", flush=True)
        else:
            (Path(args.work_dir) / f"base_{model}.json").write_text(json.dumps({"model": model, **keep}) + "\n")
            print(f"benchmark: {model} base {r['accuracy']:.3f}", flush=True)
    if device.type == "cuda":
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------- the result
def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.is_file() else []


def run_points(run: Path, base: dict) -> list[dict]:
    """The run's curve: the base model at 0 s (the weights every run launches with), then each save
    from every scores*.jsonl (one file per scoring process)."""
    pts = [{"seconds": 0.0, "step": 0, "accuracy": base["accuracy"], "ci95": wilson(base["correct"], base["n"])}]
    for x in (x for f in sorted(run.glob("scores*.jsonl")) for x in _lines(f)):
        s = json.loads(x)
        pts.append({"seconds": s["seconds"], "step": s["step"], "accuracy": s["accuracy"],
                    "ci95": wilson(s["correct"], s["n"]),
                    **({"top_answers": s["top_answers"]} if "top_answers" in s else {})})
    return sorted(pts, key=lambda p: p["seconds"])


def ours_books(run: Path) -> dict:
    """The learner's accounting (summary.json), and the stale and zero-signal shares of groups sent."""
    try:
        summary = json.loads(read_run_file(run, "summary.json"))
    except FileNotFoundError:
        return {"groups": None, "stale_fraction": None, "zero_signal_fraction": None}
    g = summary["groups"]
    sent = max(g.get("sent") or 0, 1)
    return {"groups": g, "steps": summary.get("steps"), "stale_fraction": round(g["dropped"].get("stale", 0) / sent, 4),
            "zero_signal_fraction": round(g["dropped"].get("sampler_zero_signal", 0) / sent, 4)}


def rate_from_launch(steps: int | None, first_from_launch: float | None, first_end: float | None,
                     last_end: float | None) -> float | None:
    """Steps per second counted from the command's launch to the last step's end, start-up included
    (steps_per_s counts the trainer's own clock). The trainers' clocks start after launch, so the
    last step's time from launch is the first step's plus the span between the two on that clock:
    10 steps, the first ending 20 s from launch and at 5 s of the trainer's clock, the last at 95 s:
    10 / (20 + 90) = 0.0909."""
    if not steps or first_from_launch is None or first_end is None or last_end is None:
        return None
    return round(steps / (first_from_launch + last_end - first_end), 4)


def first_step_ours(run: Path, launch_time: float) -> tuple[float | None, str | None]:
    """Seconds from the command's launch to the learner's first optimizer step, and where from: the
    first 'first_step' stage mark at or after the launch (a run dir may keep an earlier launch's
    marks), from stages/learner0.json (its newest mark, and all of them under "history") or else
    summary.json's "stages"; else summary.json's first_step_s, which counts from the first process's
    start, not from launch. (None, None) when none of them says."""
    try:
        summary = json.loads(read_run_file(run, "summary.json"))
    except FileNotFoundError:
        summary = {}
    sources = []
    path = run / "stages" / "learner0.json"
    if path.is_file():
        rec = json.loads(path.read_text())
        sources.append(("stages/learner0.json", rec.get("history") or [rec]))
    sources.append(("summary.json stages", (summary.get("stages") or {}).get("learner0") or []))
    for source, marks in sources:
        t = min((float(m["time"]) for m in marks if m.get("stage") == "first_step"
                 and float(m["time"]) >= launch_time), default=None)
        if t is not None:
            return round(t - launch_time, 2), source
    if summary.get("first_step_s") is not None:
        return round(float(summary["first_step_s"]), 2), "summary.json first_step_s (from the first process's start)"
    return None, None


def first_step_trl(doc: dict, launch_time: float) -> tuple[float | None, str | None]:
    """TRL: the first step's end from launch, where steps.json stamps its steps with Unix times
    ("wall_time"); its "time_s" counts from the start of training, not from launch."""
    steps = doc.get("steps") or []
    if steps and steps[0].get("wall_time") is not None:
        return round(float(steps[0]["wall_time"]) - launch_time, 2), "steps.json"
    return None, None


def trl_books(run: Path, launch: dict) -> dict:
    """TRL trains every group it generates, on-policy: nothing is stale; its zero-signal share is the
    mean of its own frac_reward_zero_std over steps (those groups cost generation and add nothing).
    A run that failed (exit code not 0) gets its error, and its steps from the log if it wrote none."""
    log = read_run_file(run, "command.log") if launch["exit_code"] else ""
    if (run / "steps.json").is_file():
        doc, source = json.loads((run / "steps.json").read_text()), "steps.json"
    else:
        doc = {"steps": logged_steps(log, SHARED["train_batch_size"])}
        source = "command.log (the run wrote no steps.json)"
    steps = doc["steps"]
    first, first_from = first_step_trl(doc, launch["launch_time"]) if "launch_time" in launch else (None, None)
    zs = [s["frac_reward_zero_std"] for s in steps if s.get("frac_reward_zero_std") is not None]
    bad = [s["step"] for s in steps if s.get("grad_norm") is not None and not math.isfinite(float(s["grad_norm"]))]
    return {"steps": len(steps), "completions_trained": sum(s["completions"] for s in steps),
            "stale_fraction": 0.0, "zero_signal_fraction": round(sum(zs) / len(zs), 4) if zs else None,
            "nonfinite_grad_steps": bad, "books_from": source, "first_step_s": first, "first_step_from": first_from,
            "error": doc.get("error") or (last_error(log) if launch["exit_code"] else None),
            "config": doc.get("config")}


def _run_json(run: Path, name: str, lines: bool = False):
    """A run file's JSON (a list of its lines' for .jsonl); None where a failed row wrote none."""
    try:
        text = read_run_file(run, name)
    except FileNotFoundError:
        return None
    return [json.loads(x) for x in text.splitlines() if x] if lines else json.loads(text)


def _evals(run: Path) -> dict:
    """Ours: sampler 0's baseline and the learner's final evaluation from eval.jsonl (accuracy, decode seconds)."""
    try:
        lines = [json.loads(x) for x in read_run_file(run, "eval.jsonl").splitlines() if x]
    except FileNotFoundError:
        return {}
    pick = {"sampler0_baseline": [e for e in lines if e["by"] == "sampler0" and e["version"] == 0],
            "learner_final": [e for e in lines if e["by"] == "learner"]}
    return {k: {"version": v[-1]["version"], "accuracy": v[-1]["accuracy"], "seconds": round(v[-1]["seconds"], 2),
                "decode_s": round(v[-1].get("decode_s", v[-1]["seconds"]), 2)}
            for k, v in pick.items() if v}


def zero_signal_kinds(run: Path) -> dict | None:
    """Ours: the groups the samplers dropped for no signal, by kind, summed over the run's samplers'
    results (sampler<i>_result.json): {"solved": every completion right, "unsolved": none}; None
    where no sampler result counts them (runs made before the counters existed)."""
    results = [json.loads(p.read_text()) for p in sorted(run.glob("sampler*_result.json"))]
    counted = [r for r in results if "zero_signal_solved" in r]
    if not counted:
        return None
    return {k: int(sum(r[f"zero_signal_{k}"] for r in counted)) for k in ("solved", "unsolved")}


def screening(run: Path, group_size: int, trained: int | None = None) -> dict | None:
    """Ours: what the samplers' results say of --screen-generations, summed over the run's samplers:
    prompts dropped at their screen (solved, unsolved) and the completions those cost, and the
    share of every completion generated that reached no learner step for want of signal
    (`no_signal_completions`: those screens' completions and the whole groups dropped as
    zero-signal, group_size each); and every completion generated over the groups the learner
    trained (`completions_per_trained_group`: what a trained group cost in generation, stale,
    zero-signal and never-trained groups included). None where no sampler result counts screens
    (rows made before)."""
    total = screen_totals(run)
    if total is None:
        return None
    wasted = total["screen_samples"] + total["dropped_zero_signal"] * group_size
    return {"prompts": int(total["screened_out"]), "solved": int(total["screened_solved"]),
            "unsolved": int(total["screened_unsolved"]), "completions": int(total["screen_samples"]),
            "no_signal_completions": round(wasted / total["samples"], 4) if total["samples"] else None,
            "completions_per_trained_group": round(total["samples"] / trained, 2) if trained else None}


def group_size_of(command: list[str]) -> int:
    """--num-generations in a row's command (`--num-generations=16` or `--num-generations 16`)."""
    for i, arg in enumerate(command):
        if arg.startswith("--num-generations="):
            return int(arg.split("=", 1)[1])
        if arg == "--num-generations" and i + 1 < len(command):
            return int(command[i + 1])
    raise ValueError(f"no --num-generations in the row's command {command}")


def row_result(run: Path, work: Path, device: dict) -> dict:
    launch = json.loads((run / "launch.json").read_text())
    base = json.loads((work / f"base_{launch['model']}.json").read_text())
    pts = run_points(run, base)
    gpus = LAYOUTS[launch["layout"]]["gpus"]
    saves = [p for p in pts if p["step"] > 0]
    out = {"model": launch["model"], "layout": launch["layout"], "trainer": launch["trainer"], "gpus": gpus,
           "seed": launch["seed"], "seconds": launch.get("seconds"), "exit_code": launch["exit_code"],
           "wall_s": round(launch["wall_s"], 1)}
    if launch["trainer"] in OURS_TRAINERS:
        books = ours_books(run)
        metrics, summary = _run_json(run, "metrics.jsonl", lines=True) or [], _run_json(run, "summary.json") or {}
        steps, rates = summary.get("steps"), ours_rates(metrics, summary, gpus)
        first, _ = first_step_ours(run, launch["launch_time"])
        ends = [m["time_s"] for m in metrics if "step" in m and "time_s" in m]
        first_end, last_end = (min(ends), max(ends)) if ends else (None, None)
        extra = {"books": books.get("groups"), "evals": _evals(run)}
        if (kinds := zero_signal_kinds(run)) is not None:   # (absent from rows made before it was counted)
            extra["zero_signal_kinds"] = kinds
        trained = (books.get("groups") or {}).get("trained")
        if (screens := screening(run, group_size_of(launch["command"]), trained)) is not None:   # (the same)
            extra["screening"] = screens
        if (peak := peak_share_median(metrics)) is not None:   # (absent from rows made before it was logged)
            extra["bf16_peak_share_median"] = peak
        if ms := {log.stem: v for log in sorted(run.glob("sampler*.log")) if (v := stream_step_ms(_lines(log)))}:
            extra["decode_step_ms"] = ms
        stale, zero = books.get("stale_fraction"), books.get("zero_signal_fraction")
    else:
        books = trl_books(run, launch)
        doc = json.loads((run / "steps.json").read_text()) if (run / "steps.json").is_file() else {"steps": []}
        steps, rates = books["steps"], trl_rates(doc["steps"], gpus)
        first = books.get("first_step_s")
        first_end, last_end = (doc["steps"][0]["time_s"], doc["steps"][-1]["time_s"]) if doc["steps"] else (None, None)
        extra = {"error": books.get("error"), "trl_config": books.get("config")}
        stale, zero = 0.0, books.get("zero_signal_fraction")
    span = (first or 0.0) if last_end is None else last_end
    out.update({"steps": steps, "steps_per_s": round(steps / span, 4) if steps and span else None,
                "steps_per_s_from_launch": rate_from_launch(steps, first, first_end, last_end), **rates,
                "first_step_s": first, "stale_share": stale, "zero_signal_share": zero,
                "baseline_accuracy": base["accuracy"],
                "accuracy_at_s": accuracy_marks(saves, launch.get("seconds")),
                "best_accuracy": max((p["accuracy"] for p in saves), default=None),
                "seconds_to_plus5": seconds_to_gain(pts, base["accuracy"], 0.05),
                "seconds_to_plus10": seconds_to_gain(pts, base["accuracy"], 0.10),
                "points": pts, "command": launch["command"], "commit": launch.get("commit"),
                "save_schedule": launch.get("save_schedule"), "eval": f"first {base['n']} GSM8K test problems, greedy, "
                f"{launch.get('eval_tokens', EVAL_TOKENS)} new tokens, {base.get('decoder')} decoder, bf16",
                "device": device.get("device"), "versions": device.get("versions"), **extra})
    if launch.get("label"):   # given to `run` (benchmark.sh's LABEL): the row keeps it wherever it is summarised
        out["label"] = launch["label"]
    return out


def rows_schedule(rows: list[dict]) -> str | list[str]:
    """The save schedule the rows ran on (each row's launch records its own): one string where they
    agree, else the sorted distinct ones. ['30x4,60', '30x4,60'] -> '30x4,60'"""
    seen = sorted({r["save_schedule"] for r in rows if r.get("save_schedule")}) or [SAVE_SCHEDULE]
    return seen[0] if len(seen) == 1 else seen


def summarise(args) -> Path:
    work = Path(args.work_dir)
    device = json.loads((work / "device.json").read_text()) if (work / "device.json").is_file() else {}
    name = args.device_name or device.get("device") or "cpu"
    slug = name.replace(" ", "_").replace("/", "_")
    out = Path(args.results_dir) / f"real_workload_{slug}.json"
    doc = json.loads(out.read_text()) if out.is_file() else {"rows": []}
    new = [row_result(p.parent, work, device) for p in sorted(work.glob("*/launch.json"))]
    for r in new:
        if args.label:
            r["label"] = args.label
    key = lambda r: (r["model"], r["layout"], r["trainer"], r["seed"], r.get("label"))  # noqa: E731
    fresh = {key(r) for r in new}
    doc["rows"] = [r for r in doc["rows"] if key(r) not in fresh] + new
    used = {r["layout"] for r in doc["rows"]}
    doc.update({"device": name, "settings": {"shared": SHARED, "ours_only": OURS_ONLY,
                                             "layouts": {k: v for k, v in LAYOUTS.items() if k in used},
                                             "save_schedule": rows_schedule(doc["rows"]), "marks_s": MARKS_S},
                "prepare_s": device.get("prepare_s"), "command_line": device.get("command")})
    if args.note:
        doc.setdefault("notes", []).append(args.note)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    for model in sorted({r["model"] for r in doc["rows"]}):
        plot([r for r in doc["rows"] if r["model"] == model], out.with_name(f"{out.stem}_{model}.png"), name, model)
    cols = ["model", "layout", "trainer", "seed", "steps", "steps_per_s_from_launch", "median_step_s", "learner_busy_share",
            "gen_tokens_per_s_per_gpu", "stale_share", "zero_signal_share", "baseline_accuracy",
            "seconds_to_plus5", "seconds_to_plus10"]
    from benchutil import table
    print(table(new, cols))
    print("accuracy_at_s:", {f"{r['trainer']}/{r['layout']}": r["accuracy_at_s"] for r in new})
    print("wrote", out)
    return out


def plot(rows: list[dict], path: Path, device: str, model: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.0))
    colours = {("ours", "seed"): "tab:blue", ("ours", "1gpu"): "tab:cyan", ("ours", "1gpu-chosen"): "darkblue",
               ("ours", "chosen"): "tab:green",
               ("trl", "seed"): "tab:orange", ("trl", "chosen"): "tab:orange",
               ("trl", "1gpu"): "tab:red", ("ours", "2gpu"): "tab:purple", ("trl", "2gpu"): "tab:brown",
               ("trl-vllm", "1gpu"): "tab:olive", ("trl-vllm", "2gpu"): "tab:olive", ("trl-vllm", "seed"): "tab:olive",
               ("ours-vllm", "1gpu-chosen"): "tab:pink", ("ours-vllm", "chosen"): "tab:pink"}
    for r in rows:
        xs, ys = [p["seconds"] for p in r["points"]], [p["accuracy"] for p in r["points"]]
        who = {"ours": "ours", "ours-vllm": "ours, vLLM engine", "trl": "TRL GRPOTrainer"}.get(
            r["trainer"], "TRL GRPOTrainer + vLLM colocate")
        how = ("DDP" if r["gpus"] > 1 else "one process") if r["trainer"] not in OURS_TRAINERS else \
            {"seed": "1 sampler + 3 learner ranks", "chosen": "--gpus' split",
             "2gpu": "1 sampler + 1 learner rank", "1gpu-chosen": "--gpus 0: shared, rows in flight"}.get(
                r["layout"], "shared")
        label = f"{who}, {r['gpus']} GPU{'s' if r['gpus'] > 1 else ''} ({how}), seed {r['seed']}" + \
            (f", {r['label']}" if r.get("label") else "")
        # a labelled run (other flags) is dashed, in its row's colour
        ax.plot(xs, ys, marker="o", ms=3, color=colours.get((r["trainer"], r["layout"])), label=label,
                ls="--" if r.get("label") else "-")
    if rows:
        base = rows[0]["baseline_accuracy"]
        ax.axhline(base, color="gray", ls=":", label=f"baseline {base:.3f}")
        ax.axhline(base + 0.10, color="gray", ls="--", lw=0.8, label="baseline + 10 points")
    ax.set_xlabel("seconds from launch (evaluation afterwards, not counted)")
    ax.set_ylabel("greedy accuracy, 500 GSM8K test problems")
    title = MODELS[SHORT[model]]["file"].split("-q4")[0] if model in SHORT else model
    ax.set_title(f"{title} on GSM8K, {device}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def record_device(args, prepare_s: dict) -> None:
    import torch

    from grpo.obs.rundir import provenance

    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    if (work / "device.json").is_file():   # a later row's `run`: the first conversion's time stays
        prepare_s = {**prepare_s, **json.loads((work / "device.json").read_text()).get("prepare_s", {})}
    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() and args.device != "cpu" else "cpu"
    count = torch.cuda.device_count() if name != "cpu" else 0
    (work / "device.json").write_text(json.dumps({"device": f"{count}x {name}" if count > 1 else name,
                                                  "versions": versions(tuple(m for m in ("trl", "vllm") if _has(m))),
                                                  "prepare_s": prepare_s, **provenance()}, indent=2) + "\n")


def _has(mod: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(mod) is not None


# what a run archive leaves out: the saved policies and checkpoints (the scores of them are in), TRL's own output
PACK_SKIP = ("weights", "checkpoints", "trl_output")


def pack(args) -> list[Path]:
    """Each run under --work-dir as an archive the committed results are rebuilt from
    (tests/bench/test_benchmark.py): ./runs/device.json, ./runs/base_<model>.json, ./runs/<run>/ less
    PACK_SKIP and files over 20 MB, and each --extra file (a plan, its logs) at the top; written to
    <results-dir>/real_workload/<device>_<commit>-<label>-<run>.tgz, one a run (a row run again under
    another label gets an archive of its own). Returns the archives."""
    import tarfile

    work = Path(args.work_dir)
    device = json.loads((work / "device.json").read_text()) if (work / "device.json").is_file() else {}
    slug = (args.device_name or device.get("device") or "cpu").replace(" ", "_").replace("/", "_")
    extras = [Path(e) for e in args.extra]
    if missing := [str(e) for e in extras if not e.is_file()]:
        raise SystemExit(f"benchmark: pack: no file {', '.join(missing)} (--extra takes files to put beside the runs)")
    out_dir = Path(args.results_dir) / "real_workload"
    out_dir.mkdir(parents=True, exist_ok=True)
    made = []
    for launch_file in sorted(work.glob("*/launch.json")):
        run = launch_file.parent
        launch = json.loads(launch_file.read_text())
        label = args.label or launch.get("label") or ""
        name = f"{slug}_{str(launch.get('commit') or 'unknown')[:7]}{'-' + label if label else ''}-{run.name}.tgz"
        with tarfile.open(out_dir / name, "w:gz") as tar:
            for f in (work / "device.json", work / f"base_{launch['model']}.json"):
                if f.is_file():
                    tar.add(f, f"./runs/{f.name}")
            for f in sorted(run.rglob("*")):
                rel = f.relative_to(run)
                if f.is_file() and not set(rel.parts) & set(PACK_SKIP) and f.stat().st_size <= 20 << 20:
                    tar.add(f, f"./runs/{run.name}/{rel.as_posix()}")
            for e in extras:
                tar.add(e, f"./{e.name}")
        made.append(out_dir / name)
        print(f"benchmark: packed {run.name} into {out_dir / name}")
    if not made:
        raise SystemExit(f"benchmark: pack: no run under {work} (a folder with launch.json)")
    return made


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("step", choices=["rows", "prepare", "all", "run", "score", "summarise", "figures", "pack",
                                     "score-worker"])
    ap.add_argument("--rows", default="", help="`all`: rows MODEL:LAYOUT:TRAINER:SEED, space-separated "
                                               "(default: the standard rows, `rows` lists them)")
    ap.add_argument("--row", default="", help="`run`: one row")
    ap.add_argument("--seconds", type=float, default=600.0, help="each row: seconds of training from its launch")
    ap.add_argument("--work-dir", default="runs/benchmark")
    ap.add_argument("--dataset", default=str(ROOT.parent / "shared" / "data" / "gsm8k"))
    ap.add_argument("--save-schedule", default=SAVE_SCHEDULE)
    ap.add_argument("--eval-size", type=int, default=EVAL_SIZE)
    ap.add_argument("--gpus", default="0,1,2,3", help="`score`: one scoring process per GPU")
    ap.add_argument("--host-gpus", type=int, default=HOST_GPUS, help="`rows`: the host's GPUs (one-GPU rows "
                    "side by side up to this many; rows needing more left out)")
    ap.add_argument("--first-gpu", type=int, default=0, help="`run`: the row's GPUs start here (rows side by side)")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu"])
    ap.add_argument("--trl-micro-batch", type=int, default=16, help="TRL: completions per device per forward")
    ap.add_argument("--ours-flags", default="", help="flags appended to ours' command (a CPU check's smaller sizes)")
    ap.add_argument("--git-commit", default="", help="the commit to record where the tree has no .git")
    ap.add_argument("--label", default="", help="run: recorded with the row; summarise: given to every row "
                    "summarised (kept beside earlier runs of the same rows)")
    ap.add_argument("--device-name", default="")
    ap.add_argument("--note", default="", help="summarise: a note kept in the result file's notes")
    ap.add_argument("--extra", nargs="*", default=[], help="pack: files put beside the runs in each archive (the plan, "
                    "its logs)")
    ap.add_argument("--results-dir", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--items", default="", help=argparse.SUPPRESS)
    ap.add_argument("--worker", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--eval-tokens", type=int, default=EVAL_TOKENS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        parse_save_schedule(args.save_schedule)
    except ValueError as e:
        ap.error(f"--save-schedule: {e}")
    if args.step == "rows":
        specs = args.rows.split() or STANDARD_ROWS
        fit = [r for r in specs if LAYOUTS[parse_row(r)["layout"]]["gpus"] <= args.host_gpus]
        if left := [r for r in specs if r not in fit]:
            print(f"benchmark: left out, as they need more than this host's {args.host_gpus} GPUs: {' '.join(left)}",
                  file=sys.stderr)
        print(" ".join(recipe_groups(fit, args.host_gpus)))
    elif args.step == "prepare":   # the rows' models converted, nothing run (bench/benchmark.sh, first)
        prepare(args, sorted({parse_row(r)["model"] for r in (args.rows.split() or STANDARD_ROWS)}))
    elif args.step == "score-worker":
        score_worker(args)
    elif args.step == "score":
        score(args)
    elif args.step == "summarise":
        summarise(args)
    elif args.step == "pack":
        pack(args)
    elif args.step == "figures":   # each run under --work-dir (or --work-dir itself, a run): JSON lines
        work = Path(args.work_dir)
        runs = [work] if (work / "metrics.jsonl").is_file() else sorted(p.parent for p in work.glob("*/metrics.jsonl"))
        if not runs:
            raise SystemExit(f"benchmark: no run under {work} (a folder with metrics.jsonl); give --work-dir a run "
                             f"folder or the folder of runs")
        for run in runs:
            print(json.dumps({"run": run.name, **run_figures(run)}))
    else:
        specs = (args.rows.split() or list(STANDARD_ROWS)) if args.step == "all" else [args.row]
        rows = [parse_row(s) for s in specs if s]
        if not rows:
            ap.error("`run` needs --row MODEL:LAYOUT:TRAINER:SEED")
        check_rows(args, rows)
        record_device(args, prepare(args, sorted({r["model"] for r in rows})))
        for spec in specs:
            run_row(args, spec)
            if args.step == "all":   # each row scored before the next starts: a plan cut short keeps it
                score(args)
                summarise(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
