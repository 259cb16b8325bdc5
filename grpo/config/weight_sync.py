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
    """How weights reach the samplers: 'auto' (ipc where the sampler sees the learner's GPU, nccl on other CUDA hosts, else tcp), 'ipc' (CUDA IPC, one node), 'nccl' (point-to-point group per sampler; gloo on CPU), 'shared' (same GPU: the sampler uses the learner's weights in place, the two take turns), or 'tcp' (bytes over ZeroMQ)."""
    verify_weight_sync: bool = False
    """Prove weight sync end to end: the learner fingerprints each version it publishes, samplers the weights they run after applying one; the summary says whether every pair matched bit for bit (one pass over the weights per version on each side)."""


@dataclass
class SamplerWeightSyncSection:
    """How long a sampler waits for the learner's answers."""

    section = "weight sync"

    sync_timeout_s: float = at_least(0, 5.0)
    """How long to wait for the learner's answer to a weights request before generating with the current weights."""
    first_answer_timeout_s: float = at_least(0, 600.0)
    """The learner's first answer carries the run's facts, which a sampler checks before it sends anything: it generates its first round while the answer is on its way, then waits for it (logging every --sync-timeout-s) and gives up with an error after this long."""


@dataclass
class LearnerWeightSyncSection:
    """How long the learner waits for samplers to take a version."""

    section = "weight sync"

    ipc_ack_timeout_s: float = at_least(0, 10.0)
    """ipc: before reusing a weights slot, wait this long for samplers that read it to acknowledge; then take them for gone."""
    nccl_timeout_s: float = positive(60.0)
    """nccl: longest wait for a sampler to join its pair group or take a version; then the pair is dropped."""
