"""The wire codec: ``encode`` a message to frames and ``decode`` (with every check) frames to a message.

Every ZeroMQ message is multipart: frame 0 is a msgpack map (the header), frames 1..n are raw
little-endian, C-contiguous array bytes described by ``header["arrays"]`` (docs/protocol.md).
Only msgpack is parsed, with ext types refused: a message from the network can only become
str/int/float/bool/list/dict values and numpy views. ``decode`` checks every field and every
size *before* it touches the payload, so a hostile or buggy peer costs at most one rejected
message (a ``ProtocolError`` whose ``.reason`` feeds drop counters).

Three modules: ``encode`` is grpo.wire.encode's (re-exported here); the checks every message
goes through (frames, header, array sizes, typed fields) are grpo.wire.checks'; this one decodes
each kind's body. Together they import only stdlib, numpy and msgpack, so any process (or test)
can use them without torch or zmq.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from grpo.wire.checks import (_Array, _arrays, _as_int, _as_str, _fail, _float_map, _get, _header, _int, _map,
                              _meta, _nbytes, _number, _shape, _str)
from grpo.wire.encode import encode  # noqa: F401 - re-exported: callers use codec.encode and codec.decode
from grpo.wire.messages import (DTYPE_SIZES, GROUP_ARRAYS, I64_MAX, IPC, MAX_ID_CHARS, MAX_IPC_HANDLE_BYTES,
                                MAX_LOG_PROB, MAX_REASON_CHARS, NCCL, NP_DTYPES, SHARED, TCP, WEIGHT_METHODS,
                                Completion, Frame, Group, IpcHandle, Limits, Message, NcclRendezvous, NoUpdate,
                                Origin, ProtocolError, RunFacts, SamplerStatus, Stop, TensorSpec, WeightsAnnounce,
                                WeightsRequest)

# ----------------------------------------------------------------------------- decode


def _decode_group(h: dict[str, Any], arrays: list[_Array], views: list[memoryview], limits: Limits) -> Group:
    names, expected = [a.name for a in arrays], [n for n, _ in GROUP_ARRAYS]
    if names != expected:
        raise _fail("bad_field", f"group arrays must be {expected}, got {names}")
    for (name, dtype), a in zip(GROUP_ARRAYS, arrays):
        if a.dtype != dtype:
            raise _fail("bad_dtype", f"{name} must be {dtype}, got {a.dtype}")
        if len(a.shape) != 1:
            raise _fail("bad_shape", f"{name} must be 1-D, got {list(a.shape)}")
    sampler_id = _int(h, "sampler_id", "group")
    group_id = _str(h, "group_id", "group", MAX_ID_CHARS)
    policy_version = _int(h, "policy_version", "group")
    prefix = _str(h, "prefix", "group")
    prefix_tokens = _get(h, "prefix_tokens", "group", list)
    if set(map(type, prefix_tokens)) - {str}:
        raise _fail("bad_field", "group.prefix_tokens must be a list of str")
    meta = _meta(_get(h, "meta", "group"))
    raw_completions = _get(h, "completions", "group", list)

    # Zero-copy views into the frames; nothing below copies token or log-prob data.
    prefix_ids, lengths, gen, old_lp, ref_lp, whole = (
        np.frombuffer(v, dtype=NP_DTYPES[a.dtype]) for a, v in zip(arrays, views)
    )
    G, P = len(raw_completions), len(prefix_ids)
    if not 1 <= G <= limits.max_completions or len(lengths) != G:
        raise _fail("bad_group_size", f"{G} completions, {len(lengths)} lengths (max {limits.max_completions})")
    if limits.group_size is not None and G != limits.group_size:
        raise _fail("bad_group_size", f"{G} completions != group_size {limits.group_size}")
    if P > limits.max_tokens or int(lengths.max()) > limits.max_tokens:  # G >= 1 here
        raise _fail("too_large", f"prefix or completion longer than max_tokens={limits.max_tokens}")
    if len(prefix_tokens) != P:
        raise _fail("length_mismatch", f"{len(prefix_tokens)} prefix_tokens for {P} prefix ids")
    if int(lengths.min()) < 0:
        raise _fail("length_mismatch", "negative generated length")
    total = int(lengths.sum(dtype=np.int64))
    # ref_policy_log_probs may be empty for the whole group: the run needs none (RunFacts).
    if not len(gen) == len(old_lp) == total or len(ref_lp) not in (0, total) or len(whole) != G * P + total:
        raise _fail("length_mismatch", f"sum(lengths)={total}, generated/old/ref/whole = "
                    f"{len(gen)}/{len(old_lp)}/{len(ref_lp)}/{len(whole)}, P={P}, G={G}")
    # Range-check the token ids once; whole is checked for equality against them below.
    for ids in (prefix_ids, gen):
        if len(ids) and (int(ids.min()) < 0 or (limits.vocab_size is not None and int(ids.max()) >= limits.vocab_size)):
            raise _fail("token_out_of_range", f"token ids in [{ids.min()}, {ids.max()}], vocab {limits.vocab_size}")
    for name, lp in (("old_policy_log_probs", old_lp), ("ref_policy_log_probs", ref_lp)):
        if not np.isfinite(lp).all():
            raise _fail("non_finite", f"{name} has NaN/inf")
        if len(lp) and float(lp.max()) > MAX_LOG_PROB:
            raise _fail("bad_log_prob", f"{name} max {float(lp.max())} > {MAX_LOG_PROB}")

    completions = []
    g0 = w0 = 0
    for i, (c, n) in enumerate(zip(raw_completions, lengths.tolist())):
        where = f"completions[{i}]"
        if type(c) is not dict:
            raise _fail("bad_field", f"{where} must be a map")
        text = _str(c, "text", where)
        reward = _number(_get(c, "reward", where), f"{where}.reward")
        reward_info = _float_map(_get(c, "reward_info", where), f"{where}.reward_info")
        is_finished = _get(c, "is_finished", where, bool)
        w = whole[w0 : w0 + P + n]
        g = gen[g0 : g0 + n]
        completions.append(Completion(g, old_lp[g0 : g0 + n], ref_lp[g0 : g0 + n] if len(ref_lp) else ref_lp, w,
                                      text, reward, reward_info, is_finished))
        g0, w0 = g0 + n, w0 + P + n
    # One comparison for all completions: whole == prefix ++ generated_i, for every i. Its size
    # (G*P + N) was checked against the frame above.
    expected = np.concatenate([part for c in completions for part in (prefix_ids, c.generated_token_ids)])
    if not np.array_equal(whole, expected):
        raise _fail("length_mismatch", "whole_token_ids != prefix ++ generated for some completion")
    max_version = _int(h, "max_version", "group", lo=policy_version) if "max_version" in h else -1   # optional
    seq = _int(h, "seq", "group") if "seq" in h else 0   # optional
    return Group(sampler_id, group_id, policy_version, prefix, prefix_tokens, prefix_ids, completions, meta,
                 _incarnation(h, "group"), max_version, seq)


def _incarnation(h: dict[str, Any], where: str) -> int:
    # Optional (absent: 0), so senders from before it existed still decode.
    return _int(h, "incarnation", where) if "incarnation" in h else 0


def _layout(h: dict[str, Any], bucket_dtypes: list[str], bucket_nbytes: list[int]) -> list[TensorSpec]:
    specs: list[TensorSpec] = []
    names: set[str] = set()
    extents: list[list[tuple[int, int, str]]] = [[] for _ in bucket_dtypes]
    for i, t in enumerate(_get(h, "layout", "weights", list)):
        if type(t) is not list or len(t) != 5:
            raise _fail("bad_field", f"layout[{i}] must be [name, dtype, shape, bucket, offset]")
        name = _as_str(t[0], f"layout[{i}].name", 1024)
        dtype = _as_str(t[1], f"{name}.dtype", MAX_ID_CHARS)
        shape = _shape(t[2], name)
        bucket = _as_int(t[3], f"{name}.bucket", 0, len(bucket_dtypes) - 1)
        offset = _as_int(t[4], f"{name}.offset")
        if name in names:
            raise _fail("bad_field", f"duplicate tensor name {name!r}")
        names.add(name)
        if dtype not in DTYPE_SIZES or dtype != bucket_dtypes[bucket]:
            raise _fail("bad_dtype", f"{name}: dtype {dtype!r} != bucket {bucket} dtype {bucket_dtypes[bucket]!r}")
        nbytes = _nbytes(shape, dtype)
        # Aligned offsets let the receiver view the bucket as `dtype` without copying.
        if offset % DTYPE_SIZES[dtype] or offset + nbytes > bucket_nbytes[bucket]:
            raise _fail("bad_shape", f"{name}: [{offset}, {offset + nbytes}) misaligned or outside bucket "
                        f"{bucket} of {bucket_nbytes[bucket]} bytes")
        if nbytes:
            extents[bucket].append((offset, offset + nbytes, name))
        specs.append(TensorSpec(name, dtype, shape, bucket, offset))
    for b, ext in enumerate(extents):
        ext.sort()
        for (_, end, a), (start, _, c) in zip(ext, ext[1:]):
            if start < end:
                raise _fail("bad_shape", f"tensors {a!r} and {c!r} overlap in bucket {b}")
    return specs


def _decode_weights(h: dict[str, Any], arrays: list[_Array], views: list[memoryview]) -> WeightsAnnounce:
    version = _int(h, "version", "weights")
    method = _str(h, "method", "weights", MAX_ID_CHARS)
    if method not in WEIGHT_METHODS:
        raise _fail("bad_field", f"unknown weights method {method!r}")
    bucket_dtypes = _get(h, "bucket_dtypes", "weights", list)
    bucket_nbytes = _get(h, "bucket_nbytes", "weights", list)
    if len(bucket_dtypes) != len(bucket_nbytes):
        raise _fail("bad_field", f"{len(bucket_dtypes)} bucket_dtypes vs {len(bucket_nbytes)} bucket_nbytes")
    for i, d in enumerate(bucket_dtypes):
        if type(d) is not str or d not in DTYPE_SIZES:
            raise _fail("bad_dtype", f"bucket {i}: unknown dtype {d!r}")
    for i, n in enumerate(bucket_nbytes):
        _as_int(n, f"weights.bucket_nbytes[{i}]")
    layout = _layout(h, bucket_dtypes, bucket_nbytes)
    expected = len(bucket_nbytes) if method == TCP else 0  # other methods carry buckets out of band
    if len(arrays) != expected:
        raise _fail("frame_size", f"method {method}: {len(arrays)} bucket frames, expected {expected}")
    for i, (a, n) in enumerate(zip(arrays, bucket_nbytes)):
        if a.name != f"bucket_{i}" or a.dtype != "uint8" or len(a.shape) != 1:
            raise _fail("bad_field", f"bucket frame {i} must be bucket_{i}, uint8, 1-D")
        if a.nbytes != n:
            raise _fail("length_mismatch", f"bucket {i}: frame {a.nbytes} bytes, declared {n}")
    ipc = _ipc_handle(h.get("ipc"), sum(bucket_nbytes)) if method == IPC else None
    nccl = None
    if method == NCCL:
        m = _map(h.get("nccl"), "weights.nccl")
        backend = _str(m, "backend", "weights.nccl", MAX_ID_CHARS)
        if backend not in ("nccl", "gloo"):
            raise _fail("bad_field", f"weights.nccl.backend must be nccl or gloo, got {backend!r}")
        nccl = NcclRendezvous(_str(m, "host", "weights.nccl", 255), _int(m, "port", "weights.nccl") if
                              0 < _int(m, "port", "weights.nccl") < 65536 else _port_error(), backend)
    shared = None
    if method == SHARED:
        items = _get(h, "shared", "weights", list)
        if len(items) != len(bucket_nbytes):
            raise _fail("bad_field", f"weights.shared: {len(items)} handles for {len(bucket_nbytes)} storages")
        shared = [_ipc_handle(x, 0, stamped=False) for x in items]   # no stamp: the file lock orders access
        for i, (x, n) in enumerate(zip(shared, bucket_nbytes)):
            if x.storage_nbytes != n:
                raise _fail("bad_shape", f"weights.shared[{i}]: storage of {x.storage_nbytes} bytes, layout says {n}")
    return WeightsAnnounce(version, method, layout, bucket_dtypes, bucket_nbytes, list(views),
                           _int(h, "request_id", "weights", lo=-1), ipc, nccl, shared, _run_facts(h), _levels(h),
                           *_counts(h))


def _counts(h: dict[str, Any]) -> tuple[int, int, int]:
    """An answer's optional (queued, budget, counted): -1 when absent."""
    return tuple(_as_int(h[k], k, lo=-1) if k in h else -1  # type: ignore[return-value]
                 for k in ("queued", "budget", "counted"))


