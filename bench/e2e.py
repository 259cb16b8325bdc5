"""End-to-end GRPO completions/s: this trainer against TRL's GRPOTrainer, same settings, one call.

Ours: run_distributed.py, sampler on GPU 0, ZeRO-2 learner on GPU 1, for --seconds of training
(--max-time-s), once per --backends entry (--generation-backend). Then TRL: bench/trl_grpo.py,
GRPOTrainer with Hugging Face generation (no vLLM) as plain DDP over GPUs 0,1 (torchrun, one
process per GPU), for the same --seconds. Same model folder, GSM8K train prompts (same text),
correctness reward, G, completions per optimizer step, max new tokens, temperature, learning
rate and beta (see trl_grpo.py for the rest). Goal: ours at least 10x TRL's completions/s.

GPU machine (2 GPUs; ~7 min for one backend at the default 150 s). It has no trl, datasets,
dill or multiprocess and no network: their wheels are in .whl_trl/ (git-ignored, carried like
.whl/). --no-deps into a folder of its own: a resolving install would fail whenever the
machine's fsspec or pyarrow is outside datasets' pins, with no index to fetch others from:
  . bench/device_setup.sh
  python3 -m pip install -q --no-index --no-deps --target /tmp/site_trl .whl_trl/*.whl
  export PYTHONPATH=/tmp/site_trl:$PYTHONPATH
  python3 bench/e2e.py --dataset .data/gsm8k [--backends fast,hf --seconds 90]
CPU smoke check (tiny random model, a few steps each):
  python bench/e2e.py --device cpu --quick --dataset ../shared/data/gsm8k

Steady state, the same rule for both sides (steady_rate below): completions trained in steps
k+1..N divided by the time from the end of step k to the end of step N, both clocks started
when training starts (ours: learner's metrics.jsonl `time_s`; TRL: a callback, GPU-synchronised).
TRL: k = 1 (step 1 carries CUDA warm-up and the first generation). Ours: k = the steps fed by
the sampler's first round, ceil(prompts_per_round * G / batch) (their time includes model load,
CUDA-graph capture and the first round, and the steps after step 1 of that round are free).
Only trained completions count: groups a sampler generated but the learner dropped or left
queued do not. Tokens/s counts completion tokens (EOS included), from the same steps.
Prints a table, writes bench/results/e2e_<device>.json (after each run, so a cut-short call
keeps what finished) and logs under --work-dir.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import ROOT, table, versions, write_result  # noqa: E402
from run_e2e import summarise  # noqa: E402

# (full, --quick) defaults of the settings both sides share.
DEFAULTS = {"model": ("smollm2", "tiny-random"), "seconds": (150.0, 120.0), "max_steps": (100000, 4),
            "num_generations": (8, 4), "train_batch_size": (64, 8), "prompts_per_round": (16, 2),
            "max_new_tokens": (256, 16), "dataset_limit": (0, 64)}
NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def steady_rate(steps: list[dict], skip: int = 1) -> dict:
    """Rates over steps[skip:], timed from the end of step `skip` to the end of the last step.

    Each record: time_s (end of the step, seconds since training began), completions, tokens
    (completion tokens, or None when unknown). Fewer than skip + 1 steps: no rate.
    """
    skip = max(1, skip)
    out = {"steps": len(steps), "skipped_steps": skip, "measured_steps": max(0, len(steps) - skip),
           "window_s": None, "completions": 0, "completions_per_s": None, "tokens_per_s": None}
    if len(steps) <= skip:
        return out
    body = steps[skip:]
    window = steps[-1]["time_s"] - steps[skip - 1]["time_s"]
    completions = sum(s["completions"] for s in body)
    tokens = [s.get("tokens") for s in body]
    out.update(window_s=window, completions=completions, completions_per_s=completions / window,
               tokens_per_s=None if None in tokens else sum(tokens) / window)
    return out


def ours_skip(prompts_per_round: int, num_generations: int, batch: int) -> int:
    """Steps fed by our sampler's first round: ceil(round completions / batch), at least 1."""
    return max(1, -(-prompts_per_round * num_generations // batch))


def ours_steps(run_dir: Path) -> list[dict]:
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [{"step": r["step"], "time_s": r["time_s"], "completions": r["sequences"],
             "tokens": r["completion_len_mean"] * r["sequences"]} for r in recs if not r.get("final")]


def child_env(gpus: str | None) -> dict:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for k, v in NVLS_OFF.items():  # keep NVLink multicast off in every child, whatever the caller set
        env.setdefault(k, v)
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    return env


def run_logged(cmd: list[str], log: Path, env: dict) -> tuple[int, float]:
    print("$", shlex.join(cmd), f"  > {log}", flush=True)
    t0 = time.time()
    with open(log, "w") as fh:
        rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT).returncode
    if rc:
        print(f"exit code {rc}; last lines of {log}:\n" + "\n".join(log.read_text().splitlines()[-15:]), flush=True)
    return rc, time.time() - t0


def run_ours(a, backend: str, work: Path) -> dict:
    run_dir = work / f"ours_{backend}"
    place = (["--sampling-gpu", a.sampling_gpu, "--training-gpus", a.training_gpus] if a.cuda
             else ["--device", "cpu"])
    cmd = [sys.executable, str(ROOT / "run_distributed.py"), *place, "--model", a.model, "--dataset", a.dataset,
           "--num-generations", str(a.num_generations), "--train-batch-size", str(a.train_batch_size),
           "--prompts-per-round", str(a.prompts_per_round), "--max-new-tokens", str(a.max_new_tokens),
           "--learning-rate", str(a.learning_rate), "--beta", str(a.beta), "--temperature", str(a.temperature),
           "--generation-backend", backend, "--max-time-s", str(a.seconds), "--max-steps", str(a.max_steps),
           "--seed", str(a.seed), "--run-dir", str(run_dir), *shlex.split(a.ours_extra)]
    if a.dataset_limit:
        cmd += ["--dataset-limit", str(a.dataset_limit)]
    run_dir.mkdir(parents=True, exist_ok=True)
    rc, wall = run_logged(cmd, work / f"ours_{backend}.log", child_env(None))
    entry = {"command": cmd[1:], "exit_code": rc, "launcher_wall_s": wall, "run_dir": str(run_dir)}
    if rc == 0:
        steps = ours_steps(run_dir)
        entry.update(summarise(run_dir), per_step=steps,
                     rate=steady_rate(steps, ours_skip(a.prompts_per_round, a.num_generations, a.train_batch_size)))
        # Generated, trained or not (diagnostic): more than trained means the learner is the bound.
        entry["completions_generated"] = entry["groups"].get("sent", 0) * a.num_generations
    return entry


def run_trl(a, work: Path) -> dict:
    out = work / "trl" / "steps.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    nproc = len(a.trl_gpus.split(",")) if a.cuda else a.trl_cpu_procs
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           str(ROOT / "bench" / "trl_grpo.py"), "--device", "cuda" if a.cuda else "cpu", "--model", a.model,
           "--dataset", a.dataset, "--num-generations", str(a.num_generations),
           "--train-batch-size", str(a.train_batch_size), "--max-new-tokens", str(a.max_new_tokens),
           "--learning-rate", str(a.learning_rate), "--beta", str(a.beta), "--temperature", str(a.temperature),
           "--seconds", str(a.seconds), "--max-steps", str(a.max_steps), "--dtype", a.trl_dtype,
           "--seed", str(a.seed), "--dataset-limit", str(a.dataset_limit), "--out", str(out)]
    rc, wall = run_logged(cmd, work / "trl.log", child_env(a.trl_gpus if a.cuda else None))
    entry = {"command": cmd[1:], "exit_code": rc, "launcher_wall_s": wall, "processes": nproc,
             "launch": "torchrun, plain DDP, one process per GPU"}
    if rc == 0:
        doc = json.loads(out.read_text())
        entry.update({k: v for k, v in doc.items() if k != "steps"}, rate=steady_rate(doc["steps"], 1),
                     per_step=doc["steps"])
    return entry


