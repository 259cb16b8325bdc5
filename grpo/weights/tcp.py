"""Method "tcp": the bucket bytes ride the sync socket as frames (CPU learners, and the fallback).

Learner side `TcpPublisher`; sampler side `TcpReceiver`, which copies the bytes that came with
the answer into the policy's parameters where they live (casting to the sampler's dtype).

Ownership: each published version gets freshly allocated CPU buckets. ZeroMQ sends them
without copying and holds a reference until the bytes are on the wire, so the learner never
writes into a buffer a reply may still be reading; the old snapshot is freed when the last
reply that uses it has gone.
"""
from __future__ import annotations

import contextlib
import time

import torch

from grpo.weights.layout import unpack_views
from grpo.weights.pack import pack
from grpo.weights.publisher import Publisher, Snapshot, publish_named
from grpo.wire import messages as M


def apply_weights(model: torch.nn.Module, announce: M.WeightsAnnounce) -> None:
    """Load a version into `model`, all or nothing: everything is checked before anything is written."""
    params = dict(model.named_parameters())
    names = {s.name for s in announce.layout}
    if names != set(params):
        missing, extra = sorted(set(params) - names)[:3], sorted(names - set(params))[:3]
        raise ValueError(f"weights v{announce.version} do not match this model (missing {missing}, unexpected {extra})")
    for spec in announce.layout:
        if tuple(params[spec.name].shape) != tuple(spec.shape):
            raise ValueError(f"weights v{announce.version}: {spec.name} has shape {spec.shape}, "
                             f"model has {tuple(params[spec.name].shape)}")
    views = unpack_views(announce.layout, announce.buckets)
    with torch.no_grad():
        for name, view in views.items():
            params[name].copy_(view, non_blocking=False)  # casts if the learner trains in another dtype


class TcpReceiver:
    """Sampler side: each version's bytes arrived with the answer; they are copied into the policy."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.device = next(model.parameters()).device

    def apply(self, announce: M.WeightsAnnounce) -> bool:
        apply_weights(self.model, announce)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)   # count the copy, not just its launch
        return True

    def guard(self):
        return contextlib.nullcontext()


class TcpPublisher(Publisher):
    """Learner rank 0 without slots: each version packed into new CPU buckets, sent as frames."""

    method = M.TCP

    def publish(self, version: int, model: torch.nn.Module) -> float:
        """Snapshot the model as `version`; returns the seconds the learner was stalled."""
        t0 = time.perf_counter()
        named = publish_named(model)
        buckets = pack(named, self.layout, self.bucket_nbytes, self.coalescer)
        announce = M.WeightsAnnounce(version=version, method=M.TCP, layout=self.layout,
                                     bucket_dtypes=self.bucket_dtypes, bucket_nbytes=self.bucket_nbytes,
                                     buckets=[memoryview(b.numpy()) for b in buckets])
        with self._lock:
            self._snapshot = Snapshot(version, announce)
        return time.perf_counter() - t0
