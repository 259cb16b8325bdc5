"""Time to accuracy against TRL on one GPU: greedy held-out accuracy against wall seconds from launch.

Ours (run_distributed.py, sampler and learner sharing the GPU) and TRL's GRPOTrainer
(bench/trl_grpo.py: its own Hugging Face generation) run one after the other with the same model,
task, G, max new tokens, reward, learning rate, beta, loss type and completions per step. Both save
their weights on the --save-schedule of wall time (bench/save_schedule.py; by default every 15 s for
the first two minutes, then every 30 s; ours: the learner's --save-weights-every-s, and
--save-weights-schedule when the period changes; TRL: a callback), and nothing is evaluated while
they run. Afterwards one evaluator (grpo.evaluate's greedy decoder with the rollout engine, bf16,
the same for every version of both) scores every saved version, and the base model, on the first
--eval-size test problems of the task at its starting settings. A point is (seconds from the
command's launch to the end of that save, accuracy).
--ours-flags "--max-staleness 0 --prompts-per-round 8" appends flags to ours' fixed command line
(the later occurrence of a flag wins), for a variant of ours against the same baseline.

    python bench/time_to_accuracy.py all --work-dir runs/tta --task rg:letter_counting --budget-s 1450
    python bench/time_to_accuracy.py summarise --work-dir runs/tta     # the JSON and PNG (also here)

`all` runs ours with each --seeds, scores them, runs TRL for 5x the slower seed's time to 2x its
baseline (or for what is left of --budget-s, whichever is shorter; the JSON says which bound it),
scores TRL and summarises. The steps one by one: `ours --seed S`, `trl --seconds T`, `score`.
Writes bench/results/time_to_accuracy_<device>.json (one entry per task, other tasks kept; with
--label, 'TASK (LABEL)', so a rerun keeps the first run's entry) and
time_to_accuracy_<device>_<task>.png. Needs trl (bench/trl_grpo.py says how to carry it).
Each run's entry records its command, seed, git commit (--git-commit where the tree has no .git,
as on the device machine), --ours-flags, save schedule, seconds from launch to its first optimizer
step, accuracy at 60, 120, 300 and 600 s, and the seconds and step at which it first reached 2x.
"""
from __future__ import annotations

import argparse
import ast
import json
import math
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import save_schedule  # noqa: E402
from benchutil import ROOT, read_run_file, reward_by_time, rounds_of, versions  # noqa: E402

from grpo.obs.rundir import git_head, provenance  # noqa: E402

# The training settings both systems share: the demo's (Makefile DEMO_FLAGS, chosen on train
# problems by bench/task_probe.py). completions per step = --train-batch-size for both.
SHARED = {"num_generations": 16, "train_batch_size": 128, "max_new_tokens": 256, "learning_rate": 2e-5,
          "beta": 0.0, "loss_type": "dapo", "temperature": 1.0}
# Ours only: how the sampler feeds the learner. TRL has no counterpart: it generates each step's
# batch itself and trains on every group, zero-signal ones included (their advantage is 0).
# Staleness and round size are grpo/config.py's defaults (--max-staleness 2, rounds sized to a
# step's worth of groups with signal), chosen by the staleness table in docs/benchmarks.md.
OURS_ONLY = ["--sampling-gpu", "0", "--training-gpus", "0", "--share-gpus", "--generation-backend", "fast",
             "--filter-zero-signal", "--reward", "correctness"]
GOAL_RATIO = 2.0     # the goal: 2x the baseline accuracy
TRL_FACTOR = 5.0     # TRL runs until 5x ours' time to 2x (or the budget ends)
SAVE_SCHEDULE = "15x8,30"   # every 15 s for the first 2 minutes (the goal to a few steps), then every 30 s
MARKS_S = (60, 120, 300, 600)   # accuracy_at_s: the newest save by each of these seconds from launch


# ----------------------------------------------------------------------------- pure rules
def task_slug(task: str) -> str:
    """A task spec as a file name: 'rg:basic_arithmetic:min_terms=2,max_digits=1' ->
    'basic_arithmetic_min_terms_2_max_digits_1' (the device's file transfer refuses '=' and ',')."""
    return re.sub(r"[^A-Za-z0-9]+", "_", task.removeprefix("rg:")).strip("_")


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


