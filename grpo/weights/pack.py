"""Copying the published tensors into flat buckets with as few copies as their memory allows.

`pack` fills new CPU buckets (a tcp snapshot); `Coalescer.copy_into` fills a device buffer (a slot).

The publishers lay every tensor out in flat per-dtype buckets (grpo.weights.layout.plan_layout:
buckets back to back, each tensor at a 16-byte aligned offset). Copying tensor by tensor
costs one copy per parameter (272 for SmolLM2-135M), although under DeepSpeed ZeRO-1/2 the
bf16 parameters are views of one flat buffer per parameter group, packed back to back in
`model.parameters()` order (stage_1_and_2.py: `_update_model_bit16_weights`; padding only at
the end of the group, or to 16 bytes per parameter with `zero_optimization.parameter_alignment`).

A *run* is a maximal sequence of consecutive tensors (publish order) that are byte-adjacent on
both sides: the same source storage, each contiguous and already in the published dtype,
each starting where the previous one ends in the source *and* in the flat buffer. A run of
two or more tensors is copied as one 1-D byte copy (a memcpy on CUDA, the same operation
as the raw copy floor); every other tensor (own storage, non-contiguous, a cast needed) goes
through one `torch._foreach_copy_`, as before. The bytes written are exactly those of the
per-tensor path: a run covers only the tensors' own bytes, never padding.

The plan is computed once and reused while every tensor's data_ptr stays the same (one tuple
compare per publish). Run sources hold a reference to their storage, so a parameter moved
elsewhere cannot have its old address reused while the plan lives: an unchanged data_ptr
really is the same memory. Tensors outside runs are always read from the live tensors.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from grpo.weights.layout import TORCH_DTYPES, bucket_slices, flat_offsets, spec_nbytes
from grpo.wire import messages as M

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Run:
    first: int            # index (publish order) of the run's first tensor
    count: int            # tensors it covers
    offset: int           # byte offset in the flat buffer (all buckets back to back)
    nbytes: int
    src: torch.Tensor     # 1-D uint8 view of the source bytes; keeps the source storage alive


@dataclass
class Plan:
    key: tuple[int, ...]                                # data_ptr of every tensor when planned
    runs: list[Run] = field(default_factory=list)       # runs of >= 2 tensors
    singles: list[int] = field(default_factory=list)    # tensors copied one by one

    @property
    def copies(self) -> int:
        return len(self.runs) + len(self.singles)


def _byte_view(t: torch.Tensor, nbytes: int) -> torch.Tensor:
    """uint8 view of `nbytes` of t's storage starting at t's first byte (beyond t's own end)."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(
        t.untyped_storage(), t.storage_offset() * t.element_size(), (nbytes,))


def plan_runs(tensors: list[torch.Tensor], dtypes: list[torch.dtype], shapes: list[tuple[int, ...]],
              offsets: list[int], nbytes: list[int]) -> Plan:
    """Group `tensors` (publish order) into runs; see the module docstring for the rule."""
    plan = Plan(key=tuple(t.data_ptr() for t in tensors))
    run: list[int] = []           # indices of the open run
    storage = src_end = dst_end = -1

    def close():
        if len(run) >= 2:
            first = tensors[run[0]]
            n = dst_end - offsets[run[0]]
            plan.runs.append(Run(run[0], len(run), offsets[run[0]], n, _byte_view(first, n)))
        elif run:
            plan.singles.append(run[0])
        run.clear()

    for i, t in enumerate(tensors):
        n = nbytes[i]
        if n == 0:
            continue   # no bytes on either side: nothing to copy, and no gap in a run
        if t.dtype != dtypes[i] or not t.is_contiguous() or tuple(t.shape) != shapes[i]:
            close()
            plan.singles.append(i)   # cast, strided or another shape: the per-tensor path (which raises on that)
            continue
        ptr, st = t.data_ptr(), t.untyped_storage().data_ptr()
        if not (run and st == storage and ptr == src_end and offsets[i] == dst_end
                and t.device == tensors[run[0]].device):
            close()
            storage = st
        run.append(i)
        src_end, dst_end = ptr + n, offsets[i] + n
    close()
    return plan


