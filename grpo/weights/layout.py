"""The layout every weight-sync method shares: flat per-dtype buckets and where each tensor sits.

A *layout* is one `TensorSpec` per published tensor (name, dtype, shape, bucket, byte offset);
the *buckets* are flat byte buffers, one run of buckets per dtype. Publishers that keep all
buckets in one allocation (the ipc slots, the tcp snapshot) lay them back to back in bucket
order: `bucket_starts` is the one rule for where each bucket begins, and every offset below is
computed from it. The dtype table is the one map between the wire's dtype names and torch's.
"""
from __future__ import annotations

import torch

from grpo.wire import messages as M

DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16",
               torch.int32: "int32", torch.int64: "int64", torch.uint8: "uint8"}
TORCH_DTYPES = {v: k for k, v in DTYPE_NAMES.items()}
MAX_BUCKET_BYTES = 1 << 30  # one ZeroMQ frame per bucket; 1 GiB keeps frames a sane size
ALIGN = 16  # every tensor starts 16-byte aligned, so a typed view of a bucket is always legal


def plan_layout(named: list[tuple[str, torch.Tensor]],
                max_bucket_bytes: int = MAX_BUCKET_BYTES) -> tuple[list[M.TensorSpec], list[str], list[int]]:
    """Assign every tensor a bucket and byte offset: one run of buckets per dtype, in name order."""
    layout: list[M.TensorSpec] = []
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
        offset = bucket_nbytes[b]
        layout.append(M.TensorSpec(name=name, dtype=dt, shape=tuple(t.shape), bucket=b, offset=offset))
        bucket_nbytes[b] = offset + ((nbytes + ALIGN - 1) // ALIGN) * ALIGN
    return layout, bucket_dtypes, bucket_nbytes


def spec_nbytes(spec: M.TensorSpec) -> int:
    """Bytes of one tensor's data (without its alignment padding)."""
    n = 1
    for d in spec.shape:
        n *= int(d)
    return n * M.DTYPE_SIZES[spec.dtype]


def bucket_starts(bucket_nbytes: list[int]) -> list[int]:
    """Where each bucket begins when the buckets lie back to back in one buffer."""
    starts, at = [], 0
    for n in bucket_nbytes:
        starts.append(at)
        at += int(n)
    return starts


def flat_offsets(layout: list[M.TensorSpec], bucket_nbytes: list[int]) -> list[int]:
    """Each tensor's byte offset in one buffer holding the buckets back to back."""
    starts = bucket_starts(bucket_nbytes)
    return [starts[s.bucket] + s.offset for s in layout]


def bucket_slices(flat, bucket_nbytes: list[int]) -> list:
    """The buckets as slices of one back-to-back buffer (a tensor or anything sliceable)."""
    return [flat[s:s + int(n)] for s, n in zip(bucket_starts(bucket_nbytes), bucket_nbytes)]


def unpack_views(layout: list[M.TensorSpec], buckets: list) -> dict[str, torch.Tensor]:
    """Typed, shaped views into buckets (received bytes or uint8 tensors); no copy."""
    out: dict[str, torch.Tensor] = {}
    flat = [torch.frombuffer(b, dtype=torch.uint8) if not isinstance(b, torch.Tensor) else b for b in buckets]
    for spec in layout:
        raw = flat[spec.bucket][spec.offset:spec.offset + spec_nbytes(spec)]
        out[spec.name] = raw.view(TORCH_DTYPES[spec.dtype]).view(spec.shape)
    return out


def flat_views(flat: torch.Tensor, layout: list[M.TensorSpec], bucket_nbytes: list[int]) -> dict[str, torch.Tensor]:
    """Typed views of every tensor inside one back-to-back uint8 buffer."""
    return unpack_views(layout, bucket_slices(flat, bucket_nbytes))
