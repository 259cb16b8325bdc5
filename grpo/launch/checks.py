"""What the launcher checks before anything starts, each a one-line mistake here rather than a
worker's failure after the run folder exists: the model, --resume, the sampler's --reward,
--dataset-transform and data set, its rg: tasks (on a thread beside the start-up: reasoning-gym's
import is slow), and the workers' bytecode. Torch-free, as the rest of the launch plan."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from grpo.config import SamplerConfig
from grpo.data import tasks
from grpo.data.formats import load_transform
from grpo.data.plugins import PluginError
from grpo.data.rewards import RewardError, reward_set_from_config
from grpo.data.sources import DatasetUnavailable, load_problems, local_file
from grpo.launch import probe
from grpo.launch.plan import LaunchError
from grpo.launch.runplan import RunPlan
from grpo.learner.resume import resolve_resume
from grpo.model.gguf.header import ModelUnavailable, gguf_model_file
from grpo.model.hub import check_hub_model
from grpo.rules.screening import screen_problem
from grpo.rules.tensor_parallel import model_problem


def check_resume(rp: RunPlan) -> None:
    """A --resume that cannot work is a one-line mistake here, not a learner crash later."""
    spec = rp.learner.checkpoints.resume
    if not spec:
        return
    if spec == "latest" and not rp.launch.run.run_dir:
        raise LaunchError("--resume latest needs the --run-dir of the run to resume")
    try:
        resolve_resume(spec, Path(rp.launch.run.run_dir), rp.launch.training.max_steps)
    except ValueError as exc:
        raise LaunchError(str(exc)) from None


def check_tensor_parallel_model(rp: RunPlan) -> None:
    """A model vLLM cannot split over a sampler's GPUs (grpo.rules.tensor_parallel.model_problem) is a
    one-line mistake here, read from its config as the memory plan reads it, not vLLM's refusal once
    the sampler has loaded; a model whose config is not here yet is left to vLLM."""
    tp = rp.sampler.rollout.vllm_tensor_parallel_size
    if tp == 1:
        return
    shape, _ = probe.read_shape(rp.launch.run.model)
    if shape is not None and (problem := model_problem(tp, shape.heads, shape.kv_heads, shape.intermediate)):
        raise LaunchError(problem)


def check_model(model: str) -> None:
    """A --model path that is neither a model folder nor a GGUF file, or a hub id that can be neither
    fetched nor read from the cache, is a one-line mistake here, before any run folder or worker exists
    (grpo.model.gguf.header.gguf_model_file and grpo.model.hub.check_hub_model: the workers' own checks,
    torch-free)."""
    if model in probe.BUILT_FOLDERS:
        return

    try:
        hub_id = gguf_model_file(model) is None and not Path(model).expanduser().is_dir()
        # a hub id: the workers' check (grpo.model.zoo.resolve_model) here first, so a hub that does
        # not answer is one line now; when it turns offline mode on for a cached copy, the workers
        # inherit HF_HUB_OFFLINE=1 (the plan copies this environment) and load it at once
        if hub_id and (note := check_hub_model(model)):
            print(f"run_distributed.py: {note}", file=sys.stderr)
    except ModelUnavailable as exc:
        raise LaunchError(str(exc)) from None


def sampler_problem(cfg: SamplerConfig) -> str | None:
    """The one-line error a sampler of `cfg` would give for its --screen-generations, its --reward /
    --dataset-transform choice and its data set (imports and names only), or None."""
    if problem := screen_problem(cfg.rollout.screen_generations, cfg.rollout.num_generations):
        return problem
    try:
        local_file(cfg.data.dataset)   # a mistyped path; a hub id is the sampler's to fetch
        evaluated = cfg.evaluation.eval_dataset or cfg.data.dataset
        if cfg.evaluation.eval_every > 0 and local_file(evaluated, "test") is not None:
            # sampler 0's evaluation set, when local: a folder without a test split, or a file too small to
            # hold rows out, would otherwise end the run only after the learner is up (its one row read here)
            load_problems(evaluated, "test", limit=1)
        reward_set_from_config(cfg)
        load_transform(cfg.data.dataset_transform)
        if cfg.data.curriculum and not cfg.data.dataset.startswith("rg:"):
            tasks.start_levels(cfg.data.dataset)   # says why a curriculum needs rg: tasks
    except (RewardError, PluginError, tasks.TaskSpecError, DatasetUnavailable) as exc:
        return str(exc)
    return None


def sampler_tasks_problem(cfg: SamplerConfig) -> str | None:
    """The one-line error a sampler of `cfg` would give for its rg: tasks and their settings
    (reasoning-gym's registry and the tasks' config classes), or None. The launcher runs it on a
    thread beside the workers' start-up: reasoning-gym's import is its slowest."""
    if not cfg.data.dataset.startswith("rg:"):
        return None
    try:
        tasks.check(tasks.parse_spec(cfg.data.dataset[3:]), curriculum=cfg.data.curriculum)
    except tasks.TaskSpecError as exc:
        return str(exc)
    return None


# Imported by every worker before its model loads; without bytecode each process compiles them again.
BYTECODE_PACKAGES = ("torch", "transformers", "deepspeed")


def missing_bytecode(packages: tuple[str, ...] = BYTECODE_PACKAGES) -> list[str]:
    """Those of `packages` installed here whose top module has no bytecode where this interpreter
    looks for it (beside the source, or under PYTHONPYCACHEPREFIX). Finds, never imports."""
    missing = []
    for name in packages:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        origin = spec.origin if spec is not None else None
        if origin and origin.endswith(".py") and not os.path.exists(importlib.util.cache_from_source(origin)):
            missing.append(name)
    return missing


def bytecode_warning(dont_write: bool, missing: list[str]) -> str | None:
    """One line when the workers will compile their imports at every launch: the packages have no
    bytecode and the interpreter is told not to write any (PYTHONDONTWRITEBYTECODE=1, common in
    container images). Where it may write, the first run writes it and nothing needs saying."""
    if not dont_write or not missing:
        return None
    return (f"{', '.join(missing)} {'has' if len(missing) == 1 else 'have'} no bytecode and PYTHONDONTWRITEBYTECODE "
            f"(or python -B) is set, so every worker compiles {'its' if len(missing) == 1 else 'their'} imports again at each launch "
            f"(seconds of each worker's start-up); unset PYTHONDONTWRITEBYTECODE and set "
            f"PYTHONPYCACHEPREFIX to a writable folder (e.g. ~/.cache/pycache), or run python -m compileall on "
            f"them once")