class Coalescer:
    """The plan for one layout, rebuilt whenever a tensor's data_ptr changes."""

    def __init__(self, layout: list[M.TensorSpec], bucket_nbytes: list[int]):
        self.layout = layout
        self.dtypes = [TORCH_DTYPES[s.dtype] for s in layout]
        self.shapes = [tuple(s.shape) for s in layout]
        self.offsets = flat_offsets(layout, bucket_nbytes)
        self.nbytes = [spec_nbytes(s) for s in layout]
        self.total = sum(bucket_nbytes)
        self.plan: Plan | None = None
        self.replans = 0
        self._targets: dict[object, tuple[Plan, int, list[torch.Tensor], list[torch.Tensor]]] = {}

    def plan_for(self, tensors: list[torch.Tensor]) -> Plan:
        if len(tensors) != len(self.layout):
            raise ValueError(f"{len(tensors)} tensors for a layout of {len(self.layout)}")
        plan = self.plan
        if plan is None or plan.key != tuple(t.data_ptr() for t in tensors):
            # Drop the old plan's views first, so a storage only they kept alive is freed.
            self.plan, self._targets = None, {}
            plan = self.plan = plan_runs(tensors, self.dtypes, self.shapes, self.offsets, self.nbytes)
            self.replans += 1
        return plan

    def _dsts(self, flat: torch.Tensor, plan: Plan, cache_key) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        hit = self._targets.get(cache_key) if cache_key is not None else None
        if hit is not None and hit[0] is plan and hit[1] == flat.data_ptr():
            return hit[2], hit[3]
        runs = [flat[r.offset:r.offset + r.nbytes] for r in plan.runs]
        singles = [flat[self.offsets[i]:self.offsets[i] + self.nbytes[i]].view(self.dtypes[i])
                   .view(self.shapes[i]) for i in plan.singles]
        if cache_key is not None:
            self._targets[cache_key] = (plan, flat.data_ptr(), runs, singles)
        return runs, singles

    def copy_into(self, flat: torch.Tensor, tensors: list[torch.Tensor], cache_key=None) -> Plan:
        """Write `tensors` into `flat` (uint8, the buckets back to back) at their layout offsets.

        `cache_key` names a buffer that is written again and again (an ipc slot): its
        destination views are then built once per plan, not per call.
        """
        if flat.dtype != torch.uint8 or flat.numel() < self.total:
            raise ValueError("copy_into needs a uint8 buffer holding every bucket")
        plan = self.plan_for(tensors)
        runs, singles = self._dsts(flat, plan, cache_key)
        with torch.no_grad():
            for dst, run in zip(runs, plan.runs):
                dst.copy_(run.src)   # device to device: a memcpy, enqueued without waiting
            if singles:
                torch._foreach_copy_(singles, [tensors[i] for i in plan.singles])   # casts where needed
        return plan



_PIN_FAILED = False


def _host_buffer(nbytes: int, pin: bool) -> torch.Tensor:
    """A CPU uint8 buffer: pinned if asked and the host allows it, else pageable (said once)."""
    global _PIN_FAILED
    if pin and not _PIN_FAILED:
        try:
            return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        except RuntimeError as exc:   # out of host memory or over the locked-memory limit
            _PIN_FAILED = True
            log.warning("weight snapshots: could not pin %.1f GB of host memory (%s); using pageable memory, "
                        "which makes each tcp publish slower", nbytes / 1e9, str(exc).splitlines()[0])
    return torch.empty(nbytes, dtype=torch.uint8)


def pack(named: list[tuple[str, torch.Tensor]], layout: list[M.TensorSpec],
         bucket_nbytes: list[int], coalescer: Coalescer | None = None) -> list[torch.Tensor]:
    """Copy the tensors into new CPU uint8 buckets (device-to-host for CUDA tensors, into pinned
    memory).

    A tensor whose dtype differs from its layout entry is cast first (fp32 master weights
    published as bf16), on its own device, so the host copy moves the smaller bytes.
    With a `coalescer`, tensors that are byte-adjacent in one storage and in
    the buckets (DeepSpeed's flat bf16 parameters) move in one host copy per run, not one each.
    """
    # One allocation, the buckets back to back (the offsets the coalescer plans with); each
    # bucket a slice of it, so a reply still sending any bucket keeps the whole snapshot alive.
    # Pinned when the tensors are on CUDA: a device-to-host copy into pageable memory goes through
    # the driver's staging buffer, many times slower, and the learner stalls throughout (figures:
    # docs/benchmarks.md, the memory-plan note). Torch's caching host allocator keeps a freed pinned
    # block for the next request of its size, so once this snapshot's last reply has let go (ZeroMQ
    # drops its references when the frames are on the wire) the next version reuses it: pinning is
    # paid once per snapshot alive at a time, not once a version (the first versions are slow, the
    # rest fast). Where the host cannot pin that much (RAM, ulimit -l), pageable memory as before.
    flat = _host_buffer(sum(bucket_nbytes), any(t.is_cuda for _, t in named) and torch.cuda.is_available())
    buckets = bucket_slices(flat, bucket_nbytes)
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
