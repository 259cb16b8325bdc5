"""Entry points behind sampling_worker.py and training_worker.py.

Arguments are parsed before anything heavy is imported, so `--help` and flag mistakes are
instant. A user mistake (bad device, busy port, missing model or data set, bad config)
ends with one line naming the problem and the fix and exit code 2; only real bugs show a
traceback.
"""
from __future__ import annotations

import json
import logging
import os
import random
import sys
import time

from grpo.config import LearnerConfig, SamplerConfig, resolve_precision, use_allocator_default
from grpo.config.constants import NO_CUDA
from grpo.data.rewards import RewardBroken
from grpo.data.sources import DatasetUnavailable, local_file
from grpo.flags import parse_config
from grpo.launch.probe import cuda_driver
from grpo.model.gguf.header import ModelUnavailable
from grpo.launch.runplan import PLANNED_ENV
from grpo.obs.rundir import create_run_dir, freeze_for_exit, provenance, remove_created, save_config, setup_logging
from grpo.obs.stages import mark as mark_stage
from grpo.weights.methods import check_method
from grpo.wire.ports import PortInUse

USER_ERROR_EXIT = 2
# The mistakes a user can fix, said in one line (a ConfigError of the learner's engine is a ValueError)
USER_ERRORS = (DatasetUnavailable, ModelUnavailable, PortInUse, ValueError)


def _fail(prog: str, exc: BaseException, made: tuple | None = None) -> int:
    """One line and exit code 2; `made`: the run folder and the outermost folder this process created
    (grpo.obs.rundir.create_run_dir), removed again, runs/ included when this made it (a refused start
    leaves nothing behind; a folder that existed before is left as it was)."""
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    print(f"{prog}: error: {msg}", file=sys.stderr)
    if made:
        logging.shutdown()   # this process's log file in it is closed first
        remove_created(*made)
    return USER_ERROR_EXIT


def _gpu_env(device: str, gpu_id: int) -> None:
    """Fail fast on --gpu-id without CUDA, before torch (slow) or any model loads: the CUDA driver
    is asked directly (grpo.launch.probe.cuda_driver, as the launcher does), and torch's own check
    (pick_device) still follows for what the driver allows."""
    if device == "cpu" and gpu_id >= 0:
        raise ValueError("--gpu-id and --device cpu contradict each other; drop one of them")
    if device == "cuda" or (device == "auto" and gpu_id >= 0):
        driver = cuda_driver()
        if driver is None or driver[1] == 0:
            raise ValueError(NO_CUDA)


def _cpu_weight_sync(cfg: LearnerConfig) -> None:
    """A CPU learner's --precision and --weight-sync, checked before torch loads by the rules the
    learner applies later (grpo.learner.setup.place), as the launcher checks them (grpo.launch.nodes)."""
    lora = bool(cfg.training.lora_r)
    precision = resolve_precision(cfg.training.precision, False, lora, not cfg.training.no_deepspeed)
    check_method(cfg.weight_sync.weight_sync, "cpu", lora, precision == "bf16")


def _allocator(device: str) -> None:
    """GPU workers: expandable segments unless the user set the allocator's settings
    (grpo.config.use_allocator_default); before torch loads, which reads them once. The
    setting is logged with the start-up's cache release (grpo.obs.gpu.release_cached), on CUDA only."""
    if device == "cpu":
        return

    use_allocator_default(os.environ)


def seed_all(seed: int) -> None:
    import numpy as np   # here: a role's seed, once it is starting (a flag mistake is said before torch loads)
    import torch   # here: as numpy

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def sampler_main(argv: list[str] | None = None) -> int:
    """The sampler process; however it ends (done, stopped, a user mistake), its exit skips the
    last collection (freeze_for_exit): by then every file it writes is written and closed, and
    Sampler.run has closed its sockets (the data socket's linger flushes what it still holds)."""
    try:
        return _sampler_main(argv)
    finally:
        freeze_for_exit()


def planned() -> bool:
    """Whether the launcher started this process from its plan, having checked its flags already
    (grpo.launch.runplan.PLANNED_ENV): CUDA there, the device and GPU agreeing, the sampler's id and
    data set. Started by hand, the worker checks them itself."""
    return os.environ.get(PLANNED_ENV) == "1"


