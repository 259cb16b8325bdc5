"""What a weight-sync method is: its facts, its two sides, and how each side is built.

A method is one file under grpo/weights (its publisher and its receiver) and one `WeightMethod`
entry in grpo.weights.registry. The rules that choose a method (grpo.weights.methods), the two
factories (grpo.weights.make_publisher, make_receiver) and the sampler's apply path read the
entry; none of them names a method to find its facts. This module imports no torch: the
launcher reads the facts before any model is loaded.
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Callable, Protocol


@dataclass(frozen=True)
class PublishArgs:
    """What learner rank 0 has for its publisher; each method takes the fields it needs."""
    method: str          # the method chosen (grpo.weights.methods.learner_method)
    server: Any          # grpo.wire.transport.Server on the sync port: the publisher's thread answers on it
    module: Any          # the model whose parameters are published
    device: Any          # the learner's torch.device
    dtype: Any           # the samplers' dtype, which published bytes are cast to
    host: str            # where peers reach this learner (nccl's pair groups)
    sync_port: int
    ack_timeout_s: float
    nccl_timeout_s: float
    answers: Any = None  # grpo.sync.answer.SyncAnswer: the control fields of every answer


@dataclass(frozen=True)
class ReceiveArgs:
    """What a sampler has for its receiver."""
    policy: Any          # the model that generates: a version is applied to its parameters
    dtype: Any           # the sampler's compute dtype
    sync_port: int
    timeout_s: float     # how long one transfer may take before it counts as failed


class WeightPublisher(Protocol):
    """Learner rank 0's side (grpo.weights.publisher.Publisher is the common base): captures each
    version and serves it from its own thread on the sync port."""
    method: str
    sampler_versions: dict[int, int]
    bytes_served: int
    replies: dict[str, int]

    def publish(self, version: int, model: Any) -> float: ...   # seconds the learner was stalled
    def guard(self) -> AbstractContextManager: ...              # held around a training step and its publish
    def stop_samplers(self) -> None: ...
    def close(self) -> None: ...


class WeightReceiver(Protocol):
    """A sampler's side: applies an announced version (grpo.wire.messages.WeightsAnnounce)."""

    def apply(self, announce: Any) -> bool:
        """True: the version is live. False: the transfer did not complete (slot rewritten, peer
        gone), nothing changed, ask again. RuntimeError: the method is impossible here, step down
        (grpo.weights.methods.fallback). ValueError: the announced weights do not fit this model."""
        ...

    def guard(self) -> AbstractContextManager: ...   # held around a whole round (shared: the learner's lock)


def no_problem(device_type: str, lora: bool, bf16_weights: bool) -> str:
    """A method any learner can publish by."""
    return ""


@dataclass(frozen=True)
class WeightMethod:
    """One --weight-sync method.

    publisher / receiver: build each side (heavy imports inside them, so that reading the facts
    costs nothing). check(device_type, lora, bf16_weights): the one-line problem (with the fix)
    when a learner like that cannot use this method, "" when it can.
    """
    name: str
    publisher: Callable[[PublishArgs], WeightPublisher]
    receiver: Callable[[ReceiveArgs], WeightReceiver]
    # A sampler that applied a version acknowledges it at once (a follow-up weights_request):
    # its receiver read the learner's slot, which the learner may rewrite only after that.
    acknowledges: bool = False
    # Only a CUDA sampler can receive this way: a CPU sampler asks for bytes from the start.
    cuda_sampler: bool = False
    # The sampler generates with weights of its own (False: it reads the learner's, so it has
    # nothing to generate round 0 with before the learner's first answer).
    own_weights: bool = True
    check: Callable[[str, bool, bool], str] = no_problem