def _levels(h: dict[str, Any]) -> dict[str, int] | None:
    """The optional `levels` map of an answer: task name -> curriculum level (absent: None)."""
    if "levels" not in h:
        return None
    return {k: _as_int(v, f"levels.{k}") for k, v in _map(h["levels"], "levels").items()}


def _run_facts(h: dict[str, Any]) -> RunFacts | None:
    """The optional `run` map of an answer on the sync channel (absent: None)."""
    if "run" not in h:
        return None
    m, w = _map(h["run"], "run"), "run"
    dtype = _str(m, "dtype", w, MAX_ID_CHARS)
    if dtype not in DTYPE_SIZES:
        raise _fail("bad_dtype", f"run.dtype {dtype!r}")
    temperature = _number(_get(m, "temperature", w), "run.temperature")
    if temperature <= 0:
        raise _fail("bad_field", f"run.temperature={temperature} must be > 0")
    return RunFacts(schema=_int(m, "schema", w), model=_str(m, "model", w, MAX_REASON_CHARS),
                    vocab_size=_int(m, "vocab_size", w, lo=1), dtype=dtype,
                    num_generations=_int(m, "num_generations", w, lo=1),
                    max_new_tokens=_int(m, "max_new_tokens", w, lo=1),
                    max_prompt_tokens=_int(m, "max_prompt_tokens", w, lo=1), temperature=temperature,
                    needs_ref_logprobs=_get(m, "needs_ref_logprobs", w, bool),
                    max_staleness=_int(m, "max_staleness", w),
                    groups_per_step=_int(m, "groups_per_step", w) if "groups_per_step" in m else 0)