def gpu_label(ids: set[str]) -> str:
    """'2x NVIDIA H200' from nvidia-smi: no CUDA context in this parent process."""
    try:
        names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                               text=True, timeout=30).stdout.splitlines()
        name = names[int(sorted(ids)[0])].strip()
    except Exception:  # noqa: BLE001 - a label is not worth failing a benchmark for
        name = "GPU"
    return f"{len(ids)}x {name}" if len(ids) > 1 else name


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", required=True, help="GSM8K folder (train.jsonl), as run_distributed.py's --dataset")
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    ap.add_argument("--quick", action="store_true", help="tiny model, tiny batch, a few steps: a smoke check")
    ap.add_argument("--model")
    ap.add_argument("--seconds", type=float, help="seconds of training per run (150; --quick 120)")
    ap.add_argument("--max-steps", type=int, help="also stop after this many steps (100000; --quick 4)")
    ap.add_argument("--num-generations", type=int, help="G (8)")
    ap.add_argument("--train-batch-size", type=int, help="completions per optimizer step, all ranks (64)")
    ap.add_argument("--prompts-per-round", type=int, help="ours only: prompts a sampler generates at once (16)")
    ap.add_argument("--max-new-tokens", type=int, help="max completion length (256)")
    ap.add_argument("--dataset-limit", type=int, help="first N train problems only (0: all; --quick 64)")
    ap.add_argument("--learning-rate", type=float, default=1e-6)
    ap.add_argument("--beta", type=float, default=0.0, help="KL weight; 0 spares TRL its reference model")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--backends", default="fast", help="ours: comma-separated --generation-backend values, one run each")
    ap.add_argument("--sides", default="ours,trl", help="which to run: ours, trl or both")
    ap.add_argument("--sampling-gpu", default="0")
    ap.add_argument("--training-gpus", default="1")
    ap.add_argument("--trl-gpus", default="0,1")
    ap.add_argument("--trl-cpu-procs", type=int, default=2, help="TRL ranks with --device cpu (gloo)")
    ap.add_argument("--trl-dtype", default="bfloat16", choices=["bfloat16", "float32"], help="see trl_grpo.py")
    ap.add_argument("--ours-extra", default="", help="more run_distributed.py flags, one string")
    ap.add_argument("--name", default="e2e")
    ap.add_argument("--work-dir", help="logs and run dirs (default runs/e2e_<time>)")
    a = ap.parse_args(argv)
    for key, (full, quick) in DEFAULTS.items():
        if getattr(a, key) is None:
            setattr(a, key, quick if a.quick else full)
    a.cuda = a.device == "cuda" or (a.device == "auto" and torch.cuda.is_available())
    return a


