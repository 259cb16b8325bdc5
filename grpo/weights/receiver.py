"""The sampler's flat weights, shared by the ipc and nccl receivers.

The policy's parameters are re-pointed into one flat local buffer with the published layout
(grpo.weights.layout), so that a version arrives as one copy, not one per tensor.
"""
from __future__ import annotations

import contextlib

import torch

from grpo.weights.layout import flat_views, plan_layout
from grpo.wire import messages as M


class FlatReceiver:
    """Sampler side, shared by ipc and nccl: the policy's parameters live in flat local buckets.

    A version lands in a staging copy first and is copied over the live buckets only once it
    is known to be whole (stamp unchanged, transfer completed), so a failed or raced transfer
    never leaves half a version in the weights that generate: all or nothing, for the price
    of one on-device copy.
    """

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype):
        named = list(model.named_parameters())
        self.layout, self.bucket_dtypes, self.bucket_nbytes = plan_layout(
            [(n, p.detach().to("meta", dtype)) for n, p in named])
        self.device = named[0][1].device
        self.total = sum(self.bucket_nbytes)
        self.local = torch.empty(self.total, dtype=torch.uint8, device=self.device)
        self.staging = torch.empty_like(self.local)
        views = flat_views(self.local, self.layout, self.bucket_nbytes)
        with torch.no_grad():
            for n, p in named:
                views[n].copy_(p)
                p.data = views[n]   # the parameter now lives inside the local bucket

    def check_layout(self, announce: M.WeightsAnnounce) -> None:
        if (announce.layout != self.layout or announce.bucket_nbytes != self.bucket_nbytes
                or announce.bucket_dtypes != self.bucket_dtypes):
            raise ValueError(f"weights v{announce.version} do not match this model's layout")

    def guard(self):
        """Nothing to hold around a round: the sampler generates from its own copy."""
        return contextlib.nullcontext()

    def commit(self) -> None:
        """The staged version is whole: make it the live one."""
        self.local.copy_(self.staging)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