def accuracy_at_marks(saves: list[dict], marks=MARKS_S) -> dict[str, float | None]:
    """{'60': accuracy, ...}: at each mark, the accuracy of the newest save at or before it (a run
    that ended earlier: its last); None where the run had saved nothing yet. `saves` are the
    scored saves alone: the base model's point at 0 s is no save of the run."""
    return {str(m): accuracy_at(saves, float(m)) for m in marks}


def ours_save_flags(spec: str) -> list[str]:
    """The learner's flags for a save schedule: a constant one is --save-weights-every-s alone (what
    every learner has); a changing one also passes itself as --save-weights-schedule, and
    --save-weights-every-s its first period (that flag turns the saves on)."""
    sched = save_schedule.parse(spec)
    every = ["--save-weights-every-s", f"{sched[0][0]:g}"]
    return every if save_schedule.is_constant(sched) else every + ["--save-weights-schedule", spec]


def ours_extra_flags(text: str) -> list[str]:
    """--ours-flags, split as a shell would ('--a 1 --b "x y"' -> ['--a', '1', '--b', 'x y']). The
    seed and the run directory name the run (--seeds, --work-dir): not here."""
    flags = shlex.split(text)
    named = [f for f in flags if f.startswith(("--seed", "--run-dir"))]
    if named:
        raise SystemExit(f"time_to_accuracy: --ours-flags may not set {named[0].split('=')[0]}: "
                         f"use --seeds / --seed and --work-dir, which name the run's folder")
    return flags


def first_step_ours(run: Path, launch_time: float) -> tuple[float | None, str | None]:
    """Seconds from the command's launch to the learner's first optimizer step, and where from. The
    learner's 'first_step' stage mark is a Unix time on this clock: the first one at or after the
    launch (a run dir may keep an earlier launch's marks), from stages/learner0.json (its newest mark
    {"stage", "time"}, and all of them under "history") or else summary.json's "stages" (every
    process's marks). Else summary.json's first_step_s, which counts from the first 'started' mark
    of the launch's processes, so it leaves out the launcher's own start (a few seconds short of
    launch). (None, None) when none of them says."""
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


def first_step_loop_s(run: Path) -> float | None:
    """metrics.jsonl's first step record's time_s: seconds from the start of the learner's loop
    (after its model, engine and ports are up) to the end of its first step; not from launch."""
    try:
        lines = read_run_file(run, "metrics.jsonl").splitlines()
    except FileNotFoundError:
        return None
    rec = next((r for r in map(json.loads, filter(None, lines)) if "step" in r and "time_s" in r), None)
    return None if rec is None else round(float(rec["time_s"]), 2)


def first_step_trl(doc: dict, launch_time: float) -> tuple[float | None, str | None]:
    """TRL: the first step's end from launch, where steps.json stamps its steps with Unix times
    ("wall_time"); its "time_s" counts from the start of training, not from launch."""
    steps = doc.get("steps") or []
    if steps and steps[0].get("wall_time") is not None:
        return round(float(steps[0]["wall_time"]) - launch_time, 2), "steps.json"
    return None, None


def trl_seconds(ours_to_goal: list[float | None], left_s: float) -> tuple[float, str]:
    """How long TRL runs: TRL_FACTOR x the slower seed's time to the goal, within what is left of
    the budget; and which of the two bounds it ('5x ours' or 'budget')."""
    if ours_to_goal and all(s is not None for s in ours_to_goal):
        want = TRL_FACTOR * max(ours_to_goal)
        if want <= left_s:
            return want, f"{TRL_FACTOR:g}x ours"
    return max(left_s, 0.0), "budget"


# ----------------------------------------------------------------------------- running
def _launch(cmd: list[str], run_dir: Path, system: str, extra: dict) -> dict:
    """Run one system's command with its output in run_dir/command.log; record the launch time
    (every point's clock starts here), the command as run and `extra` (seed, git commit, ...) in
    run_dir/launch.json."""
    if (run_dir / "launch.json").exists():
        # A second run in the same folder would append to the first's metrics and logs and mix
        # their saves under one launch time.
        raise SystemExit(f"time_to_accuracy: {run_dir} already holds a run (launch.json); give another --work-dir "
                         f"or remove that folder")
    run_dir.mkdir(parents=True, exist_ok=True)
    launch = time.time()
    cmd = [c.replace("{launch}", f"{launch:.3f}") for c in cmd]
    print(f"time_to_accuracy: {system}: {' '.join(cmd)}", flush=True)
    with open(run_dir / "command.log", "w") as log:
        code = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    rec = {"system": system, "launch_time": launch, "wall_s": time.time() - launch, "exit_code": code,
           "command": cmd, **extra}
    (run_dir / "launch.json").write_text(json.dumps(rec, indent=2) + "\n")
    print(f"time_to_accuracy: {system} exited {code} after {rec['wall_s']:.0f} s", flush=True)
    return rec


