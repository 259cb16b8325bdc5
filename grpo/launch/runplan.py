"""The run, typed: the launcher's config and each role's, parsed once from the command line, with
the placement of its processes; the launcher's choices (layout, rows in flight, staleness bound,
micro-batches) are made on this object (grpo.launch.inflight, grpo.launch.memfit), and argv is
written from it only when a process is spawned (worker_argv), so no choice rewrites a flag list.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from grpo.config import CommonConfig, LaunchConfig, LearnerConfig, SamplerConfig, flat, flat_fields, from_flat
from grpo.flags import load_config_file, parse_config

# Set in the environment of every worker the launcher spawns from a plan: the launcher has checked
# what the worker would check of its flags before loading anything (grpo.workers), so the worker
# trusts them; a worker started by hand (or from the --nodes commands) checks them itself.
PLANNED_ENV = "GRPO_LAUNCH_PLANNED"

# What the launcher's own config decides for the learner besides the fields every role shares.
LEARNER_FROM_LAUNCH = ("max_steps", "no_deepspeed")


@dataclass(frozen=True)
class Placement:
    """Where the processes of one host run: CUDA or not, and each one's GPUs (CUDA only): learner
    rank r on training_gpus[r], sampler k on `tensor_parallel` consecutive sampling GPUs (sampler_gpus)."""

    cuda: bool
    ranks: int
    samplers: int
    training_gpus: tuple[int, ...] = ()
    sampling_gpus: tuple[int, ...] = ()   # every sampler's, in order: samplers x tensor_parallel ids
    tensor_parallel: int = 1              # GPUs per sampler (--vllm-tensor-parallel-size)

    def sampler_gpus(self, k: int) -> tuple[int, ...]:
        """Sampler k's GPUs (grpo.rules.tensor_parallel.sampler_groups): the k-th run of tensor_parallel ids."""
        return self.sampling_gpus[k * self.tensor_parallel:(k + 1) * self.tensor_parallel]


@dataclass(frozen=True)
class RunPlan:
    launch: LaunchConfig
    sampler: SamplerConfig   # every sampler's, before its id and GPU
    learner: LearnerConfig   # every learner rank's, before its GPU
    sampler_flags: tuple[str, ...] = ()   # the worker flags as typed: --nodes prints them so
    learner_flags: tuple[str, ...] = ()
    chosen: bool = False   # --gpus: how the samplers decode is the launcher's to choose too
    placement: Placement | None = None

    def left_default(self, name: str) -> bool:
        """Whether the user left the worker option `name` alone: no flag, and no key of the --config
        file. Only then may the launcher choose it (a config file that sets other keys leaves this
        one to the launcher, as the same flags typed would)."""
        return name not in given_names([*self.sampler_flags, *self.learner_flags], self.launch.run.config)


def given_names(argv: list[str], config_path: str) -> set[str]:
    """The option names (underscored) the user gave: flags of `argv` (--name, --name=value) and the
    keys of the --config file, read as every role reads it (grpo.flags.load_config_file). Only an
    option not among them is the launcher's to choose."""
    names = {tok[2:].partition("=")[0].replace("-", "_") for tok in argv if tok.startswith("--")}
    if config_path:
        for cls in (LaunchConfig, SamplerConfig, LearnerConfig):
            names |= set(load_config_file(config_path, cls))
    return names


def config_flag(config: str) -> list[str]:
    return ["--config", config] if config else []


def from_flags(launch: LaunchConfig, sampler_flags: list[str], learner_flags: list[str],
               chosen: bool = False) -> RunPlan:
    """Each role's config as its worker would parse it (the --config file included), once. The
    launcher's prog names a mistake: the user typed these flags to it."""
    config = config_flag(launch.run.config)
    sampler = parse_config(SamplerConfig, config + list(sampler_flags), "run_distributed.py")
    learner = parse_config(LearnerConfig, config + list(learner_flags), "run_distributed.py")
    return with_launch(RunPlan(launch, sampler, learner, tuple(sampler_flags), tuple(learner_flags), chosen), launch)


def with_launch(rp: RunPlan, launch: LaunchConfig) -> RunPlan:
    """The plan with `launch` as the launcher's config: the fields it shares with the roles (a
    layout or CPU sizing changes them there) copied into both."""
    values = flat(launch)
    common = {name: values[name] for name in flat_fields(CommonConfig)}
    own = {name: values[name] for name in LEARNER_FROM_LAUNCH}
    # by flat name: a shared field lies in the same section of every role, the launcher's own in its own
    return replace(rp, launch=launch, sampler=from_flat(SamplerConfig, flat(rp.sampler), **common),
                   learner=from_flat(LearnerConfig, flat(rp.learner), **common, **own))


def with_placement(rp: RunPlan, placement: Placement) -> RunPlan:
    """The plan placed: the roles' device is the one they run on (what a rule reading 'auto' would
    otherwise have to guess)."""
    device = "cuda" if placement.cuda else "cpu"
    return replace(rp, placement=placement, sampler=replace(rp.sampler, run=replace(rp.sampler.run, device=device)),
                   learner=replace(rp.learner, run=replace(rp.learner.run, device=device)))


def flag_words(name: str, value) -> list[str]:
    flag = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        # a --no-x switch has no flag that turns it off; the launcher never needs one
        return [flag] if value else ([] if name.startswith("no_") else ["--no-" + flag[2:]])
    return [flag, str(value)]


def changed_flags(base, cfg, always: tuple[str, ...] = ()) -> list[str]:
    """The flags that turn config `base` into `cfg` (same class), in field order; `always`: fields
    written even where they agree."""
    mine, theirs = flat(cfg), flat(base)
    return [word for name, value in mine.items() if name not in ("extra", "config")
            and (name in always or value != theirs[name])
            for word in flag_words(name, value)]


def worker_argv(cfg, always: tuple[str, ...] = ()) -> list[str]:
    """A worker's flags for `cfg`: its --config file, then each field that file and the defaults
    leave otherwise (and `always`); the worker's parse of them gives `cfg` back
    (tests/launch/test_runplan.py)."""
    base = parse_config(type(cfg), config_flag(cfg.run.config), "run_distributed.py")
    return config_flag(cfg.run.config) + changed_flags(base, cfg, always)
