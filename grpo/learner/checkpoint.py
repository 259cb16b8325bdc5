"""Learner checkpoints: save every --save-every steps and at the end, resume with --resume.

Layout of one checkpoint, `<run_dir>/checkpoints/step_N/`:
  deepspeed/        engine.save_checkpoint (every rank writes its ZeRO-2 optimizer shard)
  torch_state.safetensors + torch_optimizer.json
                    instead of deepspeed/ with --no-deepspeed: model and AdamW state tensors,
                    and the optimizer's param groups and state layout
  hf/               the policy in Hugging Face save_pretrained format, with the tokenizer
                    (loadable by transformers.AutoModelForCausalLM and by vLLM)
  rng_rank{r}.json  python, numpy, torch (and CUDA) RNG states of learner rank r
  trainer_state.json  step, policy version, per-sampler position, counts; written LAST by
                    rank 0 after every rank finished, so its presence marks a complete checkpoint

The learner's step and the policy version are equal (one optimizer step = one version), so a
resumed learner continues at step N+1 and publishes version N at start; samplers, restarted or
still running, get those weights through their ordinary weights request.

Data position: the samplers own prompt order (each sampler's PromptStream is seeded by
--seed + sampler id). The learner records what the samplers last reported (rounds done,
groups sent, version) under "samplers" in trainer_state.json; restarted samplers begin their
stream again from its start.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import random
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

# what a --resume value names (torch-free, for the launcher); re-exported for the learner
from grpo.learner.resume import STATE_FILE, ResumeError, checkpoints_root, list_checkpoints, resolve_resume  # noqa: F401

log = logging.getLogger(__name__)


def _is_deepspeed(engine) -> bool:
    return hasattr(engine, "_engine")


# Our own files hold no pickles (the code base never unpickles): RNG states and optimizer
# layout go to JSON, tensors to safetensors. DeepSpeed's own checkpoint format is its business.
def rng_state() -> dict:
    version, mt, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"python": [version, list(mt), gauss], "numpy": [name, keys.tolist(), pos, has_gauss, cached],
             "torch": torch.get_rng_state().tolist()}
    if torch.cuda.is_available():
        state["cuda"] = [t.tolist() for t in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict) -> None:
    version, mt, gauss = state["python"]
    random.setstate((version, tuple(mt), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.tensor(t, dtype=torch.uint8) for t in state["cuda"]])


def _save_torch_state(engine, step_dir: Path) -> None:
    """--no-deepspeed: model and AdamW tensors as safetensors, the rest of the optimizer as JSON."""
    opt = engine.opt.state_dict()
    tensors = {f"model.{k}": v.detach().contiguous() for k, v in engine.module.state_dict().items()}
    layout: dict[str, dict[str, str]] = {}
    for idx, per_param in opt["state"].items():
        layout[str(idx)] = {}
        for name, value in per_param.items():
            tensors[f"opt.{idx}.{name}"] = value.detach().contiguous()
            layout[str(idx)][name] = str(value.dtype)
    # Tied weights share storage; safetensors wants each stored once, so clone the aliases.
    seen: set[int] = set()
    for k, v in tensors.items():
        if v.data_ptr() in seen:
            tensors[k] = v.clone()
        seen.add(v.data_ptr())
    save_file(tensors, str(step_dir / "torch_state.safetensors"))
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in opt["param_groups"]]
    (step_dir / "torch_optimizer.json").write_text(json.dumps({"param_groups": groups, "state": layout}) + "\n")


def _load_torch_state(engine, step_dir: Path) -> None:
    tensors = load_file(str(step_dir / "torch_state.safetensors"), device=str(engine.device))
    meta = json.loads((step_dir / "torch_optimizer.json").read_text())
    engine.module.load_state_dict({k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")})
    state = {int(idx): {name: tensors[f"opt.{idx}.{name}"] for name in names}
             for idx, names in meta["state"].items()}
    groups = [{k: (tuple(v) if k == "betas" else v) for k, v in g.items()} for g in meta["param_groups"]]
    engine.opt.load_state_dict({"state": state, "param_groups": groups})


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def save_checkpoint(engine, tokenizer, step_dir: Path, state: dict, rank: int) -> dict:
    """Write one checkpoint; every learner rank calls this (DeepSpeed needs all of them).

    Returns {"path", "seconds", "bytes"} (bytes on rank 0 only).
    """
    t0 = time.perf_counter()
    step_dir = Path(step_dir)
    if rank == 0 and step_dir.exists():
        shutil.rmtree(step_dir)   # a half-written leftover of a crash at this very step
    _barrier()
    step_dir.mkdir(parents=True, exist_ok=True)
    if _is_deepspeed(engine):
        engine._engine.save_checkpoint(str(step_dir / "deepspeed"), tag="state")
    elif rank == 0:
        _save_torch_state(engine, step_dir)
    (step_dir / f"rng_rank{rank}.json").write_text(json.dumps(rng_state()) + "\n")
    if rank == 0:
        _save_hf(engine.module, tokenizer, step_dir / "hf")
    _barrier()   # every rank's shard is on disk before the checkpoint is marked complete
    out = {"path": str(step_dir), "seconds": 0.0, "bytes": 0}
    if rank == 0:
        full = dict(state, saved_at=time.time(), engine="deepspeed" if _is_deepspeed(engine) else "torch")
        tmp = step_dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(full, indent=2, default=str) + "\n")
        tmp.rename(step_dir / STATE_FILE)   # atomic: a crash leaves no half state file
        out["bytes"] = dir_size(step_dir)
    out["seconds"] = time.perf_counter() - t0
    return out


@contextlib.contextmanager
def _no_deepspeed_import():
    """save_pretrained unwraps the module through accelerate, which imports DeepSpeed (seconds of
    CPU) only to add DeepSpeedEngine to an isinstance check. In a process that never imported
    DeepSpeed (--no-deepspeed) no DeepSpeedEngine exists, so the check is told DeepSpeed is absent
    and the save skips the import; every other unwrap (compiled, DDP, FSDP) is as before."""
    if "deepspeed" in sys.modules:
        yield
        return
    try:
        from accelerate.utils import other  # here: a save must work without accelerate (the except)
    except ImportError:   # no accelerate: transformers unwraps on its own, without DeepSpeed
        yield
        return
    if not hasattr(other, "is_deepspeed_available"):
        yield
        return
    asked, other.is_deepspeed_available = other.is_deepspeed_available, lambda: False
    try:
        yield
    finally:
        other.is_deepspeed_available = asked


def _save_hf(module: torch.nn.Module, tokenizer, dest: Path, state_dict: dict | None = None) -> None:
    cfg = module.config
    use_cache, random_init = cfg.use_cache, getattr(cfg, "grpo_random_init", None)
    cfg.use_cache = True   # the learner turns the KV cache off for training; inference wants it
    if random_init is not None:
        del cfg.grpo_random_init   # these are trained weights now: load them, do not redraw
    try:
        with _no_deepspeed_import():
            module.save_pretrained(dest, state_dict=state_dict, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(dest)
    finally:
        cfg.use_cache = use_cache
        if random_init is not None:
            cfg.grpo_random_init = random_init


def parse_save_schedule(spec: str) -> list[tuple[float, int | None]]:
    """--save-weights-schedule '15x8,30' -> [(15.0, 8), (30.0, None)]: (period in seconds, how many
    times; None: to the end). Every item but the last has a count and the last has none."""
    items = [s.strip() for s in spec.split(",")]
    out: list[tuple[float, int | None]] = []
    for i, item in enumerate(items):
        period, sep, count = item.partition("x")
        try:
            p, n = float(period), (int(count) if sep else None)
        except ValueError:
            raise ValueError(f"--save-weights-schedule {spec!r}: {item!r} is neither P nor PxN "
                             f"(every P seconds, N times), e.g. '15x8,30'") from None
        if not (math.isfinite(p) and p > 0) or (n is not None and n < 1):
            raise ValueError(f"--save-weights-schedule {spec!r}: {item!r} needs a period > 0 and a count >= 1")
        if (n is None) != (i == len(items) - 1):
            raise ValueError(f"--save-weights-schedule {spec!r}: every item but the last needs its count (PxN) and "
                             f"the last has none (it repeats to the end of the run), e.g. '15x8,30'")
        out.append((p, n))
    return out


def next_save_mark(schedule: list[tuple[float, int | None]], elapsed: float) -> float:
    """The schedule's first mark strictly after `elapsed` seconds (its first mark for 0)."""
    start = 0.0
    for period, count in schedule:
        end = math.inf if count is None else start + count * period
        if elapsed < end:
            k = max(math.floor((elapsed - start) / period) + 1, 1)
            while start + k * period <= elapsed:   # float rounding of the division, never by more than one
                k += 1
            return start + k * period
        start = end
    raise AssertionError("a parsed schedule ends with an item repeated to the end of the run")


