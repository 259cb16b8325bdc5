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
    """Comma-separated GPU ids for the whole run, or 'all' (every GPU here; with --nodes, every node's): the launcher chooses how many sample and how many train from the model's size and the step's settings (grpo/rules/layout.py) and says its choice in one line at start. Instead of --sampling-gpus/--training-gpus/--share-gpus (with --nodes: of --training-ranks/--num-samplers)."""
    layout_from: str = ""
    """With --gpus: an earlier run's folder (same model and step settings, samplers and learner ranks on GPUs of their own) whose measured rates cost the split instead of the default ones."""
    training_ranks: int = at_least(1, 1)
    """Learner ranks on CPU (--device cpu) and with --nodes; on one GPU host, one rank per training GPU."""
    num_samplers: int = at_least(1, SamplerRunSection.num_samplers)
    """Samplers on CPU (--device cpu) and with --nodes; on one GPU host, one per sampling GPU."""
    share_gpus: bool = False
    """Allow a GPU in both --sampling-gpus and --training-gpus (otherwise an overlap is refused)."""
    no_memory_check: bool = False
    """Start even when the memory plan (printed at start; grpo/rules/memory.py) says the processes will not fit their GPUs. The plan's rules are estimates not yet checked against measured peaks on every size: use this when a measured run proves it wrong."""


@dataclass
class SupervisionSection:
    """Start-up deadlines, stopping, restarting samplers."""

    section = "supervision"

    ready_timeout_s: float = positive(600.0)
    """How long to wait for the learner to bind its ports."""
    stage_timeout_s: float = at_least(0, 60.0, "0: never")
    """A process that has not reached its next startup stage after this long (learner: ports bound, engine ready, version 0 published, first step; sampler: model loaded, the learner's first answer, first group) is named, with what it is doing and its last log lines, and again every as long; the run goes on (0: never)."""
    stop_timeout_s: float = at_least(0, 30.0)
    """After a stop, how long each process gets to exit before it is killed."""
    stop_save_timeout_s: float = at_least(0, 300.0)
    """After Ctrl+C or SIGTERM, how long the learner gets to finish the step in hand, save it as a checkpoint and write summary.json before every process is stopped without that save (a second Ctrl+C stops them at once)."""
    restart_samplers: int = at_least(0, 0, "0: a sampler's death stops the run")
    """Restart a sampler that dies up to N times (each sampler) instead of stopping the run (0: stop the run)."""


@dataclass
class InstancesSection:
    """Independent runs started together."""

    section = "seeded instances"

    instances: int = at_least(1, 1)
    """Independent runs started together, each with its own GPUs, ports and run directory (see --seeds)."""
    seeds: str = ""
    """Comma-separated seeds, one per instance, e.g. 42,1337 (implies --instances; default: --seed, --seed+1, ...)."""
    name: str = "grpo"
    """With --instances/--seeds: instance run directories are <run-dir or runs>/<name>_seed<seed>."""


@dataclass
class NodesSection:
    """The plan of a run over several machines."""

    section = "several nodes"

    nodes: str = ""
    """Print the plan of a run over several machines and start nothing: the nodes in order as ADDRESS:GPUS,... (e.g. 10.0.0.1:8,10.0.0.2:8,10.0.0.3:8; on --device cpu, process slots). The --training-ranks learner ranks fill the first nodes from GPU 0, --ranks-per-node a node (DeepSpeed runs one --num_gpus on every node); the --num-samplers samplers take the GPUs after them. Prints each node's commands, hostfile, GPU layout, weight-sync method per sampler and memory per GPU."""
    ranks_per_node: int = at_least(0, 0)
    """With --nodes: learner ranks on each learner node, GPUs 0..N-1 (0: as many as the first node has GPUs, at most --training-ranks); the GPUs after them take samplers."""
    master_port: int = bounded(MASTER_PORT, least=1, most=65535)
    """With --nodes: the learner group's rendezvous port (MASTER_PORT) on the first node (one host alone picks a free one)."""
