"""Encoding: ``encode`` a message to frames (the codec's sending half; ``grpo.wire.codec`` re-exports it).

Frame 0 is the msgpack header, frames 1..n the raw little-endian, C-contiguous arrays it describes
(docs/protocol.md); arrays go out as memoryviews, without a copy where they already have the wire
dtype. Nothing is checked here: ``decode`` is the gatekeeper. Imports only stdlib, numpy and msgpack.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import msgpack
import numpy as np

from grpo.wire.messages import (GROUP_ARRAYS, SCHEMA_VERSION, TCP, Group, Message, NoUpdate, SamplerStatus, Stop,
                                WeightsAnnounce, WeightsRequest)

def _flat(x: Any, dtype: str) -> np.ndarray:
    # No copy when x already is a C-contiguous 1-D array of the wire dtype.
    return np.ascontiguousarray(np.asarray(x, dtype=dtype).reshape(-1))


def _cat(parts: list[Any], dtype: str) -> np.ndarray:
    return np.concatenate([_flat(p, dtype) for p in parts]) if parts else np.zeros(0, dtype)


def _scalar(obj: Any) -> Any:
    # msgpack `default` hook: numpy scalars (np.int64, np.bool_, np.float32) -> Python scalars.
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot pack {type(obj).__name__}")


def _pack(kind: str, fields: dict[str, Any], arrays: list[dict[str, Any]]) -> bytes:
    header = {"schema": SCHEMA_VERSION, "kind": kind, **fields, "arrays": arrays}
    return msgpack.packb(header, use_bin_type=True, default=_scalar)


def _encode_group(g: Group) -> list[bytes | memoryview]:
    cs = g.completions
    gen = [_flat(c.generated_token_ids, "<i4") for c in cs]
    arrays = [
        _flat(g.prefix_token_ids, "<i4"),
        np.array([len(x) for x in gen], dtype="<i4"),
        _cat(gen, "<i4"),
        _cat([c.old_policy_log_probs for c in cs], "<f4"),
        _cat([c.ref_policy_log_probs for c in cs], "<f4"),
        _cat([c.whole_token_ids for c in cs], "<i4"),
    ]
    completions = [
        {"text": c.text, "reward": float(c.reward), "is_finished": bool(c.is_finished),
         "reward_info": {k: float(v) for k, v in c.reward_info.items()}}
        for c in cs
    ]
    fields = {"sampler_id": g.sampler_id, "group_id": g.group_id, "policy_version": g.policy_version,
              "prefix": g.prefix, "prefix_tokens": list(g.prefix_tokens), "meta": dict(g.meta),
              "completions": completions, "incarnation": g.incarnation}
    if g.max_version >= 0:   # optional: a reader that predates it ignores the key
        fields["max_version"] = g.max_version
    if g.seq > 0:   # optional, as max_version
        fields["seq"] = g.seq
    descs = [{"name": n, "dtype": d, "shape": [len(a)]} for (n, d), a in zip(GROUP_ARRAYS, arrays)]
    # memoryview of a contiguous array: zmq sends it with copy=False, no bytes() copy.
    return [_pack("group", fields, descs), *(memoryview(a) for a in arrays)]


def _encode_weights(w: WeightsAnnounce) -> list[bytes | memoryview]:
    fields = {"version": w.version, "method": w.method, "request_id": w.request_id,
              "layout": [[t.name, t.dtype, list(t.shape), t.bucket, t.offset] for t in w.layout],
              "bucket_dtypes": list(w.bucket_dtypes), "bucket_nbytes": list(w.bucket_nbytes)}
    if w.ipc is not None:
        fields["ipc"] = dataclasses.asdict(w.ipc)
    if w.nccl is not None:
        fields["nccl"] = dataclasses.asdict(w.nccl)
    if w.shared is not None:
        fields["shared"] = [dataclasses.asdict(h) for h in w.shared]
    if w.run is not None:
        fields["run"] = dataclasses.asdict(w.run)
    if w.levels is not None:
        fields["levels"] = dict(w.levels)
    fields.update({k: getattr(w, k) for k in ("queued", "budget", "counted") if getattr(w, k) >= 0})
    frames = [memoryview(b) for b in w.buckets] if w.method == TCP else []
    descs = [{"name": f"bucket_{i}", "dtype": "uint8", "shape": [f.nbytes]} for i, f in enumerate(frames)]
    return [_pack("weights", fields, descs), *frames]


_SIMPLE_KINDS = {SamplerStatus: "status", WeightsRequest: "weights_request", NoUpdate: "no_update", Stop: "stop"}


def encode(msg: Message) -> list[bytes | memoryview]:
    """Serialize ``msg`` to frames. Does not validate: ``decode`` is the gatekeeper."""
    if isinstance(msg, Group):
        return _encode_group(msg)
    if isinstance(msg, WeightsAnnounce):
        return _encode_weights(msg)
    if type(msg) in _SIMPLE_KINDS:  # header-only kinds: the fields are the dataclass fields (run: when set)
        # Optional fields are left out when unset (None, or -1 for the counts).
        fields = {k: v for k, v in dataclasses.asdict(msg).items()
                  if not (k in ("run", "levels") and v is None) and not (k in ("queued", "budget", "counted", "sent") and v == -1)}
        return [_pack(_SIMPLE_KINDS[type(msg)], fields, [])]
    raise TypeError(f"cannot encode {type(msg).__name__}")