def _port_error() -> int:
    raise _fail("bad_field", "weights.nccl.port must be in 1..65535")


def _bytes(m: dict[str, Any], key: str, max_len: int) -> bytes:
    v = _get(m, key, "weights.ipc")
    if type(v) is not bytes or len(v) > max_len:
        raise _fail("bad_field", f"weights.ipc.{key} must be bytes of at most {max_len}")
    return v


def _ipc_handle(v: Any, buckets_nbytes: int, stamped: bool = True) -> IpcHandle:
    m = _map(v, "weights.ipc")
    stamp = _int(m, "stamp_offset", "weights.ipc")
    size = _int(m, "storage_nbytes", "weights.ipc")
    if stamped and (stamp < buckets_nbytes or stamp % 8 or stamp + 8 > size):
        raise _fail("bad_shape", f"weights.ipc: stamp at {stamp} must follow {buckets_nbytes} bucket bytes "
                    f"inside {size} bytes")
    sync = _get(m, "event_sync_required", "weights.ipc", bool)
    return IpcHandle(_str(m, "gpu_uuid", "weights.ipc", MAX_ID_CHARS), _int(m, "slot", "weights.ipc"),
                     _bytes(m, "handle", MAX_IPC_HANDLE_BYTES), size, _int(m, "storage_offset", "weights.ipc"),
                     _bytes(m, "ref_counter_handle", 4096), _int(m, "ref_counter_offset", "weights.ipc"),
                     _bytes(m, "event_handle", 256), sync, stamp)