class TimedWeights:
    """--save-weights-every-s: the policy's weights alone, every N seconds of wall time, for curves of
    accuracy against time (bench/benchmark.py scores each one afterwards, so no evaluation
    runs inside the timed run). `root/step_N/` (the learner's root: <run_dir>/weights) holds
    save_pretrained's files and weights.json {step, wall_time (time.time() when the save ended),
    seconds (since `t0`)}. bench/trl_grpo.py saves TRL's policy through this class too.
    Rank 0 saves alone: under ZeRO-2 every rank holds the whole module. A save takes the time of
    writing the module (about 0.3 s for 135M bf16 parameters); the other ranks wait for it at the
    next step's collectives, and the time counts in the run's clock as it would for a user.
    `schedule` (--save-weights-schedule, e.g. '15x8,30'): the marks follow its periods instead of
    every_s alone; every_s > 0 still turns the saves on."""

    def __init__(self, root: Path, every_s: float, t0: float,
                 schedule: str | list[tuple[float, int | None]] = ""):
        self.root, self.every_s, self.t0 = Path(root), every_s, t0
        # a spec ('15x8,30') or one parse_save_schedule made already (bench/trl_grpo.py parses its flag)
        self.schedule = (parse_save_schedule(schedule) if isinstance(schedule, str) else list(schedule)) \
            if schedule else [(every_s, None)]
        self.next_s = next_save_mark(self.schedule, 0.0) if every_s > 0 else math.inf
        self.saved: list[dict] = []

    def due(self, now: float, last: bool) -> bool:
        return self.every_s > 0 and (last or now - self.t0 >= self.next_s)

    def save(self, module: torch.nn.Module, tokenizer, step: int, dtype: torch.dtype | None = None) -> dict:
        """Save unless this step already is (a run's last step can be due twice); `dtype`: cast the
        tensors on the way (TRL's fp32 policy is saved in bf16, as ours)."""
        if self.saved and self.saved[-1]["step"] == step:
            return self.saved[-1]
        dest = self.root / f"step_{step}"
        state = {k: v.detach().to(dtype) for k, v in module.state_dict().items()} if dtype else None
        _save_hf(module, tokenizer, dest, state)
        now = time.time()
        rec = {"step": step, "wall_time": now, "seconds": now - self.t0}
        (dest / "weights.json").write_text(json.dumps(rec) + "\n")   # last: its presence marks a whole save
        # The next mark is the first one still ahead: a save that overran a mark (a slow step)
        # does not queue catch-up saves.
        if self.every_s > 0:
            self.next_s = next_save_mark(self.schedule, now - self.t0)
        self.saved.append(rec)
        return rec


