"""The weight sync section: how each new policy version reaches the samplers."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from grpo.config.bounds import at_least, positive

WeightSync = Literal["auto", "ipc", "nccl", "shared", "tcp"]


@dataclass
class WeightSyncSection:
    """The method, which both roles must agree on."""

    section = "weight sync"

    weight_sync: WeightSync = "auto"
    """'ipc' (CUDA IPC, one node), 'nccl' (other nodes), 'shared' (one GPU, no copy), 'tcp' (bytes), or 'auto' (per sampler)."""
    verify_weight_sync: bool = False
    """Fingerprint each version on both sides; summary.json says if all match."""


@dataclass
class SamplerWeightSyncSection:
    """How long a sampler waits for the learner's answers."""

    section = "weight sync"

    sync_timeout_s: float = at_least(0, 5.0)
    """Wait this long for the learner's answer to a weights request, then generate with the current weights."""
    first_answer_timeout_s: float = at_least(0, 600.0)
    """Give up with an error when the learner's first answer (the run's facts) has not come after this long."""


@dataclass
class LearnerWeightSyncSection:
    """How long the learner waits for samplers to take a version."""

    section = "weight sync"

    ipc_ack_timeout_s: float = at_least(0, 10.0)
    """ipc: wait this long for samplers to release a weights slot before reuse; then take them for gone."""
    nccl_timeout_s: float = positive(60.0)
    """nccl: longest wait for a sampler to join its pair group or take a version; then the pair is dropped."""