def decode(frames: Sequence[Frame], limits: Limits = Limits()) -> Message:
    """Parse and fully validate one multipart message; raise ProtocolError if it must be dropped.

    Arrays are zero-copy views of the frames (read-only when the frames are), so they stay
    valid as long as the caller keeps the returned object. A rejected group or status whose
    header was valid carries the sender it names in ``exc.origin``.
    """
    h, views = _header(frames, limits)
    try:
        return _decode_body(h, views, limits)
    except ProtocolError as exc:
        exc.origin = _origin(h)
        raise


def _origin(h: dict[str, Any]) -> Origin | None:
    """The (kind, sampler_id, incarnation, seq) a valid header names, for a group or a status."""
    sid, inc, seq = h.get("sampler_id"), h.get("incarnation", 0), h.get("seq", 0)
    if h.get("kind") in ("group", "status") and type(sid) is int and type(inc) is int \
            and 0 <= sid <= I64_MAX and 0 <= inc <= I64_MAX:
        return Origin(h["kind"], sid, inc, seq if type(seq) is int and 0 <= seq <= I64_MAX else 0)
    return None


def _decode_body(h: dict[str, Any], views: list[memoryview], limits: Limits) -> Message:
    arrays, payload = _arrays(h, limits), views[1:]
    if len(payload) != len(arrays):
        raise _fail("frame_size", f"{len(views)} frames for {len(arrays)} arrays")
    for a, v in zip(arrays, payload):  # sizes were bounded by _arrays before we compare
        if v.nbytes != a.nbytes:
            raise _fail("frame_size", f"{a.name}: frame has {v.nbytes} bytes, shape needs {a.nbytes}")
    kind = h["kind"]
    if kind == "group":
        return _decode_group(h, arrays, payload, limits)
    if kind == "weights":
        return _decode_weights(h, arrays, payload)
    if arrays:  # only group and weights carry array frames
        raise _fail("frame_size", f"kind {kind!r} carries no arrays, got {len(arrays)}")
    if kind == "status":
        return SamplerStatus(_int(h, "sampler_id", kind), _int(h, "policy_version", kind),
                             _int(h, "groups_sent", kind), _get(h, "final", kind, bool),
                             _float_map(_get(h, "stats", kind), "status.stats"), _incarnation(h, kind))
    if kind == "weights_request":
        method = h.get("method", "")
        if method != "" and method not in WEIGHT_METHODS:
            raise _fail("bad_field", f"weights_request.method: unknown method {method!r}")
        return WeightsRequest(_int(h, "sampler_id", kind), _int(h, "have_version", kind, lo=-1),
                              _int(h, "request_id", kind), method, _int(h, "sent", kind, lo=-1) if "sent" in h else -1,
                              _incarnation(h, kind))
    if kind == "no_update":
        return NoUpdate(_int(h, "version", kind), _int(h, "request_id", kind, lo=-1), _run_facts(h), _levels(h),
                        *_counts(h))
    return Stop(_int(h, "version", kind), _str(h, "reason", kind, MAX_REASON_CHARS),
                _int(h, "request_id", kind, lo=-1), _run_facts(h), _levels(h))
