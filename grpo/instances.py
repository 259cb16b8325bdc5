"""Parallel seeded runs: `run_distributed.py --instances K --seeds 42,1337,...`.

Each instance is an ordinary single run started by its own child launcher, with its own
GPUs, ports, seed and run directory (`<run-dir or runs>/<name>_seed<seed>`), its own logs
and its own supervision. The assignment is a pure function (`plan_instances`), tested
without GPUs:

  GPUs   with --sampling-gpus/--training-gpus: that pattern is instance 0's, and instance k
         gets it shifted by k * (highest id + 1); without them, the machine's GPUs are split
         into K equal blocks, the first GPU of a block sampling and the rest training.
  ports  instance k: --data-port + 2k and --sync-port + 2k (defaults 5555/5556: 5557/5558, ...).

A failed instance is reported with the tail of its launcher log; the others carry on (they
are independent experiments). Ctrl+C / SIGTERM stops every instance.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from grpo.config import LaunchConfig
from grpo.flags import build_parser, to_flags
from grpo.launch import ROOT, LaunchError, _die_with_parent, _signal_group, describe_exit, parse_gpus

PORT_STRIDE = 2


@dataclass
class Instance:
    index: int
    seed: int
    run_dir: Path
    data_port: int
    sync_port: int
    sampling_gpus: list[int]
    training_gpus: list[int]


def parse_seeds(cfg: LaunchConfig) -> list[int]:
    if cfg.seeds.strip():
        try:
            seeds = [int(x) for x in cfg.seeds.replace(" ", "").strip(",").split(",")]
        except ValueError:
            raise LaunchError(f"--seeds {cfg.seeds!r}: expected comma-separated integers like 42,1337") from None
        if cfg.instances not in (1, len(seeds)):
            raise LaunchError(f"--instances {cfg.instances} but --seeds lists {len(seeds)}; give one seed per instance")
    else:
        seeds = [cfg.seed + k for k in range(cfg.instances)]
    if len(set(seeds)) != len(seeds):
        raise LaunchError(f"--seeds {cfg.seeds!r} repeats a seed; each instance needs its own (it names the run dir)")
    if cfg.instances < 1:
        raise LaunchError("--instances must be >= 1")
    return seeds


def plan_instances(cfg: LaunchConfig, cuda_count: int) -> list[Instance]:
    """Seeds, GPUs, ports and run directories of every instance (no side effects)."""
    seeds = parse_seeds(cfg)
    k_all = len(seeds)
    samp0 = parse_gpus(cfg.sampling_gpus, "--sampling-gpus")
    train0 = parse_gpus(cfg.training_gpus, "--training-gpus")
    use_cuda = cfg.device != "cpu" and (cfg.device == "cuda" or samp0 or train0 or cuda_count > 0)
    if cfg.device == "cpu" and (samp0 or train0):
        raise LaunchError("--device cpu with --sampling-gpus/--training-gpus; drop the GPU lists or the --device cpu")
    if use_cuda:
        if cuda_count == 0:
            raise LaunchError("GPUs were asked for but CUDA is not available here; use --device cpu")
        if bool(samp0) != bool(train0):
            raise LaunchError("with --instances give both --sampling-gpus and --training-gpus (instance 0's), or neither")
        if not samp0:
            per = cuda_count // k_all
            if per < 2:
                raise LaunchError(f"{k_all} instances need at least {2 * k_all} GPUs (a sampler and a learner each); "
                                  f"this machine has {cuda_count}: use fewer --instances")
            samp0, train0 = [0], list(range(1, per))
        overlap = sorted(set(samp0) & set(train0))
        if overlap and not cfg.share_gpus:
            raise LaunchError(f"GPU(s) {','.join(map(str, overlap))} in both --sampling-gpus and --training-gpus; "
                              f"give disjoint lists, or add --share-gpus")
    width = max(samp0 + train0, default=-1) + 1
    ports: set[int] = set()
    base = Path(cfg.run_dir) if cfg.run_dir else Path("runs")
    out = []
    for k, seed in enumerate(seeds):
        samp = [g + k * width for g in samp0]
        train = [g + k * width for g in train0]
        if use_cuda and max(samp + train) >= cuda_count:
            raise LaunchError(f"instance {k} would need GPU {max(samp + train)} but this machine has {cuda_count} "
                              f"(0..{cuda_count - 1}); use fewer --instances or shorter GPU lists")
        d, s = cfg.data_port + PORT_STRIDE * k, cfg.sync_port + PORT_STRIDE * k
        if d in ports or s in ports or d == s or max(d, s) > 65535:
            raise LaunchError(f"instance {k}'s ports {d}/{s} collide or overflow (each instance adds {PORT_STRIDE}); "
                              f"use --data-port and --sync-port that differ by 1, e.g. 5555 and 5556")
        ports |= {d, s}
        out.append(Instance(k, seed, base / f"{cfg.name}_seed{seed}", d, s, samp, train))
    return out


def instance_argv(cfg: LaunchConfig, inst: Instance, passthrough: list[str]) -> list[str]:
    """The child launcher's command line: this instance's settings plus the worker flags as given."""
    sub = dataclasses.replace(cfg, instances=1, seeds="", seed=inst.seed, run_dir=str(inst.run_dir),
                              data_port=inst.data_port, sync_port=inst.sync_port,
                              sampling_gpus=",".join(map(str, inst.sampling_gpus)),
                              training_gpus=",".join(map(str, inst.training_gpus)))
    return [sys.executable, str(ROOT / "run_distributed.py"), *to_flags(sub, LaunchConfig), *passthrough]


def run_instances(cfg: LaunchConfig, argv: list[str]) -> int:
    parser = build_parser(LaunchConfig, "run_distributed.py",
                          aliases={"sampling_gpus": ["--sampling-gpu"], "training_gpus": ["--training-gpu"]})
    _, passthrough = parser.parse_known_args(argv)
    try:
        if cfg.device == "cpu":
            cuda_count = 0
        else:
            import torch

            cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        plan = plan_instances(cfg, cuda_count)
    except LaunchError as exc:
        print(f"run_distributed.py: error: {exc}", file=sys.stderr)
        return 2
    stopping = {"sig": 0}
    signal.signal(signal.SIGINT, lambda s, _f: stopping.update(sig=s))
    signal.signal(signal.SIGTERM, lambda s, _f: stopping.update(sig=s))
    procs: list[tuple[Instance, subprocess.Popen, Path]] = []
    try:
        for inst in plan:
            inst.run_dir = inst.run_dir.resolve()   # the child launchers run in the repo root
            inst.run_dir.mkdir(parents=True, exist_ok=True)
            log_path = inst.run_dir / "launcher.log"
            with open(log_path, "ab") as fh:
                p = subprocess.Popen(instance_argv(cfg, inst, passthrough), stdout=fh, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True, cwd=ROOT,
                                     preexec_fn=_die_with_parent, env=dict(os.environ, PYTHONUNBUFFERED="1"))
            procs.append((inst, p, log_path))
            gpus = (f"; sampling GPUs {inst.sampling_gpus}, training GPUs {inst.training_gpus}"
                    if inst.sampling_gpus else "")
            print(f"[instances] {inst.index}: seed {inst.seed}, ports {inst.data_port}/{inst.sync_port}{gpus}; "
                  f"run dir {inst.run_dir}, log {log_path}", flush=True)
        done: dict[int, int] = {}
        while len(done) < len(procs) and not stopping["sig"]:
            for inst, p, log_path in procs:
                rc = p.poll()
                if rc is not None and inst.index not in done:
                    done[inst.index] = rc
                    tail = "\n".join("    " + x for x in log_path.read_text(errors="replace").splitlines()[-15:])
                    print(f"[instances] {inst.index} (seed {inst.seed}) "
                          + ("finished" if rc == 0 else f"{describe_exit(rc)}; last lines of {log_path}:\n{tail}"),
                          flush=True)
            time.sleep(0.5)
        if stopping["sig"]:
            print(f"[instances] {signal.Signals(stopping['sig']).name}: stopping every instance", flush=True)
            return 128 + stopping["sig"]
        return 0 if all(rc == 0 for rc in done.values()) else 1
    finally:
        live = [(inst, p) for inst, p, _ in procs if p.poll() is None]
        for _, p in live:
            _signal_group(p, signal.SIGTERM)   # each child launcher stops its own processes
        deadline = time.monotonic() + cfg.stop_timeout_s + 15
        for inst, p in live:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(p, signal.SIGKILL)   # its workers die with it (PR_SET_PDEATHSIG)
                p.wait()
