"""Moving weights from learner rank 0 to the samplers.

Shared by every method: a *layout* (name, dtype, shape, bucket, byte offset per tensor)
and flat per-dtype *buckets*. This module implements method "tcp" (bucket bytes over the
sync socket); the announcement header is the same for the later "ipc", "nccl" and "shared"
methods, which only carry the buckets differently.

Ownership: each published version gets freshly allocated CPU buckets. ZeroMQ sends them
without copying and holds a reference until the bytes are on the wire, so the learner
never writes into a buffer a reply may still be reading; the old snapshot is freed when
the last reply that uses it has gone.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from grpo import protocol as P
from grpo.coalesce import Coalescer
from grpo.transport import SyncClient, SyncServer

log = logging.getLogger(__name__)

DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16",
               torch.int32: "int32", torch.int64: "int64", torch.uint8: "uint8"}
TORCH_DTYPES = {v: k for k, v in DTYPE_NAMES.items()}
MAX_BUCKET_BYTES = 1 << 30  # one ZeroMQ frame per bucket; 1 GiB keeps frames a sane size


def plan_layout(named: list[tuple[str, torch.Tensor]],
                max_bucket_bytes: int = MAX_BUCKET_BYTES) -> tuple[list[P.TensorSpec], list[str], list[int]]:
    """Assign every tensor a bucket and byte offset: one run of buckets per dtype, in name order."""
    layout: list[P.TensorSpec] = []
    bucket_dtypes: list[str] = []
    bucket_nbytes: list[int] = []
    open_bucket: dict[str, int] = {}
    for name, t in named:
        dt = DTYPE_NAMES[t.dtype]
        nbytes = t.numel() * t.element_size()
        b = open_bucket.get(dt)
        if b is None or (bucket_nbytes[b] + nbytes > max_bucket_bytes and bucket_nbytes[b] > 0):
            b = len(bucket_dtypes)
            bucket_dtypes.append(dt)
            bucket_nbytes.append(0)
            open_bucket[dt] = b
        # Keep every tensor 16-byte aligned so a typed view of the bucket is always legal.
        offset = bucket_nbytes[b]
        layout.append(P.TensorSpec(name=name, dtype=dt, shape=tuple(t.shape), bucket=b, offset=offset))
        bucket_nbytes[b] = offset + ((nbytes + 15) // 16) * 16
    return layout, bucket_dtypes, bucket_nbytes


def pack(named: list[tuple[str, torch.Tensor]], layout: list[P.TensorSpec],
         bucket_nbytes: list[int], coalescer: Coalescer | None = None) -> list[torch.Tensor]:
    """Copy the tensors into new CPU uint8 buckets (device-to-host for CUDA tensors).

    A tensor whose dtype differs from its layout entry is cast first (fp32 master weights
    published as bf16), on its own device, so the host copy moves the smaller bytes.
    With a `coalescer` (grpo.coalesce), tensors that are byte-adjacent in one storage and in
    the buckets (DeepSpeed's flat bf16 parameters) move in one host copy per run, not one each.
    """
    # One allocation, the buckets back to back (the offsets grpo.coalesce plans with); each
    # bucket a slice of it, so a reply still sending any bucket keeps the whole snapshot alive.
    flat = torch.empty(sum(bucket_nbytes), dtype=torch.uint8)
    starts = np.concatenate([[0], np.cumsum(bucket_nbytes, dtype=np.int64)])
    buckets = [flat[int(s):int(s) + n] for s, n in zip(starts, bucket_nbytes)]
    if [n for n, _ in named] != [s.name for s in layout]:
        raise ValueError("pack: the tensors do not match the layout")
    todo = range(len(layout))
    if coalescer is not None:
        plan = coalescer.plan_for([t for _, t in named])
        for run in plan.runs:
            flat[run.offset:run.offset + run.nbytes].copy_(run.src)
        todo = plan.singles
    for i in todo:
        (_, t), spec = named[i], layout[i]   # names checked against the layout above
        t = t.detach().to(TORCH_DTYPES[spec.dtype])
        raw = t.contiguous().view(-1).view(torch.uint8)
        buckets[spec.bucket][spec.offset:spec.offset + raw.numel()].copy_(raw)
    return buckets


def unpack_views(layout: list[P.TensorSpec], buckets: list) -> dict[str, torch.Tensor]:
    """Typed, shaped views into received buckets (no copy)."""
    out: dict[str, torch.Tensor] = {}
    flat = [torch.frombuffer(b, dtype=torch.uint8) if not isinstance(b, torch.Tensor) else b for b in buckets]
    for spec in layout:
        dtype = TORCH_DTYPES[spec.dtype]
        n = int(np.prod(spec.shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size()
        raw = flat[spec.bucket][spec.offset:spec.offset + n]
        out[spec.name] = raw.view(dtype).view(spec.shape)
    return out


def apply_weights(model: torch.nn.Module, announce: P.WeightsAnnounce) -> None:
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


def publish_named(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The tensors samplers receive, named as the plain model names them.

    A LoRA (peft) model publishes its merged weights (see grpo.lora), so samplers need no peft.
    """
    if hasattr(model, "peft_config"):
        from grpo.lora import publish_named_tensors

        return publish_named_tensors(model)
    return list(model.named_parameters())


def request_weights(client: SyncClient, sampler_id: int, have_version: int, request_id: int,
                    timeout_s: float, method: str = "") -> tuple[bool, P.WeightsAnnounce | None, P.Stop | None]:
    """Sampler side of one sync: ask, then wait up to timeout_s for the answer to *this* request.

    Returns (answered, newest weights newer than have_version or None, stop or None).
    Answers to earlier requests (say, made while the learner was still loading) arrive late,
    in order, before ours: their weights are used if newer, but only the answer carrying our
    request_id ends the wait, so a sampler never settles for an out-of-date answer.
    """
    client.send(P.WeightsRequest(sampler_id=sampler_id, have_version=have_version, request_id=request_id,
                                 method=method))
    newest: P.WeightsAnnounce | None = None
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False, newest, None
        msg = client.receive(timeout_s=left)
        if msg is None:
            continue
        if isinstance(msg, P.Stop):
            return True, newest, msg
        if isinstance(msg, P.WeightsAnnounce) and msg.version > (newest.version if newest else have_version):
            newest = msg
        if getattr(msg, "request_id", -1) == request_id:
            return True, newest, None


@dataclass
class Snapshot:
    """One published version: the announcement and the CPU buckets it points into."""
    version: int
    announce: P.WeightsAnnounce
    created: float = field(default_factory=time.monotonic)
    slot: int = -1  # slot publishers (ipc/nccl): which slot holds this version


class TcpPublisher:
    """Learner rank 0: keeps the newest snapshot and serves it from a thread on the sync port.

    The thread answers each weights_request at once: weights if the sampler is behind,
    no_update if it is current, stop once the learner is finishing. It also records, per
    sampler, the version that sampler last reported, so the metrics show who runs what.
    """

    method = "tcp"

    def __init__(self, server: SyncServer, model: torch.nn.Module, dtype: torch.dtype | None = None,
                 start: bool = True):
        self.server = server
        # Samplers run in `dtype` (bf16 on GPU): publishing fp32 master weights would double
        # the bytes for nothing, since the sampler casts them down anyway.
        named = [(n, p if dtype is None else p.detach().to("meta", dtype)) for n, p in publish_named(model)]
        self.layout, self.bucket_dtypes, self.bucket_nbytes = plan_layout(named)
        self.coalescer = Coalescer(self.layout, self.bucket_nbytes)   # which tensors copy as one
        self._snapshot: Snapshot | None = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._closed = threading.Event()
        self.sampler_versions: dict[int, int] = {}
        self.bytes_served = 0
        self.replies = {"weights": 0, "no_update": 0, "stop": 0}
        self.stopped_samplers: set[int] = set()
        self.peers = None  # grpo.liveness.SyncPeers: binds a connection to one sampler id (set by the learner)
        self._thread = threading.Thread(target=self._serve, name="weight-sync", daemon=True)
        if start:   # a subclass starts it once its own state exists
            self._thread.start()

    def publish(self, version: int, model: torch.nn.Module) -> float:
        """Snapshot the model as `version`; returns the seconds the learner was stalled."""
        t0 = time.perf_counter()
        named = publish_named(model)
        buckets = pack(named, self.layout, self.bucket_nbytes, self.coalescer)
        announce = P.WeightsAnnounce(version=version, method="tcp", layout=self.layout,
                                     bucket_dtypes=self.bucket_dtypes, bucket_nbytes=self.bucket_nbytes,
                                     buckets=[memoryview(b.numpy()) for b in buckets])
        with self._lock:
            self._snapshot = Snapshot(version, announce)
        return time.perf_counter() - t0

    def stop_samplers(self) -> None:
        """From now on every request is answered with stop."""
        self._stopping.set()

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5)
        self.server.close()

    def _serve(self) -> None:
        while not self._closed.is_set():
            got = self.server.receive(timeout_s=0.1)
            if got is None:
                continue
            # Requests that queued up while we were busy (or before this thread existed, while
            # the model loaded) are answered only by each sampler's newest one: a sampler waits
            # for the answer to its latest request alone, and sending full weights to every
            # stale one would fill the ROUTER's queue to that peer (SNDHWM), so the answer
            # that matters would be dropped.
            latest: dict[bytes, P.WeightsRequest] = {}
            while got is not None:
                identity, msg = got
                if not isinstance(msg, P.WeightsRequest):
                    self.server.rejected["unexpected_kind"] += 1
                elif self.peers is not None and (why := self.peers.accept(identity, msg.sampler_id)):
                    self.server.rejected[why] += 1  # a made-up or borrowed sampler id: no answer
                elif identity not in latest or msg.request_id >= latest[identity].request_id:
                    latest[identity] = msg
                got = self.server.receive(timeout_s=0)
            for identity, msg in latest.items():
                self._answer(identity, msg)

    def guard(self):
        """Held around a training step and its publish (method shared locks; the others need nothing)."""
        return contextlib.nullcontext()

    def _on_request(self, identity: bytes, msg: P.WeightsRequest) -> None:
        """Hook: every request, before it is answered (ipc counts acknowledgements here)."""

    def _reply_weights(self, identity: bytes, msg: P.WeightsRequest, snap: Snapshot) -> int:
        # Same buckets (no copy), only the header differs: it echoes the request id.
        return self.server.reply(identity, dataclasses.replace(snap.announce, request_id=msg.request_id))

    def _answer(self, identity: bytes, msg: P.WeightsRequest) -> None:
        self.sampler_versions[msg.sampler_id] = msg.have_version
        self._on_request(identity, msg)
        with self._lock:
            snap = self._snapshot
        current = snap.version if snap else 0
        if self._stopping.is_set():
            self.server.reply(identity, P.Stop(version=current, reason="learner finished",
                                               request_id=msg.request_id))
            self.replies["stop"] += 1
            self.stopped_samplers.add(msg.sampler_id)
        elif snap is not None and msg.have_version < snap.version:
            self.bytes_served += self._reply_weights(identity, msg, snap)
            self.replies["weights"] += 1
        else:
            self.server.reply(identity, P.NoUpdate(version=current, request_id=msg.request_id))
            self.replies["no_update"] += 1