def main(argv=None) -> int:
    a = parse(argv)
    sides = set(a.sides.split(","))
    if not sides or not sides <= {"ours", "trl"}:
        print(f"e2e: error: --sides {a.sides!r}: give ours, trl or ours,trl", file=sys.stderr)
        return 2
    missing = [m for m in ("trl", "datasets") if "trl" in sides and importlib.util.find_spec(m) is None]
    if missing:  # checked first: finding out after ours has run would waste the device time
        print(f"e2e: error: {', '.join(missing)} not importable; see this file's docstring for the install line",
              file=sys.stderr)
        return 2
    work = Path(a.work_dir or ROOT / "runs" / f"{a.name}_{int(time.time())}").resolve()
    work.mkdir(parents=True, exist_ok=True)
    settings = {k: getattr(a, k) for k in ("model", "dataset", "dataset_limit", "seconds", "max_steps",
                                           "num_generations", "train_batch_size", "prompts_per_round",
                                           "max_new_tokens", "learning_rate", "beta", "temperature", "seed",
                                           "trl_dtype", "ours_extra")}
    if a.cuda:
        settings.update(ours_gpus={"sampler": a.sampling_gpu, "learner": a.training_gpus}, trl_gpus=a.trl_gpus)
        ids = {*a.sampling_gpu.split(","), *a.training_gpus.split(","), *a.trl_gpus.split(",")}
        device, label = torch.device("cuda"), gpu_label(ids)
    else:
        device, label = torch.device("cpu"), None
    runs: dict[str, dict] = {}

    def save() -> Path:
        trl_rate = runs.get("trl", {}).get("rate", {}).get("completions_per_s")
        ratios = {k: r["rate"]["completions_per_s"] / trl_rate for k, r in runs.items()
                  if k != "trl" and trl_rate and r.get("rate", {}).get("completions_per_s")}
        return write_result(a.name, device, {
            "settings": settings, "steady_state": __doc__.split("Steady state, ")[1].split("Prints a table")[0],
            "goal": "ours >= 10x TRL completions/s", "ratios_vs_trl": ratios,
            "goal_met": {k: v >= 10 for k, v in ratios.items()}, "work_dir": str(work), "runs": runs},
            label=label, extra_versions=("trl", "datasets", "accelerate"))

    if "ours" in sides:
        for backend in a.backends.split(","):
            runs[f"ours_{backend}"] = run_ours(a, backend, work)
            path = save()
    if "trl" in sides:
        runs["trl"] = run_trl(a, work)
        path = save()
    doc = json.loads(path.read_text())
    rows = []
    for name, r in runs.items():
        rate = r.get("rate", {})
        rows.append({"run": name, "exit": r["exit_code"], "steps": rate.get("steps"),
                     "skipped": rate.get("skipped_steps"), "window s": rate.get("window_s"),
                     "completions/s": rate.get("completions_per_s"), "tokens/s": rate.get("tokens_per_s"),
                     "x TRL": doc["ratios_vs_trl"].get(name), "wall s": r["launcher_wall_s"]})
    print()
    print(table(rows, ["run", "exit", "steps", "skipped", "window s", "completions/s", "tokens/s", "x TRL", "wall s"]))
    print("settings:", json.dumps(settings))
    print("versions:", json.dumps(doc["versions"]), "| device:", doc["device"])
    print(f"wrote {path}; logs in {work}")
    return 0 if all(r["exit_code"] == 0 for r in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
