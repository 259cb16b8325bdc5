"""Weight sync: every published version of the learner's weights, to every sampler.

  method     what a method is: its facts and its two sides (WeightMethod, the Protocols)
  registry   the methods, one entry each: name, facts, the factories of its two sides
  methods    which method each side uses (pure rules over the registry's facts, with grpo.rules.methods:
             auto's order and the fallback, which need no facts)
  layout     flat per-dtype buckets and where each tensor sits (shared by every method)
  pack       filling buckets with as few copies as the parameters' memory allows
  publisher  the learner's side of the exchange on the sync port: serves each version's bytes
             (what else an answer carries, and the sampler's side, are grpo.sync's)
  tcp        bytes over ZeroMQ (CPU, and the fallback)
  slots      two slots on the learner's device, served as ipc, nccl or tcp
  ipc        CUDA IPC handles; the sampler's peer-to-peer copy
  nccl       a point-to-point group per remote sampler
  shared     one copy of the weights on one GPU, learner and sampler taking turns
  receiver   the sampler's flat weights (ipc and nccl)
  verify     --verify-weight-sync: fingerprints on both sides

A new method is one file here (its publisher and its receiver) and one entry in registry.py
(docs/extending.md). The two factories below build either side of any registered method through
its entry, for a method chosen by grpo.weights.methods.
"""
from __future__ import annotations

import logging

from grpo.weights.method import PublishArgs, ReceiveArgs
from grpo.weights.methods import IPC, learner_method
from grpo.weights.registry import REGISTRY

log = logging.getLogger(__name__)


def make_publisher(requested: str, server, module, device, dtype, host: str, sync_port: int,
                   ack_timeout_s: float, nccl_timeout_s: float, answers=None):
    """Learner rank 0's publisher for --weight-sync `requested` on `device` (auto: slots on CUDA,
    bytes on CPU). `answers`: the control fields of every answer (grpo.sync.answer.SyncAnswer: the
    run's facts, curriculum levels, the budget)."""
    method = learner_method(requested, device.type)
    if method != requested:
        log.info("weight sync: %s -> %s (%s)", requested, method, "CUDA learner: samplers that see its GPU map the "
                 "weights (ipc), others on CUDA get them by nccl, the rest as bytes" if method == IPC
                 else "no CUDA: bytes over ZeroMQ")
    return REGISTRY[method].publisher(PublishArgs(method, server, module, device, dtype, host, sync_port,
                                                  ack_timeout_s, nccl_timeout_s, answers))


def make_receiver(method: str, policy, dtype, sync_port: int, timeout_s: float):
    """A sampler's receiver for `method` (grpo.weights.method.WeightReceiver)."""
    if method not in REGISTRY:
        raise ValueError(f"no weight-sync method {method!r}")
    return REGISTRY[method].receiver(ReceiveArgs(policy, dtype, sync_port, timeout_s))
