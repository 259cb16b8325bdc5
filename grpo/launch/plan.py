"""run_distributed.py: plan the processes, start them, supervise, stop them cleanly.

The plan (which process gets which GPUs, flags and environment) is a pure function, so
it is tested without GPUs. Learner ranks get every training GPU visible and LOCAL_RANK
set, as torchrun and the deepspeed launcher do; each sampler sees only its own GPU.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from grpo.config import CommonConfig, LaunchConfig, LearnerConfig, SamplerConfig
from grpo.flags import apply_config_file, build_parser, to_flags

ROOT = Path(__file__).resolve().parents[1]


class LaunchError(ValueError):
    """A launch mistake; one line with the fix."""


@dataclass
class ProcSpec:
    name: str
    argv: list[str]
    env: dict[str, str]
    role: str  # "learner" or "sampler"


def parse_gpus(text: str, flag: str) -> list[int]:
    if not text.strip():
        return []
    try:
        ids = [int(x) for x in text.replace(" ", "").strip(",").split(",")]
    except ValueError:
        raise LaunchError(f"{flag} {text!r}: expected comma-separated GPU ids like 1,2,3") from None
    if any(i < 0 for i in ids):
        raise LaunchError(f"{flag} {text!r}: GPU ids are >= 0")
    if len(set(ids)) != len(ids):
        raise LaunchError(f"{flag} {text!r} lists a GPU twice; list each GPU once")
    return ids


def _fields(cls) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def split_passthrough(rest: list[str]) -> tuple[list[str], list[str]]:
    """Route flags the launcher does not own to the sampler and/or learner that know them."""
    samp, learn = _fields(SamplerConfig), _fields(LearnerConfig)
    to_s: list[str] = []
    to_l: list[str] = []
    i = 0
    while i < len(rest):
        tok = rest[i]
        if not tok.startswith("--"):
            raise LaunchError(f"unexpected argument {tok!r}; flags look like --name value")
        name, _, inline = tok[2:].partition("=")
        key = name.replace("-", "_")
        neg = key.startswith("no_") and key[3:] in {**samp, **learn} and key not in {**samp, **learn}
        base = key[3:] if neg else key
        if base not in samp and base not in learn:
            raise LaunchError(f"unknown flag --{name} (see --help, sampling_worker.py --help, training_worker.py --help)")
        field = samp.get(base) or learn[base]
        is_bool = field.type in (bool, "bool")
        group = [tok]
        if not is_bool and not inline:
            if i + 1 >= len(rest):
                raise LaunchError(f"--{name} needs a value")
            group.append(rest[i + 1])
            i += 1
        if base in samp:
            to_s += group
        if base in learn:
            to_l += group
        i += 1
    return to_s, to_l


def plan(cfg: LaunchConfig, cuda_count: int, sampler_flags: list[str], learner_flags: list[str],
         master_port: int) -> list[ProcSpec]:
    """Every process of the run, learner ranks first."""
    py = sys.executable
    samp_gpus = parse_gpus(cfg.sampling_gpus, "--sampling-gpus")
    train_gpus = parse_gpus(cfg.training_gpus, "--training-gpus")
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and (samp_gpus or train_gpus or cuda_count > 0))
    if cfg.device == "cpu" and (samp_gpus or train_gpus):
        raise LaunchError("--device cpu with --sampling-gpus/--training-gpus; drop the GPU lists or the --device cpu")
    if use_cuda:
        if cuda_count == 0:
            raise LaunchError("GPUs were asked for but CUDA is not available here; use --device cpu")
        if not samp_gpus:
            samp_gpus = [0]
        if not train_gpus:
            train_gpus = [1] if cuda_count > 1 else [0]
        shared = sorted(set(samp_gpus) & set(train_gpus))
        if shared and (cfg.sampling_gpus or cfg.training_gpus) and not cfg.share_gpus:
            raise LaunchError(f"GPU(s) {','.join(map(str, shared))} in both --sampling-gpus and --training-gpus; "
                              f"give disjoint lists, or add --share-gpus to put a sampler beside learner ranks")
        for g in samp_gpus + train_gpus:
            if g >= cuda_count:
                raise LaunchError(f"GPU {g} does not exist: this machine has {cuda_count} GPU(s) "
                                  f"(0..{cuda_count - 1}); fix --sampling-gpus/--training-gpus")
        n_learn, n_samp = len(train_gpus), len(samp_gpus)
    else:
        n_learn, n_samp = cfg.training_ranks, cfg.num_samplers
        if n_learn < 1 or n_samp < 1:
            raise LaunchError("--training-ranks and --num-samplers must be >= 1")
    if cfg.no_deepspeed and n_learn > 1:
        raise LaunchError("--no-deepspeed runs one learner process; give one training GPU (or --training-ranks 1)")
    common = to_flags(dataclasses.replace(cfg, device="cuda" if use_cuda else "cpu"), CommonConfig)
    base_env = {k: v for k, v in os.environ.items()}
    base_env.update({"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false",
                     "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"})
    # Workers run from the repo root: keep the launch directory importable for the
    # module:function of --reward and --dataset-transform.
    base_env["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH", "")) if p)
    if not use_cuda:
        base_env["CUDA_VISIBLE_DEVICES"] = ""
        # Two cores shared by every process: one thread each keeps them from thrashing.
        base_env.setdefault("OMP_NUM_THREADS", "1")
    specs: list[ProcSpec] = []
    for r in range(n_learn):
        env = dict(base_env, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n_learn),
                   LOCAL_WORLD_SIZE=str(n_learn), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port))
        if use_cuda:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, train_gpus))
        argv = [py, str(ROOT / "training_worker.py"), *common, "--max-steps", str(cfg.max_steps)]
        argv += ["--no-deepspeed"] if cfg.no_deepspeed else []
        argv += (["--gpu-id", str(r)] if use_cuda else []) + learner_flags
        specs.append(ProcSpec(f"learner{r}", argv, env, "learner"))
    for k in range(n_samp):
        env = dict(base_env)
        if use_cuda:
            # The sampler's own GPU first (its device 0), then learner rank 0's GPU, which CUDA
            # IPC weight sync maps (peer access); found there by UUID, not by this numbering.
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, dict.fromkeys([samp_gpus[k], train_gpus[0]])))
        argv = [py, str(ROOT / "sampling_worker.py"), *common, "--sampler-id", str(k),
                "--num-samplers", str(n_samp)] + (["--gpu-id", "0"] if use_cuda else []) + sampler_flags
        specs.append(ProcSpec(f"sampler{k}", argv, env, "sampler"))
    return specs


def check_port(host: str, port: int, flag: str) -> None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            raise LaunchError(f"port {port} on {host} is already in use; stop what holds it or pass {flag} N") from None


def check_resume(cfg: LaunchConfig, learner_flags: list[str]) -> None:
    """A --resume that cannot work is a one-line mistake here, not a learner crash later."""
    spec = ""
    for i, tok in enumerate(learner_flags):
        if tok == "--resume" and i + 1 < len(learner_flags):
            spec = learner_flags[i + 1]
        elif tok.startswith("--resume="):
            spec = tok.partition("=")[2]
    if not spec:
        return
    if spec == "latest" and not cfg.run_dir:
        raise LaunchError("--resume latest needs the --run-dir of the run to resume")
    from grpo.checkpoint import resolve_resume

    try:
        resolve_resume(spec, Path(cfg.run_dir), cfg.max_steps)
    except ValueError as exc:
        raise LaunchError(str(exc)) from None


def parse(argv: list[str] | None) -> tuple[LaunchConfig, list[str], list[str]]:
    parser = build_parser(LaunchConfig, "run_distributed.py",
                          aliases={"sampling_gpus": ["--sampling-gpu"], "training_gpus": ["--training-gpu"]})
    apply_config_file(parser, LaunchConfig, argv)
    ns, rest = parser.parse_known_args(argv)
    if ns.config:
        ns.config = os.path.abspath(ns.config)  # the children get it as --config and read their keys
    cfg = LaunchConfig(**{k: v for k, v in vars(ns).items() if k in _fields(LaunchConfig)})
    try:
        to_s, to_l = split_passthrough(rest)
    except LaunchError as exc:
        parser.error(str(exc))
    if cfg.eval_every > 0 and not cfg.eval_dataset:
        # The learner evaluates its final weights on the samplers' data set.
        i = to_s.index("--dataset") if "--dataset" in to_s else -1
        cfg.eval_dataset = to_s[i + 1] if 0 <= i < len(to_s) - 1 else SamplerConfig.dataset
    return cfg, to_s, to_l


class Supervisor:
    """Owns the child processes: start, watch, report, stop (no orphans)."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.procs: dict[str, tuple[subprocess.Popen, ProcSpec, Path]] = {}

    def start(self, spec: ProcSpec) -> None:
        log_path = self.run_dir / f"{spec.name}.log"
        fh = open(log_path, "ab")
        # Own session per child: a terminal Ctrl+C reaches only us, and we stop children in order.
        p = subprocess.Popen(spec.argv, env=spec.env, stdout=fh, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True, cwd=ROOT,
                             preexec_fn=_die_with_parent)
        fh.close()
        self.procs[spec.name] = (p, spec, log_path)
        # Which pid is which process, for whoever operates the run (and the no-orphan test).
        pids = {n: q.pid for n, (q, _, _) in self.procs.items()}
        (self.run_dir / "pids.json").write_text(json.dumps({"launcher": os.getpid(), **pids}) + "\n")

    def failed(self) -> tuple[str, int] | None:
        for name, (p, _, _) in self.procs.items():
            rc = p.poll()
            if rc not in (None, 0):
                return name, rc
        return None

    def tail(self, name: str, lines: int = 15) -> str:
        path = self.procs[name][2]
        text = path.read_text(errors="replace").splitlines()
        return "\n".join("    " + line for line in text[-lines:])

    def wait_all(self, names: list[str], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for n in names:
            p = self.procs[n][0]
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return False
        return True

    def stop(self, timeout: float) -> None:
        live = [(n, p) for n, (p, _, _) in self.procs.items() if p.poll() is None]
        for _, p in live:
            _signal_group(p, signal.SIGTERM)   # the whole group: helpers a worker spawned stop too
        deadline = time.monotonic() + timeout
        for n, p in live:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"[launcher] {n} did not stop in {timeout:.0f} s; killing it", flush=True)
                _signal_group(p, signal.SIGKILL)
                p.wait()


