"""Choosing a weight-sync method: one place for both sides of --weight-sync.

Learner rank 0 builds one publisher; a CUDA learner's slots serve ipc, nccl and tcp requests
alike, so the *sampler* decides per connection (auto: ipc if it can see the learner's GPU,
else nccl if it has CUDA, else tcp). The methods themselves live in weight_sync (tcp,
layout), weight_ipc (slots, ipc), weight_nccl (pair groups) and weight_shared.
"""
from __future__ import annotations

import logging

import torch

from grpo.transport import SyncServer
from grpo.weight_sync import TcpPublisher

log = logging.getLogger(__name__)
METHODS = ("auto", "ipc", "nccl", "shared", "tcp")


def check_method(method: str, device: torch.device, lora: bool, deepspeed: bool) -> None:
    """A bad --weight-sync for this learner: ValueError with the fix, before anything loads."""
    if method not in METHODS:
        raise ValueError(f"--weight-sync {method}: choose {', '.join(METHODS[:-1])} or {METHODS[-1]}")
    if method == "ipc" and device.type != "cuda":
        raise ValueError("--weight-sync ipc needs a CUDA learner; use --weight-sync tcp (or auto) on CPU")
    if method == "shared" and (device.type != "cuda" or lora or not deepspeed):
        raise ValueError("--weight-sync shared needs a CUDA DeepSpeed learner without LoRA (bf16 weights the "
                         "sampler can use as they are); use --weight-sync ipc")


def make_publisher(method: str, server: SyncServer, module: torch.nn.Module, device: torch.device,
                   dtype: torch.dtype, host: str, sync_port: int, ack_timeout_s: float, nccl_timeout_s: float):
    """tcp on CPU or when asked; otherwise slots on the learner's device (nccl on CPU runs on gloo)."""
    if method == "auto":
        method = "ipc" if device.type == "cuda" else "tcp"
        log.info("weight sync: auto -> %s (%s)", method, "CUDA learner: samplers that see its GPU map the "
                 "weights (ipc), others on CUDA get them by nccl, the rest as bytes" if method == "ipc"
                 else "no CUDA: bytes over ZeroMQ")
    if method == "shared":
        from grpo.weight_shared import SharedPublisher

        return SharedPublisher(server, module, sync_port)
    if method in ("ipc", "nccl"):
        from grpo.weight_ipc import IpcPublisher

        return IpcPublisher(server, module, dtype, ack_timeout_s=ack_timeout_s, method=method, host=host,
                            nccl_timeout_s=nccl_timeout_s)
    return TcpPublisher(server, module, dtype)


def sampler_method(weight_sync: str, device: torch.device) -> str:
    """The method a sampler asks for first."""
    if weight_sync in ("nccl", "shared", "tcp"):
        return weight_sync
    return "ipc" if device.type == "cuda" else "tcp"


def make_receiver(method: str, policy: torch.nn.Module, dtype: torch.dtype, sync_port: int, timeout_s: float):
    """The sampler's receiver for ipc, nccl or shared (tcp needs none: apply_weights)."""
    if method == "ipc":
        from grpo.weight_ipc import IpcReceiver

        return IpcReceiver(policy, dtype)
    if method == "shared":
        from grpo.weight_shared import SharedReceiver

        return SharedReceiver(policy, sync_port)
    from grpo.weight_nccl import NcclReceiver

    return NcclReceiver(policy, dtype, timeout_s)
