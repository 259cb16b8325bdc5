"""Weight sync: every published version of the learner's weights, to every sampler.

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
  methods    which method each side uses, and the fallback (pure)

The two factories below build each side's object for a method chosen by grpo.weights.methods.
"""
from __future__ import annotations

import logging

from grpo.weights.methods import learner_method
from grpo.wire.messages import IPC, NCCL, SHARED, TCP

log = logging.getLogger(__name__)


def make_publisher(requested: str, server, module, device, dtype, host: str, sync_port: int,
                   ack_timeout_s: float, nccl_timeout_s: float, answers=None):
    """Learner rank 0's publisher: tcp on CPU or when asked; otherwise slots on the learner's
    device (nccl on CPU runs on gloo), or the shared storages. `answers`: the control fields of
    every answer (grpo.sync.answer.SyncAnswer: the run's facts, curriculum levels, the budget)."""
    method = learner_method(requested, device)
    if method != requested:
        log.info("weight sync: %s -> %s (%s)", requested, method, "CUDA learner: samplers that see its GPU map the "
                 "weights (ipc), others on CUDA get them by nccl, the rest as bytes" if method == IPC
                 else "no CUDA: bytes over ZeroMQ")
    if method == SHARED:
        from grpo.weights.shared import SharedPublisher

        return SharedPublisher(server, module, sync_port, answers=answers)
    if method in (IPC, NCCL):
        from grpo.weights.slots import SlotPublisher

        return SlotPublisher(server, module, dtype, ack_timeout_s=ack_timeout_s, method=method, host=host,
                             nccl_timeout_s=nccl_timeout_s, answers=answers)
    from grpo.weights.tcp import TcpPublisher

    return TcpPublisher(server, module, dtype, answers=answers)


def make_receiver(method: str, policy, dtype, sync_port: int, timeout_s: float):
    """The sampler's receiver for ipc, nccl or shared (tcp needs none: grpo.weights.tcp.apply_weights)."""
    if method == IPC:
        from grpo.weights.ipc import IpcReceiver

        return IpcReceiver(policy, dtype)
    if method == SHARED:
        from grpo.weights.shared import SharedReceiver

        return SharedReceiver(policy, sync_port)
    if method == NCCL:
        from grpo.weights.nccl import NcclReceiver

        return NcclReceiver(policy, dtype, timeout_s)
    raise ValueError(f"no receiver for method {method!r} ({TCP} applies the bytes directly)")