def ours_command(args, seed: int, run_dir: Path) -> list[str]:
    """The fixed command line, then --ours-flags: argparse keeps a flag's last value, so they win."""
    shared = [f"--{k.replace('_', '-')}={v}" for k, v in SHARED.items()]
    return [sys.executable, str(ROOT / "run_distributed.py"), "--model", args.model, "--dataset", args.task, *shared,
            *OURS_ONLY, "--max-time-s", str(args.ours_seconds), "--max-steps", "100000", "--eval-every", "0",
            *ours_save_flags(args.save_schedule), "--seed", str(seed), "--run-dir", str(run_dir),
            *ours_extra_flags(args.ours_flags)]


def check_ours(cmd: list[str]) -> None:
    """Parse ours' command as the launcher will (grpo.launch.plan.parse; nothing starts), so that a
    flag it does not know (a typo in --ours-flags, or --save-weights-schedule on a learner without
    it) stops this script before any run instead of failing each run in turn."""
    from grpo.launch.plan import parse

    try:
        parse(cmd[2:])
    except SystemExit as e:
        if e.code:
            hint = ("; a learner without --save-weights-schedule takes a constant --save-schedule, e.g. 30"
                    if "--save-weights-schedule" in cmd else "")
            raise SystemExit(f"time_to_accuracy: run_distributed.py refuses ours' command (its message is above); "
                             f"nothing was run{hint}: {' '.join(cmd[2:])}") from None


def _run_extra(args, seed: int, **more) -> dict:
    """What launch.json records beside the command: the seed, the commit, the save schedule."""
    commit, dirty = (args.git_commit, None) if args.git_commit else git_head(ROOT)
    return {"seed": seed, "commit": commit, "git_dirty": dirty, "save_schedule": args.save_schedule, **more}


def launch_ours(args, seed: int) -> dict:
    run_dir = Path(args.work_dir) / f"ours_seed{seed}"
    return _launch(ours_command(args, seed, run_dir), run_dir, "ours",
                   _run_extra(args, seed, ours_flags=ours_extra_flags(args.ours_flags)))


def trl_command(args, seconds: float, run_dir: Path) -> list[str]:
    shared = [f"--{k.replace('_', '-')}={v}" for k, v in SHARED.items()]
    # float32 weights under bf16 autocast: TRL's default. Its pure-bf16 setting (bench/e2e.py's, for
    # speed) rounds away AdamW updates far below a weight's bf16 step at this learning rate.
    return [sys.executable, str(ROOT / "bench" / "trl_grpo.py"), "--model", args.model, "--dataset", args.task,
            *shared, "--dtype", "float32", "--seconds", f"{seconds:.0f}", "--launch-time", "{launch}",
            "--save-schedule", args.save_schedule, "--save-dir", str(run_dir / "weights"),
            "--seed", str(args.seeds[0]), "--out", str(run_dir / "steps.json")]


# ----------------------------------------------------------------------------- scoring
def load_into(model, folder: Path) -> None:
    """Copy a saved version's tensors into `model`'s parameters in place (the engine's captured
    graphs read that memory), cast to its dtype. Every parameter must be there; a tied head
    (SmolLM2's lm_head is the embedding) is one parameter."""
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
        raise SystemExit(f"time_to_accuracy: {folder} lacks {len(missing)} parameters, e.g. {missing[0]}")


