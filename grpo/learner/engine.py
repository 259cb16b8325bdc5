"""The optimizer engine: a DeepSpeed ZeRO-2 engine, or plain PyTorch for --no-deepspeed.

Both expose the same things the learner uses: `module`, `gas` (micro-steps per optimizer
step with fixed micro-batches), `loss_divisor`, `backward(loss)` and `step()`. DeepSpeed divides
each micro-batch loss by `loss_divisor` (gas with fixed micro-batches, 1 with token micro-batches)
and averages gradients over ranks; the plain engine divides by it too, so the learner scales
its loss one way for both.
"""
from __future__ import annotations

import contextlib
import copy
import importlib
import json
import logging
import math
import os
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from grpo.config import DEEPSPEED

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A DeepSpeed config problem; the message is one line with the fix."""


# ----------------------------------------------------------------------------- JIT op build locks
# DeepSpeed builds some ops the first time a process needs them (on CPU: its shared-memory
# communication op, when the process group starts) through torch.utils.cpp_extension, which
# guards each build directory with a "lock" file held open by the builder. A process stopped
# mid-build leaves that file behind, and every later process then sleeps in torch's FileBaton
# forever, saying nothing. Before DeepSpeed starts, the learner looks at those files: one that
# no process holds open is stale and is removed; one held by a live builder is waited for, with
# a log line naming the builder and the file every `note_every_s`, and at most `timeout_s`.


def extension_root() -> Path:
    """Where torch builds JIT extensions for this Python and torch (TORCH_EXTENSIONS_DIR honoured)."""
    from torch.utils.cpp_extension import _get_build_directory  # here: cpp_extension brings setuptools; only the JIT-build lock check needs it

    return Path(_get_build_directory("deepspeed_shm_comm", verbose=False)).parent


def lock_holders(lock: Path) -> list[int]:
    """Pids of the processes that have `lock` open (Linux /proc; an empty list elsewhere)."""
    target, pids = str(lock.resolve()), []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if any(os.readlink(fd) == target for fd in (proc / "fd").iterdir()):
                pids.append(int(proc.name))
        except OSError:
            continue   # gone meanwhile, or not ours to look at
    return pids


SHM_COMM_OP = "deepspeed_shm_comm"   # DeepSpeed's ShareMemCommBuilder.NAME


def init_process_group(device: torch.device, timeout_s: float) -> None:
    """DeepSpeed's process group: nccl on CUDA, gloo on CPU (the rendezvous from the environment)."""
    # `import deepspeed.ops` binds deepspeed as well (whose package imports ops anyway); the start-up
    # line times this import with the process group.
    import deepspeed.ops  # here: DeepSpeed takes seconds to import; a --no-deepspeed learner never needs it

    if device.type != "cuda":
        # DeepSpeed's CPU accelerator JIT-compiles a shared-memory allreduce (deepspeed_shm_comm)
        # when its process group starts: a C++ build of a minute or more on a fresh machine before
        # a CPU run (the tests, the demo) can begin, and again for each new environment. gloo does
        # every collective a CPU learner needs, so the op is marked unavailable and not built.
        deepspeed.ops.__compatible_ops__[SHM_COMM_OP] = False
    deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo",
                               timeout=timedelta(seconds=timeout_s))


def clear_build_locks(root: Path | None = None, timeout_s: float = 600.0, note_every_s: float = 10.0) -> list[Path]:
    """Remove stale build locks under `root` and wait (bounded, logged) for live builds; returns the removed."""
    root = root or extension_root()
    removed: list[Path] = []
    t0 = time.monotonic()
    next_note = t0
    while True:
        live: dict[Path, list[int]] = {}
        for lock in sorted(root.glob("*/lock")):
            holders = lock_holders(lock)
            if holders:
                live[lock] = holders
                continue
            with contextlib.suppress(FileNotFoundError):   # gone meanwhile: its builder finished
                lock.unlink()
                removed.append(lock)
                log.warning("removed a stale build lock %s: no process holds it (a process stopped while "
                            "building that DeepSpeed op); the op is built or loaded again now", lock)
        if not live:
            return removed
        now = time.monotonic()
        lock, holders = next(iter(live.items()))
        if now - t0 > timeout_s:
            raise ConfigError(f"{lock} is still held after {timeout_s:.0f} s by pid(s) "
                              f"{', '.join(map(str, holders))} building a DeepSpeed op; if that process is "
                              f"stuck, stop it (kill {holders[0]}) or remove the file, then start again")
        if now >= next_note:
            for lock, holders in live.items():
                log.info("waiting for pid(s) %s, which hold %s while building a DeepSpeed op (%.0f s so far; "
                         "at most %.0f s)", ", ".join(map(str, holders)), lock, now - t0, timeout_s)
            next_note = now + note_every_s
        time.sleep(0.2)


