"""Method "shared": sampler and learner on one GPU, one copy of the weights.

Learner rank 0 exports CUDA IPC handles of the storages its parameters live in (DeepSpeed
ZeRO-2 keeps the bf16 parameters as views of a few flat buffers, updated in place); the
sampler maps them once and points its policy's parameters at them. Nothing is copied, ever:
the sampler generates with the learner's live weights.

Enforcement, so that no token is sampled from half-updated weights: an exclusive file lock
(`fcntl.flock` on /tmp/grpo-shared-<sync port>.lock; both processes are on one host).
The learner holds it while it trains a step and publishes the new version number; the
sampler holds it for a whole round: weights request, generation, old log-probs. So the
sampler generates only between learner steps, and the version it is told is the version of
the weights it reads. The price is that the two alternate instead of overlapping (as
TRL's colocated mode does); use ipc when they have GPUs of their own.
"""
from __future__ import annotations

import fcntl
import logging
import os
import time
from contextlib import contextmanager

import torch

from grpo.weights.ipc import local_index_of, open_handle, share_storage
from grpo.weights.layout import DTYPE_NAMES, TORCH_DTYPES
from grpo.weights.publisher import Publisher, Snapshot
from grpo.wire import messages as M
from grpo.wire.transport import Server

log = logging.getLogger(__name__)


def lock_path(sync_port: int) -> str:
    return os.path.join(os.environ.get("TMPDIR", "/tmp"), f"grpo-shared-{sync_port}.lock")


@contextmanager
def exclusive(path: str):
    """Hold the exclusive lock on `path` for the block; returns how long we waited in .waited."""
    fh = open(path, "a")
    t0 = time.perf_counter()
    fcntl.flock(fh, fcntl.LOCK_EX)
    try:
        yield time.perf_counter() - t0
    finally:
        fcntl.flock(fh, fcntl.LOCK_UN)
        fh.close()


class SharedPublisher(Publisher):
    """Learner rank 0 on CUDA: announces the parameters' own storages; publish copies nothing."""

    method = M.SHARED

    def __init__(self, server: Server, model: torch.nn.Module, sync_port: int, answers=None):
        super().__init__(server, model, None, start=False, answers=answers)
        named = list(model.named_parameters())
        device = named[0][1].device
        storages: dict[int, int] = {}
        self._storages: list[torch.UntypedStorage] = []
        layout: list[M.TensorSpec] = []
        dtypes: list[str] = []
        for name, p in named:
            if p.device != device or not p.is_contiguous():
                raise ValueError(f"--weight-sync shared: parameter {name} is not a contiguous tensor on {device}")
            st = p.untyped_storage()
            idx = storages.setdefault(st.data_ptr(), len(storages))
            if idx == len(self._storages):
                self._storages.append(st)
                dtypes.append(DTYPE_NAMES[p.dtype])
            elif dtypes[idx] != DTYPE_NAMES[p.dtype]:
                raise ValueError("--weight-sync shared: one storage holds parameters of two dtypes")
            layout.append(M.TensorSpec(name, DTYPE_NAMES[p.dtype], tuple(p.shape), idx,
                                       p.storage_offset() * p.element_size()))
        self.layout, self.bucket_dtypes = layout, dtypes
        self.bucket_nbytes = [st.nbytes() for st in self._storages]
        self.handles = [share_storage(st, device.index, i, 0) for i, st in enumerate(self._storages)]
        self.lock = lock_path(sync_port)
        self.guard_waits_s: list[float] = []
        self._thread.start()
        log.info("weight sync: shared, %d storage(s) of %.1f MB on GPU %s; lock %s", len(self._storages),
                 sum(self.bucket_nbytes) / 1e6, self.handles[0].gpu_uuid, self.lock)

    @contextmanager
    def guard(self):
        """Around a training step and its publish: the sampler is not generating meanwhile."""
        with exclusive(self.lock) as waited:
            self.guard_waits_s.append(waited)
            yield

    def publish(self, version: int, model: torch.nn.Module) -> float:
        t0 = time.perf_counter()
        torch.cuda.current_stream().synchronize()   # the step's writes have landed before we say v
        announce = M.WeightsAnnounce(version=version, method=M.SHARED, layout=self.layout,
                                     bucket_dtypes=self.bucket_dtypes, bucket_nbytes=self.bucket_nbytes,
                                     buckets=[], shared=self.handles)
        with self._lock:
            self._snapshot = Snapshot(version, announce)
        return time.perf_counter() - t0


class SharedReceiver:
    """Sampler side: maps the learner's storages and points the policy's parameters into them."""

    def __init__(self, model: torch.nn.Module, sync_port: int):
        self.model = model
        self.lock = lock_path(sync_port)
        self.mapped = False

    def guard(self):
        return exclusive(self.lock)

    def apply(self, announce: M.WeightsAnnounce) -> bool:
        if self.mapped:
            return True   # the same storages, updated in place by the learner: nothing to do
        params = dict(self.model.named_parameters())
        own = next(iter(params.values())).device
        if {s.name for s in announce.layout} != set(params):
            raise ValueError(f"weights v{announce.version} do not match this model")
        bases = []
        for h in announce.shared:
            index = local_index_of(h.gpu_uuid)
            if index is None or own.type != "cuda" or index != own.index:
                raise RuntimeError(f"shared needs the learner on this sampler's own GPU ({own}); "
                                   f"the learner's is {h.gpu_uuid}")
            bases.append(open_handle(h, index))
        for spec in announce.layout:
            p = params[spec.name]
            dtype = TORCH_DTYPES[spec.dtype]
            if tuple(p.shape) != tuple(spec.shape) or p.dtype != dtype:
                raise ValueError(f"{spec.name}: learner has {spec.dtype}{list(spec.shape)}, sampler {p.dtype}{list(p.shape)}")
            n = p.numel() * p.element_size()
            p.data = bases[spec.bucket][spec.offset:spec.offset + n].view(dtype).view(spec.shape)
        self.mapped = True
        return True
