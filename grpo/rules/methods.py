"""Which weight-sync method each side takes, where that needs no method's facts (pure): the
learner's publisher, auto's order, and the one step down both sides take when a method proves
impossible.

These rules name methods by their place (auto's first choice, the last resort), not by their
facts, so they need no registry: the slot publisher, which the registry builds, serves by them
too, and the launcher applies them before torch, numpy or zmq is imported. The rules that read
each method's facts (what a learner needs, what a CPU sampler asks for, acknowledgements) are
grpo.weights.methods', beside the registry that holds the facts.
"""
from __future__ import annotations

# The methods' names, as --weight-sync (grpo.config.WeightSync) and the wire (grpo.wire.messages,
# whose codec imports nothing of ours) spell them too; tests/weights/test_registry.py keeps the
# lists equal.
AUTO, TCP, IPC, NCCL, SHARED = "auto", "tcp", "ipc", "nccl", "shared"
# auto on CUDA: the first method, and each sampler steps down this order when one proves
# impossible (ipc: the learner's GPU is not visible here, so it is on another host: nccl).
AUTO_ORDER = (IPC, NCCL, TCP)
# Bytes over the sync socket: always works (CPU, any host), so every other failure ends here.
LAST_RESORT = TCP


def learner_method(requested: str, device_type: str) -> str:
    """The publisher a learner on `device_type` ('cuda' or 'cpu') builds: auto is the slots (ipc) on
    CUDA, bytes (tcp) on CPU."""
    if requested == AUTO:
        return AUTO_ORDER[0] if device_type == "cuda" else LAST_RESORT
    return requested


def fallback(current: str, requested: str) -> str:
    """The method to use once `current` proved impossible; `requested` is what --weight-sync asked.

    Under auto, ipc steps down to nccl (the learner is on another host: its GPU is not visible);
    every other failure, and ipc asked for by name, steps down to tcp, which always works.
    """
    if requested == AUTO and current in AUTO_ORDER[:-1]:
        return AUTO_ORDER[AUTO_ORDER.index(current) + 1]
    return LAST_RESORT


def serve_method(asked: str, offered: str, has_ipc: bool) -> str:
    """How the publisher serves one request: what the sampler asked ('' : what it offers),
    stepped down by `fallback` when it asked for ipc and there are no IPC handles (a CPU learner)."""
    method = asked or offered
    if method == IPC and not has_ipc:
        return fallback(IPC, IPC)
    return method