def load_ds_config(path: str) -> dict:
    """A relative path not found from the working directory is looked up beside the entry scripts
    (the repository root), where the default deepspeed.json lives: training_worker.py started from
    another folder finds it, as run_distributed.py does."""
    p = Path(path)
    if not p.is_absolute() and not p.exists() and (Path(__file__).resolve().parents[2] / p).is_file():
        p = Path(__file__).resolve().parents[2] / p
    try:
        return json.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"DeepSpeed config {path} not found; pass --deepspeed-config PATH") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"DeepSpeed config {path} is not valid JSON ({exc}); fix the file") from None


def _owned_by_flag(value, flag_value, key: str, flag: str, source: str) -> None:
    """A value the program fills from a flag: "auto" (or absent) in the file, or the same value."""
    if value is None or value == "auto":
        return
    try:
        same = float(value) == float(flag_value)
    except (TypeError, ValueError):
        same = False
    if not same:
        raise ConfigError(f'{source}: {key} is {value!r} but {flag} is {flag_value}; the flag owns it: write "auto" '
                          f"there (or pass {flag} {value})")


def resolve_ds_config(raw: dict, world: int, train_batch_size: int, group_size: int,
                      learning_rate: float, cuda: bool, source: str = "deepspeed.json",
                      precision: str = "bf16", token_micro_batches: bool = False) -> tuple[dict, int]:
    """Fill every "auto" value; returns (config for DeepSpeed, global completions per step).

    One owner per setting: the flags own the batch size (--train-batch-size) and the learning
    rate (--learning-rate), so the file says "auto" for them, as Hugging Face's DeepSpeed
    integration does; a number there that contradicts the flag is a ConfigError naming both.
    DeepSpeed owns the rest (micro-batch size, ZeRO settings, clipping, the optimizer's betas).

    Our batch is `train_batch_size` completions per optimizer step, over all ranks. Each
    rank runs exactly `gradient_accumulation_steps` micro-steps (ZeRO-2 reduces gradients
    at every micro-step, so all ranks must take the same number); "auto" picks
    ceil(batch / (micro * world)). DeepSpeed insists batch == micro * gas * world, which
    uneven token-balanced shards do not satisfy, so the copy handed to DeepSpeed carries
    that product: it only feeds DeepSpeed's own bookkeeping, since we pass it the batches.

    token_micro_batches (--micro-batch-tokens): the learner packs each step into as many
    micro-batches as its token budget needs, a number that changes from step to step, so it owns
    the accumulation boundary: managed_gradient_accumulation is false (DeepSpeed's backward then
    only accumulates, and its step() is the boundary); a file that says true contradicts the flag.
    """
    cfg = copy.deepcopy(raw)
    batch = int(train_batch_size)
    _owned_by_flag(cfg.get("train_batch_size"), batch, "train_batch_size", "--train-batch-size", source)
    if batch <= 0 or batch % group_size:
        raise ConfigError(f"--train-batch-size {batch} is not a positive multiple of --num-generations {group_size}; "
                          f"a step trains whole groups: use a multiple of {group_size}")
    micro = cfg.get("train_micro_batch_size_per_gpu", "auto")
    micro = max(1, math.ceil(batch / world)) if micro == "auto" else int(micro)
    gas = cfg.get("gradient_accumulation_steps", "auto")
    gas = max(1, math.ceil(batch / (micro * world))) if gas == "auto" else int(gas)
    cfg["train_batch_size"] = micro * gas * world
    cfg["train_micro_batch_size_per_gpu"] = micro
    cfg["gradient_accumulation_steps"] = gas
    # --precision (resolve_precision's answer) owns bf16.enabled: "auto" in the file, or the same.
    # autocast and fp32 give DeepSpeed float32 weights; the learner applies torch.autocast itself,
    # since it calls the module, not the engine's forward.
    bf16 = cfg.setdefault("bf16", {})
    want = precision == "bf16" and cuda
    if cuda and bf16.get("enabled", "auto") not in ("auto", want):
        raise ConfigError(f'{source}: bf16.enabled is {bf16["enabled"]} but --precision resolves to {precision}; '
                          f'the flag owns it: write "auto" there (or pass --precision '
                          f'{"bf16" if bf16["enabled"] else "autocast"})')
    bf16["enabled"] = want   # on CPU always off: gloo + fp32
    opt = cfg.setdefault("optimizer", {"type": "AdamW", "params": {}})
    params = opt.setdefault("params", {})
    _owned_by_flag(params.get("lr"), learning_rate, "optimizer.params.lr", "--learning-rate", source)
    params["lr"] = learning_rate
    for key, value in list(params.items()):
        if value == "auto":
            raise ConfigError(f'{source}: optimizer.params.{key} is "auto" but the program does not fill it; '
                              f"set a value")
    if token_micro_batches:
        if cfg.get("managed_gradient_accumulation", "auto") not in ("auto", False):
            raise ConfigError(f"{source}: managed_gradient_accumulation is true but --micro-batch-tokens packs each "
                              f"step into its own number of micro-batches, which needs it false: write \"auto\" "
                              f"there (or pass --micro-batch-tokens -1)")
        cfg["managed_gradient_accumulation"] = False
    elif cfg.get("managed_gradient_accumulation") == "auto":
        cfg.pop("managed_gradient_accumulation")
    if cfg.get("gradient_clipping") == "auto":
        cfg["gradient_clipping"] = DEEPSPEED["gradient_clipping"]
    zero = cfg.setdefault("zero_optimization", {"stage": DEEPSPEED["zero_optimization"]["stage"]})
    if zero.get("stage") == "auto":
        zero["stage"] = DEEPSPEED["zero_optimization"]["stage"]
    return cfg, batch