def score(args) -> None:
    """Score the base model once and every saved version not yet scored (<run>/scores.jsonl)."""
    import torch

    from grpo.evaluate import eval_engine, eval_problems, greedy_accuracy
    from grpo.model import compute_dtype, load_causal_lm, load_tokenizer, pick_device, resolve_model

    work = Path(args.work_dir)
    runs = sorted(p.parent for p in work.glob("*/launch.json"))
    todo = []
    for run in runs:
        done = {json.loads(x)["step"] for x in _lines(run / "scores.jsonl")}
        launch = json.loads((run / "launch.json").read_text())["launch_time"]
        for meta in sorted((run / "weights").glob("step_*/weights.json")):
            rec = json.loads(meta.read_text())
            if rec["step"] not in done:
                todo.append((run, meta.parent, rec, launch))
    base_file = work / "base_score.json"
    if base_file.is_file() and (scored := json.loads(base_file.read_text()).get("task")) != args.task:
        raise SystemExit(f"time_to_accuracy: {work} was scored on {scored}, not {args.task}; give that --task, or "
                         f"another --work-dir for this task")
    if not todo and base_file.is_file():
        return
    device = pick_device(args.device, -1 if args.device == "cpu" else 0)
    path = resolve_model(args.model)
    tok = load_tokenizer(path)
    model = load_causal_lm(path, device, compute_dtype(device))
    engine = eval_engine(model, tok, "auto", device)
    problems = eval_problems(args.task, args.eval_size)

    def one() -> dict:
        r = greedy_accuracy(model, tok, problems, SHARED["max_new_tokens"], args.eval_batch_size, device, engine)
        return {k: r[k] for k in ("accuracy", "correct", "n", "truncated_frac", "mean_completion_len", "top_answers",
                                  "decoder", "decode_s")}

    if not base_file.is_file():
        base = one()
        base_file.write_text(json.dumps({"task": args.task, "model": args.model, **base, **provenance()}) + "\n")
        print(f"time_to_accuracy: base model {base['accuracy']:.3f} ({base['correct']}/{base['n']})", flush=True)
    for run, folder, rec, launch in todo:
        t0 = time.perf_counter()
        load_into(model, folder)
        t1 = time.perf_counter()
        r = one()
        # The evaluator's own cost (reading the save, decoding and scoring), so that a device plan
        # can budget it; not part of any point's seconds.
        cost = {"load_s": round(t1 - t0, 2), "eval_s": round(time.perf_counter() - t1, 2)}
        line = {"step": rec["step"], "seconds": round(rec["wall_time"] - launch, 2), **r, "score_cost": cost}
        with open(run / "scores.jsonl", "a") as fh:
            fh.write(json.dumps(line) + "\n")
        print(f"time_to_accuracy: {run.name} step {rec['step']} at {line['seconds']:.0f} s: {r['accuracy']:.3f} "
              f"(load {cost['load_s']:.1f} s, eval {cost['eval_s']:.1f} s)", flush=True)
    model = engine = None   # the next run (TRL) gets this process's GPU memory back
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.is_file() else []