def _start(prog: str, cfg, check, role):
    """A worker's start-up, one for both roles: `check(cfg)` is the role's own checks that need no
    torch (after the device's, which a planned process skips; a mistake raises ValueError or
    DatasetUnavailable) and names the process: (its name, its seed, the name its config is saved
    under or None); then the run folder, logging and the allocator; `role()` imports the role's
    class, which brings torch, transformers and the model code: seconds, timed and handed to the
    role, whose start-up line says them apart from CUDA's init and the model's load; then the seed,
    the config, and the role, built. Returns (the role, the run folder), or the exit code of a
    refused start (_fail's line)."""
    try:
        if not planned():
            _gpu_env(cfg.run.device, cfg.run.gpu_id)
        name, seed, save_as = check(cfg)
    except (ValueError, DatasetUnavailable) as exc:
        return _fail(prog, exc)
    made = None
    try:
        run_dir, top = create_run_dir(cfg.run.run_dir)
        made = (run_dir, top)
        cfg.run.run_dir = str(run_dir)
        setup_logging(name, cfg.observability.log_file)
        mark_stage(run_dir, name, "started")
        _allocator(cfg.run.device)
        t_import = time.perf_counter()
        role_class = role()
        import_s = time.perf_counter() - t_import
        seed_all(seed)
        if save_as:
            save_config(run_dir, save_as, cfg)
        return role_class(cfg, import_s), run_dir
    except USER_ERRORS as exc:
        return _fail(prog, exc, made)


def _sampler_checks(cfg: SamplerConfig) -> tuple[str, int, str]:
    if not planned():   # the launcher's plan numbers the samplers and checked the data set's path
        local_file(cfg.data.dataset)   # a mistyped path; a hub id is fetched later
        if not 0 <= cfg.run.sampler_id < cfg.run.num_samplers:
            raise ValueError(f"--sampler-id {cfg.run.sampler_id} must be in 0..{cfg.run.num_samplers - 1} (--num-samplers)")
    return f"sampler{cfg.run.sampler_id}", cfg.run.seed + cfg.run.sampler_id, f"sampler{cfg.run.sampler_id}"


def _sampler_role():
    from grpo.sampler.loop import Sampler   # here: the sampler's role (torch, transformers, the model) only in its process, timed by _start

    return Sampler


def _sampler_main(argv: list[str] | None = None) -> int:
    prog = "sampling_worker.py"
    cfg = parse_config(SamplerConfig, argv, prog)
    started = _start(prog, cfg, _sampler_checks, _sampler_role)
    if isinstance(started, int):
        return started
    sampler, run_dir = started
    from grpo.sampler.weights_client import AnswersRejected, NoFirstAnswer, RunMismatch   # here: as Sampler

    try:
        result = sampler.run()
    except (RunMismatch, NoFirstAnswer, AnswersRejected, RewardBroken) as exc:
        return _fail(prog, exc)
    (run_dir / f"sampler{cfg.run.sampler_id}_result.json").write_text(json.dumps({**result, **provenance()}, indent=2,
                                                                             default=str))
    return 0


def _learner_checks(cfg: LearnerConfig) -> tuple[str, int, str | None]:
    if cfg.run.device == "cpu":
        _cpu_weight_sync(cfg)
    rank = int(os.environ.get("RANK", "0"))   # set by the launcher (or torchrun); rank 0 saves the config
    return f"learner{rank}", cfg.run.seed, "learner" if rank == 0 else None


def _learner_role():
    from grpo.learner.loop import Learner   # here: the learner's role (torch, transformers, the model) only in its process, timed by _start

    return Learner


def learner_main(argv: list[str] | None = None) -> int:
    prog = "training_worker.py"
    cfg = parse_config(LearnerConfig, argv, prog)
    started = _start(prog, cfg, _learner_checks, _learner_role)
    if isinstance(started, int):
        return started
    learner, _ = started
    rank = learner.rank   # the RANK _learner_checks read (grpo.learner.setup.place reads it too)
    learner.run()
    # Every rank's last collective is behind it (rank 0's evaluation and shutdown use none), so
    # each tears its process group down now, itself: left to interpreter exit, gloo's worker
    # threads can outlive Python and abort the process ("terminate called without an active
    # exception", SIGABRT; seen on learner rank 1 of the 2-rank CPU e2e run).
    import torch.distributed as dist   # here: as Learner

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    # Everything the run leaves is written and closed above (summary, metrics, checkpoints, logs;
    # the sockets close with linger 0).
    freeze_for_exit()
    if rank > 0:
        # A rank other than 0 has nothing left to write after its last collective, so it skips the
        # interpreter's finalization, which can abort the process (SIGABRT, "terminate called
        # without an active exception") when a process group some object still references is freed
        # with its gloo threads unjoined.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    # python -m grpo.workers sampler|learner FLAGS: the launcher's way to start a worker where the
    # checkout's root scripts are not installed (grpo.launch.plan.worker_command)
    role = sys.argv.pop(1) if len(sys.argv) > 1 else ""
    if role not in ("sampler", "learner"):
        print("usage: python -m grpo.workers sampler|learner [flags]", file=sys.stderr)
        sys.exit(USER_ERROR_EXIT)
    sys.exit(sampler_main() if role == "sampler" else learner_main())