def _die_with_parent() -> None:
    """In the child: the kernel kills it if the launcher dies (even by SIGKILL): no orphans."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: the launcher's own stop() is the only guard


def describe_exit(rc: int) -> str:
    if rc < 0:
        try:
            return f"was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"failed with exit code {rc}"


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:
        pass


def _status_line(run_dir: Path, seen: int) -> tuple[int, str | None]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return seen, None
    lines = path.read_text().splitlines()
    if len(lines) <= seen:
        return seen, None
    rec = json.loads(lines[-1])
    if rec.get("final"):
        return len(lines), None
    return len(lines), (f"[launcher] step {rec['step']} loss {rec['loss']:.4f} reward {rec['reward_mean']:.3f} "
                        f"acc {rec['accuracy']:.3f} {rec['samples_per_s']:.1f} samples/s "
                        f"samplers at {rec['sampler_versions']} groups {rec['groups']}")


def main(argv: list[str] | None = None) -> int:
    cfg, to_s, to_l = parse(argv)
    if cfg.instances != 1 or cfg.seeds:
        from grpo.instances import run_instances

        return run_instances(cfg, sys.argv[1:] if argv is None else argv)
    try:
        if cfg.device == "cpu":
            cuda_count = 0
        else:
            import torch  # after parsing: --help and flag mistakes stay instant

            cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        from grpo.transport import free_port

        specs = plan(cfg, cuda_count, to_s, to_l, free_port())
        from grpo.reward_funcs import check_sampler_flags  # a bad --reward fails before any model loads

        if samplers_argv := [s.argv[2:] for s in specs if s.role == "sampler"]:
            if problem := check_sampler_flags(samplers_argv[0]):
                raise LaunchError(problem)
        check_resume(cfg, to_l)
        check_port(cfg.host, cfg.data_port, "--data-port")
        check_port(cfg.host, cfg.sync_port, "--sync-port")
        if cfg.data_port == cfg.sync_port:
            raise LaunchError("--data-port and --sync-port are equal; give them different ports")
    except LaunchError as exc:
        print(f"run_distributed.py: error: {exc}", file=sys.stderr)
        return 2
    from grpo.metrics import make_run_dir, save_config

    run_dir = make_run_dir(cfg.run_dir).resolve()
    for spec in specs:
        spec.argv += ["--run-dir", str(run_dir)]
    save_config(run_dir, "launch", cfg)
    sup = Supervisor(run_dir)
    learners = [s for s in specs if s.role == "learner"]
    samplers = [s for s in specs if s.role == "sampler"]
    print(f"[launcher] run dir {run_dir}; {len(learners)} learner rank(s), {len(samplers)} sampler(s); "
          f"logs: {', '.join(s.name + '.log' for s in specs)}", flush=True)
    stopping = {"sig": None}

    def on_signal(signum, _frame):
        stopping["sig"] = signum

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    rc = 1
    try:
        for s in learners:
            sup.start(s)
        ready = run_dir / "learner.ready"
        deadline = time.monotonic() + cfg.ready_timeout_s
        while not ready.exists():
            if (bad := sup.failed()) or stopping["sig"] or time.monotonic() > deadline:
                if bad:
                    print(f"[launcher] {bad[0]} exited with code {bad[1]} before binding its ports:\n"
                          f"{sup.tail(bad[0])}", file=sys.stderr, flush=True)
                elif not stopping["sig"]:
                    print(f"[launcher] the learner did not bind its ports within {cfg.ready_timeout_s:.0f} s; "
                          f"see {run_dir}/learner0.log", file=sys.stderr, flush=True)
                return 1
            time.sleep(0.2)
        print(f"[launcher] learner ready on {cfg.host}:{cfg.data_port}/{cfg.sync_port}; starting samplers",
              flush=True)
        for s in samplers:
            sup.start(s)
        seen = 0
        restarts = {s.name: 0 for s in samplers}
        while True:
            if stopping["sig"]:
                name = signal.Signals(stopping["sig"]).name
                print(f"[launcher] {name}: stopping every process (up to {cfg.stop_timeout_s:.0f} s each, "
                      f"then killed)", flush=True)
                return 128 + stopping["sig"]
            bad = sup.failed()
            if bad and bad[0].startswith("sampler") and restarts[bad[0]] < cfg.restart_samplers:
                restarts[bad[0]] += 1
                print(f"[launcher] {bad[0]} {describe_exit(bad[1])}; restarting it ({restarts[bad[0]]} of "
                      f"{cfg.restart_samplers}). Last lines of {bad[0]}.log:\n{sup.tail(bad[0])}",
                      file=sys.stderr, flush=True)
                sup.start(sup.procs[bad[0]][1])
                continue
            if bad:
                print(f"[launcher] {bad[0]} {describe_exit(bad[1])}; stopping the run. "
                      f"Last lines of {bad[0]}.log:\n{sup.tail(bad[0])}", file=sys.stderr, flush=True)
                return 1
            seen, line = _status_line(run_dir, seen)
            if line:
                print(line, flush=True)
            if sup.procs["learner0"][0].poll() == 0:
                # The learner told the samplers to stop; give everyone time to exit on their own.
                ok = sup.wait_all([s.name for s in specs], cfg.stop_timeout_s)
                summary = run_dir / "summary.json"
                if summary.exists():
                    acc = json.loads(summary.read_text())["groups"]
                    print(f"[launcher] done: {json.dumps(acc)}", flush=True)
                bad = sup.failed()
                if bad:
                    print(f"[launcher] {bad[0]} exited with code {bad[1]}:\n{sup.tail(bad[0])}",
                          file=sys.stderr, flush=True)
                    return 1
                rc = 0 if ok else 1
                if not ok:
                    print("[launcher] some processes did not exit after the learner finished", flush=True)
                return rc
            time.sleep(0.5)
    finally:
        sup.stop(cfg.stop_timeout_s)
