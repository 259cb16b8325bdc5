"""Which weight-sync method each side uses: pure rules, the same for the learner and the samplers.

--weight-sync (docs/weight-sync.md) is 'auto' or one method. The learner builds one publisher
(`learner_method`); a CUDA learner's slots serve ipc, nccl and tcp requests alike, so each
sampler asks for the method it can use (`sampler_method`) and the publisher serves what was
asked (`serve_method`). When a method proves impossible (the learner's GPU is not visible, a
CPU learner has no IPC handles), both sides step down by the same rule (`fallback`). Whether a
sampler acknowledges a version it applied is each method's too (`acknowledges`).
"""
from __future__ import annotations

from grpo.wire.messages import IPC, NCCL, SHARED, TCP

AUTO = "auto"
METHODS = (AUTO, IPC, NCCL, SHARED, TCP)
# The methods whose receiver reads the learner's slot (grpo.weights.slots): the learner may write
# that slot again only once every reader has acknowledged the version it holds.
ACKNOWLEDGED = frozenset({IPC, NCCL})


def check_method(method: str, device, lora: bool, bf16_weights: bool) -> None:
    """A bad --weight-sync for this learner (`device.type` 'cuda' or 'cpu'; `bf16_weights`: its
    --precision resolves to bf16): ValueError with the fix."""
    if method not in METHODS:
        raise ValueError(f"--weight-sync {method}: choose {', '.join(METHODS[:-1])} or {METHODS[-1]}")
    if method == IPC and device.type != "cuda":
        raise ValueError("--weight-sync ipc needs a CUDA learner; use --weight-sync tcp (or auto) on CPU")
    if method == SHARED and (device.type != "cuda" or lora or not bf16_weights):
        raise ValueError("--weight-sync shared needs a CUDA DeepSpeed learner with --precision bf16 and without "
                         "LoRA (bf16 weights the sampler can use as they are); use --weight-sync ipc")


def learner_method(requested: str, device) -> str:
    """The publisher the learner builds: auto is the slots (ipc) on CUDA, bytes (tcp) on CPU."""
    if requested == AUTO:
        return IPC if device.type == "cuda" else TCP
    return requested


def sampler_method(requested: str, device) -> str:
    """The method a sampler asks for first: auto and ipc are ipc on CUDA; a CPU sampler takes bytes."""
    if requested in (NCCL, SHARED, TCP):
        return requested
    return IPC if device.type == "cuda" else TCP


def fallback(current: str, requested: str) -> str:
    """The method to use once `current` proved impossible; `requested` is what --weight-sync asked.

    Under auto, ipc steps down to nccl (the learner is on another host: its GPU is not visible);
    every other failure, and ipc asked for by name, steps down to tcp, which always works.
    """
    if current == IPC and requested == AUTO:
        return NCCL
    return TCP


def serve_method(asked: str, offered: str, has_ipc: bool) -> str:
    """How the publisher serves one request: what the sampler asked ('' : what it offers),
    stepped down by `fallback` when it asked for ipc and there are no IPC handles (a CPU learner)."""
    method = asked or offered
    if method == IPC and not has_ipc:
        return fallback(IPC, IPC)
    return method


def acknowledges(method: str) -> bool:
    """Whether a sampler that applied a version sent by `method` acknowledges it at once: a
    follow-up weights_request reporting the new version, after which the learner may rewrite the
    slot it was read from (ipc, nccl). shared needs none (one copy, taken in turns under a lock),
    nor does tcp (the bytes came with the answer)."""
    return method in ACKNOWLEDGED