# ----------------------------------------------------------------------------- the result
def run_points(run: Path, base: dict) -> list[dict]:
    """The run's curve: the base model at 0 s (the weights every run launches with), then each save."""
    pts = [{"seconds": 0.0, "step": 0, "accuracy": base["accuracy"], "ci95": wilson(base["correct"], base["n"])}]
    # scores.jsonl, or one file per scoring process (bench/real_workload.py's scores_w<k>.jsonl)
    for x in (x for f in sorted(run.glob("scores*.jsonl")) for x in _lines(f)):
        s = json.loads(x)
        pts.append({"seconds": s["seconds"], "step": s["step"], "accuracy": s["accuracy"],
                    "ci95": wilson(s["correct"], s["n"]),
                    # scores from before top_answers have none
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


def trl_books(run: Path, launch: dict) -> dict:
    """TRL trains every group it generates, on-policy: nothing is stale; its zero-signal share is the
    mean of its own frac_reward_zero_std over steps (those groups cost generation and add nothing).
    A run that failed (exit code not 0) gets its error, and its steps from the log if it wrote none.
    first_step_s: from steps.json's Unix stamps where it has them (first_step_trl)."""
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
            "trl_version": doc.get("trl") or _device(run.parent).get("versions", {}).get("trl"),
            "config": doc.get("config")}


def _device(work: Path) -> dict:
    """work/device.json (record_device): the GPU's name and the versions; {} if absent."""
    return json.loads((work / "device.json").read_text()) if (work / "device.json").is_file() else {}


def constant_answer(task: str, n: int) -> dict:
    """grpo.evaluate's constant-answer baseline on the scored subset (its most common answer)."""
    from grpo.evaluate import constant_answer_baseline, eval_problems

    return constant_answer_baseline(eval_problems(task, n))


def sampled_by_minute(run: Path) -> list[dict] | None:
    """Sampler 0's train-side figures per minute from its first round's line: the mean reward of
    every completion it generated and the share of groups without signal (what the runs are
    compared by on train data; held-out points are for measuring)."""
    if not any((run / f).is_file() for f in ("sampler0.log", "sampler0.log.gz")):
        return None
    rounds = [r for r in rounds_of(read_run_file(run, "sampler0.log")) if "clock_s" in r]
    return reward_by_time(rounds, rounds[0]["clock_s"], 60) if rounds else None


def summarise_task(work: Path) -> dict:
    base = json.loads((work / "base_score.json").read_text())
    if base["accuracy"] < 0.1:   # 2x of next to nothing is noise: the issue asks for tasks at 0.1 or more
        print(f"time_to_accuracy: warning: the baseline {base['accuracy']:.3f} is below 0.1", flush=True)
    target = GOAL_RATIO * base["accuracy"]
    out = {"task": base["task"], "eval": f"first {base['n']} test problems at the task's starting settings, "
           f"greedy, {base['decoder']} decoder, bf16", "baseline_accuracy": base["accuracy"],
           "baseline_ci95": wilson(base["correct"], base["n"]), "target_accuracy": round(target, 4),
           # What answering every question with the same answer scores: above the target, a run can
           # reach 2x without solving anything (points' top_answers show whether it did).
           "constant_answer": constant_answer(base["task"], base["n"])}
    systems: dict[str, dict] = {}
    meta = _device(work)
    # Runs from before --save-schedule saved every device.json's save_every_s seconds.
    legacy_schedule = f"{meta['save_every_s']:g}" if meta.get("save_every_s") else None
    for launch_file in sorted(work.glob("*/launch.json")):
        run, launch = launch_file.parent, json.loads(launch_file.read_text())
        pts = run_points(run, base)
        rec = {"run": run.name, "seed": launch.get("seed"), "exit_code": launch["exit_code"],
               "wall_s": round(launch["wall_s"], 1), "points": pts, "baseline_accuracy": base["accuracy"],
               "seconds_to_2x_baseline": seconds_to(pts, target), "accuracy_at_600s": accuracy_at(pts, 600.0),
               "accuracy_at_s": accuracy_at_marks(pts[1:]),
               "step_at_2x_baseline": next((p["step"] for p in pts if p["accuracy"] >= target > 0), None),
               "last_save_s": pts[-1]["seconds"], "bound": launch.get("bound"), "command": launch["command"],
               # "git_commit" in launch.json files written before it was "commit"
               "git_commit": launch.get("commit", launch.get("git_commit")), "git_dirty": launch.get("git_dirty"),
               "save_schedule": launch.get("save_schedule", legacy_schedule)}
        if launch["system"] == "ours":
            first, first_from = first_step_ours(run, launch["launch_time"])
            rec.update({"ours_flags": launch.get("ours_flags", []), "first_step_s": first,
                        "first_step_from": first_from, "first_step_after_loop_start_s": first_step_loop_s(run),
                        "sampled_by_minute": sampled_by_minute(run)})
        rec.update(ours_books(run) if launch["system"] == "ours" else trl_books(run, launch))
        systems.setdefault(launch["system"], {"runs": []})["runs"].append(rec)
    for name, sys_ in systems.items():
        # Several seeds: the slower one counts (None if any seed never got there).
        times = [r["seconds_to_2x_baseline"] for r in sys_["runs"]]
        sys_["seconds_to_2x_baseline"] = None if None in times else max(times)
        sys_["accuracy_at_600s"] = min((r["accuracy_at_600s"] for r in sys_["runs"]
                                        if r["accuracy_at_600s"] is not None), default=None)
        sys_["best_accuracy"] = max(p["accuracy"] for r in sys_["runs"] for p in r["points"])
        sys_["longest_run_s"] = max(r["last_save_s"] for r in sys_["runs"])
    out["systems"] = systems
    ours, trl = systems.get("ours", {}), systems.get("trl", {})
    if ours.get("seconds_to_2x_baseline") and trl:
        t_ours, t_trl = ours["seconds_to_2x_baseline"], trl.get("seconds_to_2x_baseline")
        out["speedup_to_2x"] = round(t_trl / t_ours, 2) if t_trl else None
        out["speedup_at_least"] = None if t_trl else round(trl["longest_run_s"] / t_ours, 2)
        out["goal_5x_met"] = (t_trl / t_ours >= TRL_FACTOR) if t_trl else (trl["longest_run_s"] / t_ours >= TRL_FACTOR)
    return out


def plot(task: dict, out: Path, device: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.0))
    colours = {"ours": "tab:blue", "trl": "tab:orange"}
    for name, sys_ in task["systems"].items():
        for r in sys_["runs"]:
            xs = [p["seconds"] for p in r["points"]]
            ys = [p["accuracy"] for p in r["points"]]
            lo = [p["ci95"][0] for p in r["points"]]
            hi = [p["ci95"][1] for p in r["points"]]
            label = f"{'ours' if name == 'ours' else 'TRL GRPOTrainer'}" + (f" seed {r['seed']}" if name == "ours" else "")
            if r["exit_code"]:
                label += f" (failed: exit {r['exit_code']})"
            ax.plot(xs, ys, marker="o", ms=3, color=colours.get(name), alpha=0.9 if r is sys_["runs"][0] else 0.55,
                    label=label)
            ax.fill_between(xs, lo, hi, color=colours.get(name), alpha=0.08)
    ax.axhline(task["baseline_accuracy"], color="gray", ls=":", label=f"baseline {task['baseline_accuracy']:.3f}")
    ax.axhline(task["target_accuracy"], color="gray", ls="--", label="2x baseline")
    const = task.get("constant_answer") or {}
    if const.get("answer") is not None:
        ax.axhline(const["accuracy"], color="tab:red", ls="-.", lw=0.8,
                   label=f"always answering {const['answer']!r}: {const['accuracy']:.3f}")
    ax.set_xlabel("seconds from launch (one GPU; evaluation not counted)")
    ax.set_ylabel("greedy accuracy (95% interval)")
    run = f" ({task['label']})" if task.get("label") else ""
    ax.set_title(f"SmolLM2-135M on {task['task']}{run}\ntime to accuracy, {device}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def summarise(args) -> Path:
    work = Path(args.work_dir)
    meta = _device(work)
    device = args.device_name or meta.get("device") or "cpu"
    slug = device.replace(" ", "_").replace("/", "_")
    out = Path(args.results_dir) / f"time_to_accuracy_{slug}.json"
    doc = json.loads(out.read_text()) if out.is_file() else {"tasks": {}}
    task = summarise_task(work)
    # --label (kept in device.json): a second run of a task (after the rollouts issue's changes,
    # say) gets an entry and a PNG of its own beside the first instead of replacing it.
    label = args.label or meta.get("label") or ""
    key = f"{task['task']} ({label})" if label else task["task"]
    if label:
        task["label"] = label
    # Each entry keeps the versions it ran with: the file's own "versions" are the latest entry's.
    task["versions"] = meta.get("versions")
    doc.update({"device": device, "versions": meta.get("versions", doc.get("versions")),
                "settings": {"shared": SHARED, "ours_only": OURS_ONLY, "save_schedule": meta.get("save_schedule")
                             or (f"{meta['save_every_s']:g}" if meta.get("save_every_s") else None),
                             "trl": "bench/trl_grpo.py: Hugging Face generate (no vLLM), float32 weights under "
                                    "bf16 autocast, epsilon 0.2, AdamW (0.9, 0.99), grad clip 1, constant LR"},
                "goals": {"ours_2x_within_s": 300, "trl_factor": TRL_FACTOR}})
    doc["tasks"][key] = task
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    png = out.with_name(f"{out.stem}_{task_slug(key)}.png")
    plot(task, png, device)
    for name, s in task["systems"].items():
        print(f"{name}: baseline {task['baseline_accuracy']:.3f}, 2x at {s['seconds_to_2x_baseline']} s, "
              f"at 600 s {s['accuracy_at_600s']}, best {s['best_accuracy']:.3f} (runs up to {s['longest_run_s']:.0f} s)")
    print("wrote", out, "and", png)
    return out


def record_device(args) -> None:
    """work/device.json: the GPU's name and the versions, written on the machine that ran."""
    import torch

    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    extra = ("trl",) if _has("trl") else ()
    (work / "device.json").write_text(json.dumps({"device": name, "versions": versions(extra),
                                                  "save_schedule": args.save_schedule,
                                                  **({"label": args.label} if args.label else {}),
                                                  **provenance()}, indent=2) + "\n")


def _has(mod: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(mod) is not None


def best_of_ours(work: Path) -> list[float | None]:
    base = json.loads((work / "base_score.json").read_text())
    target = GOAL_RATIO * base["accuracy"]
    return [seconds_to(run_points(p.parent, base), target) for p in sorted(work.glob("ours_seed*/launch.json"))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("step", choices=["all", "ours", "trl", "score", "summarise"])
    ap.add_argument("--work-dir", default="runs/tta")
    ap.add_argument("--task", default="rg:letter_counting")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--seeds", type=int, nargs="+", default=[42, 1], help="ours: one run per seed")
    ap.add_argument("--seed", type=int, default=0, help="`ours`: this seed (default: the first of --seeds)")
    ap.add_argument("--ours-seconds", type=float, default=240.0, help="ours: --max-time-s (seconds of training)")
    ap.add_argument("--seconds", type=float, default=600.0, help="`trl`: seconds from launch")
    ap.add_argument("--save-schedule", default=SAVE_SCHEDULE,
                    help="when both systems save their weights, in seconds: 'PxN,...,P' is every P seconds N times, "
                         "..., then every P to the end (bench/save_schedule.py); '30': every 30 s")
    ap.add_argument("--ours-flags", default="",
                    help="flags appended to ours' fixed command line (split as a shell would; a flag's last value "
                         "wins), e.g. \"--max-staleness 0 --prompts-per-round 8\" (one flag alone: "
                         "--ours-flags=--no-X); recorded in each run's entry")
    ap.add_argument("--git-commit", default="",
                    help="the commit to record for each run where the tree has no .git (the device machine's copy): "
                         "pass $(git rev-parse HEAD) of the checkout; default: asked of git")
    ap.add_argument("--budget-s", type=float, default=1450.0,
                    help="`all`: everything (runs, scoring) within this many seconds; bounds TRL's run")
    ap.add_argument("--reserve-s", type=float, default=150.0, help="`all`: kept back from TRL to score its saves")
    ap.add_argument("--eval-size", type=int, default=500)
    ap.add_argument("--eval-batch-size", type=int, default=64, help="Hugging Face generate's batch (CPU)")
    ap.add_argument("--device", default="auto", help="the evaluator's device")
    ap.add_argument("--device-name", default="", help="summarise: the device label (default: device.json)")
    ap.add_argument("--label", default="", help="a name for this run of the task, kept beside earlier runs of it in "
                                                "the JSON as 'TASK (LABEL)' (default: device.json's, else none)")
    ap.add_argument("--results-dir", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args(argv)
    try:
        save_schedule.parse(args.save_schedule)
    except ValueError as e:
        ap.error(str(e))
    work = Path(args.work_dir)
    t0 = time.time()
    if args.step == "summarise":
        summarise(args)
        return 0
    if args.step in ("ours", "all"):
        seed = args.seed or args.seeds[0]
        check_ours(ours_command(args, seed, work / f"ours_seed{seed}"))
    record_device(args)
    if args.step == "ours":
        launch_ours(args, args.seed or args.seeds[0])
    elif args.step == "trl":
        _launch(trl_command(args, args.seconds, work / "trl"), work / "trl", "trl", _run_extra(args, args.seeds[0]))
    elif args.step == "score":
        score(args)
    else:
        for seed in args.seeds:
            launch_ours(args, seed)
        score(args)
        left = args.budget_s - (time.time() - t0) - args.reserve_s
        seconds, bound = trl_seconds(best_of_ours(work), left)
        print(f"time_to_accuracy: TRL for {seconds:.0f} s (bound: {bound})", flush=True)
        _launch(trl_command(args, seconds, work / "trl"), work / "trl", "trl",
                _run_extra(args, args.seeds[0], bound=bound))
        score(args)
        summarise(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
