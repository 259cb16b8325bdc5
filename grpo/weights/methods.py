"""Which weight-sync method each side uses: pure rules, the same for the learner and the samplers.

--weight-sync (docs/weight-sync.md) is 'auto' or one method of grpo.weights.registry. The learner
builds one publisher (`learner_method`); a CUDA learner's slots serve ipc, nccl and tcp requests
alike, so each sampler asks for the method it can use (`sampler_method`) and the publisher serves
what was asked (`serve_method`). When a method proves impossible (the learner's GPU is not
visible, a CPU learner has no IPC handles), both sides step down by the same rule (`fallback`).
Each method's own facts (what a learner needs, whether a sampler acknowledges a version, whether
it needs CUDA) are its registry entry's, read here; auto's order and the step down, which need no
facts, are grpo.rules.methods' (gathered here, so both sides import the rules from one place).
Nothing here imports torch, numpy or zmq: the launcher applies these rules before any worker starts.
"""
from __future__ import annotations

from grpo.rules.methods import (AUTO, AUTO_ORDER, IPC, LAST_RESORT, NCCL, SHARED, TCP, fallback, learner_method,
                                serve_method)
from grpo.weights.registry import REGISTRY

__all__ = ["AUTO", "AUTO_ORDER", "IPC", "LAST_RESORT", "METHODS", "NCCL", "SHARED", "TCP", "acknowledges",
           "check_method", "fallback", "learner_method", "own_weights", "sampler_method", "serve_method"]
# --weight-sync's choices as the config declares them (tests/test_choices.py); the rules below read
# REGISTRY itself, so a method registered later is known to them too.
METHODS = (AUTO, *REGISTRY)


def check_method(method: str, device_type: str, lora: bool, bf16_weights: bool) -> None:
    """A bad --weight-sync for a learner on `device_type` ('cuda' or 'cpu'; `bf16_weights`: its
    --precision resolves to bf16): ValueError with the fix. The rules here take a device's type, not
    a device: the launcher and the workers apply them before torch is imported."""
    if method != AUTO and method not in REGISTRY:
        names = (AUTO, *REGISTRY)
        raise ValueError(f"--weight-sync {method}: choose {', '.join(names[:-1])} or {names[-1]}")
    if method != AUTO and (problem := REGISTRY[method].check(device_type, lora, bf16_weights)):
        raise ValueError(problem)


def sampler_method(requested: str, device_type: str) -> str:
    """The method a sampler on `device_type` ('cuda' or 'cpu') asks for first: auto is ipc on CUDA; a
    CPU sampler takes bytes for a method only a CUDA sampler can receive by (ipc, and so auto)."""
    method = AUTO_ORDER[0] if requested == AUTO else requested
    if REGISTRY[method].cuda_sampler and device_type != "cuda":
        return LAST_RESORT
    return method


def acknowledges(method: str) -> bool:
    """Whether a sampler that applied a version sent by `method` acknowledges it at once: a
    follow-up weights_request reporting the new version, after which the learner may rewrite the
    slot it was read from (ipc, nccl). shared needs none (one copy, taken in turns under a lock),
    nor does tcp (the bytes came with the answer)."""
    entry = REGISTRY.get(method)
    return entry is not None and entry.acknowledges


def own_weights(method: str) -> bool:
    """Whether a sampler receiving by `method` generates with weights of its own (not shared: it
    reads the learner's, so it has nothing to generate with before the learner's first answer)."""
    return REGISTRY[method].own_weights