def manages_accumulation(ds_config: dict) -> bool:
    """Whether DeepSpeed manages gradient accumulation (its default: gas micro-steps a step, each
    loss divided by gas, the update inside the last backward) or the learner owns the boundary
    (token micro-batches: any number of micro-steps, losses as given, the update at step()).
    Both engines divide a micro-step's loss by gas in the first case and by 1 in the second."""
    return ds_config.get("managed_gradient_accumulation", True) is not False


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Parameters the optimizer owns: with LoRA only the adapters, so frozen weights get no state."""
    return [p for p in model.parameters() if p.requires_grad]


class CommunicatorWarmup(threading.Thread):
    """The default process group's first collective (a one-element all-reduce on `device`), on a
    thread of its own, so that the communicator is made while the main thread loads the model (the
    tokenizer, the weights, CUDA's first call: transformers is imported already, with the role's
    modules, grpo.workers). NCCL makes its communicator at a group's first collective, which is
    otherwise the DeepSpeed engine's first parameter broadcast, on the learner's path to its first
    step; the collective's call releases the GIL, so the two overlap. `wait` joins it (bounded by
    the group's own timeout) and re-raises what it raised. Every rank runs it; it returns when all
    ranks have reached it, which the engine's broadcast would wait for anyway."""

    def __init__(self, device: torch.device, timeout_s: float):
        super().__init__(name="communicator-warmup", daemon=True)
        self.device, self.timeout_s = device, timeout_s
        self.error: BaseException | None = None
        self.seconds = 0.0
        self.start()

    def run(self) -> None:
        t = time.perf_counter()
        try:
            dist.all_reduce(torch.zeros(1, device=self.device))
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread by wait()
            self.error = exc
        self.seconds = time.perf_counter() - t

    def wait(self) -> float:
        """Seconds the collective took (it ran beside the model's loading)."""
        self.join(self.timeout_s + 5)
        if self.is_alive():
            raise RuntimeError(f"the process group's first collective did not finish within {self.timeout_s:g} s "
                               "(--dist-timeout-s): is every learner rank running?")
        if self.error is not None:
            raise self.error
        return self.seconds


MUON_MODULE = "deepspeed.runtime.zero.muon.muon_optimizer"


