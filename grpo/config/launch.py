"""The launcher's sections (run_distributed.py): which GPUs, supervising the processes, seeded instances, several nodes."""
from __future__ import annotations

from dataclasses import dataclass

from grpo.config.bounds import at_least, bounded, positive
from grpo.config.constants import MASTER_PORT
from grpo.config.run import SamplerRunSection


@dataclass
class PlacementSection:
    """Which GPUs sample and which train."""

    section = "placement"

    sampling_gpus: str = ""
    """Comma-separated GPU ids, one sampler each (alias --sampling-gpu)."""
    training_gpus: str = ""
    """Comma-separated GPU ids for the learner ranks, e.g. 1,2,3."""
    gpus: str = ""
    """GPU ids, or 'all': the launcher chooses the sampler/learner split."""
    layout_from: str = ""
    """With --gpus: a run folder whose measured rates cost the split."""
    training_ranks: int = at_least(1, 1)
    """Learner ranks on CPU and --nodes (else one per training GPU)."""
    num_samplers: int = at_least(1, SamplerRunSection.num_samplers)
    """Samplers on CPU and with --nodes (else one per sampling GPU)."""
    share_gpus: bool = False
    """Let a GPU be in both --sampling-gpus and --training-gpus."""
    no_memory_check: bool = False
    """Start even if the memory plan (an estimate) says it will not fit."""


@dataclass
class SupervisionSection:
    """Start-up deadlines, stopping, restarting samplers."""

    section = "supervision"

    ready_timeout_s: float = positive(600.0)
    """How long to wait for the learner to bind its ports."""
    stage_timeout_s: float = at_least(0, 60.0, "0: never")
    """Name a process late for its next startup stage (0: never)."""
    stop_timeout_s: float = at_least(0, 30.0)
    """Seconds a process gets to exit after a stop, then killed."""
    stop_save_timeout_s: float = at_least(0, 300.0)
    """After Ctrl+C: the learner's time to save before all stop."""
    restart_samplers: int = at_least(0, 0, "0: a sampler's death stops the run")
    """Times each sampler may be restarted (0: a death stops the run)."""


@dataclass
class InstancesSection:
    """Independent runs started together."""

    section = "seeded instances"

    instances: int = at_least(1, 1)
    """Independent runs together, each with its own GPUs and ports."""
    seeds: str = ""
    """Seeds, one per instance (sets --instances; default --seed, --seed+1...)."""
    name: str = "grpo"
    """Instances' run dirs: <run-dir or runs>/<name>_seed<seed>."""


@dataclass
class NodesSection:
    """The plan of a run over several machines."""

    section = "several nodes"

    nodes: str = ""
    """Print a plan over several machines, start nothing: ADDR:GPUS,..."""
    ranks_per_node: int = at_least(0, 0)
    """With --nodes: learner ranks a node (0: the first node's GPUs)."""
    master_port: int = bounded(MASTER_PORT, least=1, most=65535)
    """With --nodes: the learner group's MASTER_PORT on node 1."""