def load_checkpoint(engine, step_dir: Path, rank: int, world: int) -> dict:
    """Restore weights, optimizer state and this rank's RNG; returns trainer_state.json."""
    step_dir = Path(step_dir)
    state = json.loads((step_dir / STATE_FILE).read_text())
    kind = "deepspeed" if _is_deepspeed(engine) else "torch"
    if state.get("engine") != kind:
        flag = "drop --no-deepspeed" if state.get("engine") == "deepspeed" else "add --no-deepspeed"
        raise ResumeError(f"checkpoint {step_dir} was written by the {state.get('engine')} engine; {flag} to resume it")
    if kind == "deepspeed":
        if state.get("world_size", world) != world:
            # ZeRO-2 shards the optimizer state by rank: a different rank count cannot load it as is.
            raise ResumeError(f"checkpoint {step_dir} has {state.get('world_size')} learner ranks, this run {world}; "
                              f"resume with the same number of training GPUs/ranks")
        path, _ = engine._engine.load_checkpoint(str(step_dir / "deepspeed"), tag="state",
                                                 load_optimizer_states=True, load_lr_scheduler_states=True)
        if path is None:
            raise ResumeError(f"DeepSpeed could not load {step_dir / 'deepspeed'}; the checkpoint is incomplete")
    else:
        _load_torch_state(engine, step_dir)
    rng = step_dir / f"rng_rank{rank}.json"
    if rng.is_file():
        set_rng_state(json.loads(rng.read_text()))
    return state


def prune(root: Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` complete checkpoints (keep <= 0: keep all)."""
    if keep <= 0:
        return []
    old = [p for _, p in list_checkpoints(root)[:-keep]]
    for p in old:
        shutil.rmtree(p, ignore_errors=True)
    return old


class Checkpointer:
    """The learner's side: when to save, what state to record, pruning, resume."""

    def __init__(self, run_dir: Path, save_every: int, keep: int, rank: int, world: int):
        self.root = checkpoints_root(run_dir)
        self.save_every, self.keep, self.rank, self.world = save_every, keep, rank, world
        self.last_saved = -1

    def due(self, step: int, last: bool) -> bool:
        if step == self.last_saved or step <= 0:
            return False
        return last or (self.save_every > 0 and step % self.save_every == 0)

    def save(self, engine, tokenizer, step: int, extra: dict) -> dict:
        state = {"step": step, "policy_version": step, "world_size": self.world, **extra}
        out = save_checkpoint(engine, tokenizer, self.root / f"step_{step}", state, self.rank)
        self.last_saved = step
        if self.rank == 0:
            removed = prune(self.root, self.keep)
            log.info("checkpoint step %d saved to %s in %.2f s (%.1f MB)%s", step, out["path"], out["seconds"],
                     out["bytes"] / 1e6, f"; removed {[p.name for p in removed]}" if removed else "")
        return out