def import_muon_uncompiled(optimizer_type: str) -> bool:
    """Import DeepSpeed's Muon module with torch.compile off, unless the run's optimizer is Muon;
    True when this call imported it.

    DeepSpeed (0.19) imports that module in every ZeRO engine, whatever the optimizer: when the
    engine starts (to check that the optimizer is one ZeRO supports) and again in the first
    gradient reduction. The module decorates three functions with torch.compile at import, and
    torch.compile imports torch's inductor stack to set up its backend, on the learner's path to
    its first step, for kernels only Muon uses (docs/benchmarks.md, "Start-up: what moved it").
    Imported here first with
    TORCHDYNAMO_DISABLE=1 (torch.compile's own switch, read when it is called), those decorators
    return the plain functions; DeepSpeed's later imports find the module loaded. A Muon run
    imports it DeepSpeed's way, compiled."""
    if optimizer_type.lower() == "muon" or MUON_MODULE in sys.modules:
        return False
    saved = os.environ.get("TORCHDYNAMO_DISABLE")
    # The learner has no other thread yet (its weight publisher starts after the engine, and the
    # communicator warm-up has been joined), so no one else sees the switch while it is set.
    os.environ["TORCHDYNAMO_DISABLE"] = "1"
    try:
        importlib.import_module(MUON_MODULE)
    except ImportError:   # a DeepSpeed without Muon: nothing to avoid
        return False
    finally:
        if saved is None:
            os.environ.pop("TORCHDYNAMO_DISABLE", None)
        else:
            os.environ["TORCHDYNAMO_DISABLE"] = saved
    return True


class DeepSpeedEngine:
    def __init__(self, model: torch.nn.Module, ds_config: dict):
        import deepspeed  # here: DeepSpeed takes seconds to import; a --no-deepspeed learner never needs it

        import_muon_uncompiled(str(ds_config.get("optimizer", {}).get("type", "")))
        self._engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=trainable(model),
                                                     config=ds_config)
        self.gas = int(ds_config["gradient_accumulation_steps"])
        self.managed = manages_accumulation(ds_config)
        self.loss_divisor = self.gas if self.managed else 1
        self.device = self._engine.device
        log.info("DeepSpeed ZeRO stage %d engine: micro %d x gas %d, bf16=%s, optimizer %s",
                 self._engine.zero_optimization_stage(), ds_config["train_micro_batch_size_per_gpu"],
                 self.gas, ds_config["bf16"]["enabled"], ds_config["optimizer"]["type"])

    @property
    def module(self) -> torch.nn.Module:
        return self._engine.module

    def backward(self, loss: torch.Tensor) -> None:
        if not self.managed:
            self._engine.backward(loss, scale_wrt_gas=False)   # accumulates; ZeRO-2 reduces over ranks
            return
        self._engine.backward(loss)   # divides by gas; reduces (ZeRO-2) over ranks
        self._engine.step()           # a no-op except at the accumulation boundary

    def step(self) -> None:
        # Managed: DeepSpeed already stepped inside the last micro-batch's backward().
        if not self.managed:
            self._engine.step()

    @property
    def updates(self) -> int:
        """Optimizer updates so far (DeepSpeed counts skipped overflow steps too)."""
        return int(self._engine.global_steps)

    def grad_norm(self) -> float:
        norm = self._engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")


class TorchEngine:
    """One process, plain AdamW: the same call pattern as DeepSpeedEngine."""

    def __init__(self, model: torch.nn.Module, ds_config: dict, device: torch.device):
        params = ds_config["optimizer"]["params"]
        self.module = model
        self.device = device
        self.gas = int(ds_config["gradient_accumulation_steps"])
        self.loss_divisor = self.gas if manages_accumulation(ds_config) else 1
        self.clip = float(ds_config.get("gradient_clipping") or 0.0)
        self.opt = torch.optim.AdamW(trainable(model), lr=params["lr"],
                                     betas=tuple(params.get("betas", (0.9, 0.999))),
                                     eps=params.get("eps", 1e-8), weight_decay=params.get("weight_decay", 0.0))
        self._norm = float("nan")
        self.skipped_steps = 0
        self.updates = 0   # optimizer updates so far, skipped ones included (as DeepSpeed counts)
        log.info("plain PyTorch engine (--no-deepspeed): AdamW lr %g, gas %d", params["lr"], self.gas)

    def backward(self, loss: torch.Tensor) -> None:
        (loss / self.loss_divisor).backward()

    def step(self) -> None:
        # The norm is taken even without clipping (max_norm inf scales by 1): a non-finite one
        # skips the step, as DeepSpeed's bf16 optimizer does (bf16.check_grad_overflow), instead of
        # writing NaN into every weight and, through weight sync, into every sampler.
        self._norm = float(torch.nn.utils.clip_grad_norm_(self.module.parameters(),
                                                          self.clip if self.clip > 0 else math.inf))
        self.updates += 1
        if math.isfinite(self._norm):
            self.opt.step()
        else:
            self.skipped_steps += 1
            log.warning("optimizer step skipped: the gradient norm is %s (%d skipped so far); the weights are "
                        "unchanged", self._norm, self.skipped_steps)
        self.opt.zero_grad(set_to_none=True)

    def grad_norm(self) -> float:
        return self._norm
