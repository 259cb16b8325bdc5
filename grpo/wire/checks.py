"""The checks every decoded message goes through before its kind's own (``grpo.wire.codec``'s helpers).

Framing: the frames are a list of contiguous buffers within the limits, frame 0 a msgpack map
(ext types refused, the timestamp too) of the right schema and a known kind, and every declared
array a known dtype and shape whose size is bounded before any payload is looked at. Fields: each
value exactly its type (a bool is not an int), ints in range, strings and maps bounded, numbers
finite. Every failure is a ``ProtocolError`` with its reason code. Imports only stdlib and msgpack.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import msgpack

from grpo.wire.messages import (DTYPE_SIZES, I64_MAX, KINDS, MAX_ID_CHARS, MAX_MAP_ITEMS, SCHEMA_VERSION, Frame,
                                Limits, ProtocolError)

# ----------------------------------------------------------------------------- field checks


_fail = ProtocolError  # short alias: `raise _fail(reason, detail)`


def _get(m: dict[str, Any], key: str, where: str, typ: type | None = None) -> Any:
    """m[key], which must exist and, if typ is given, be exactly a typ (a bool is not an int)."""
    if key not in m:
        raise _fail("bad_field", f"{where}: missing {key!r}")
    if typ is not None and type(m[key]) is not typ:
        raise _fail("bad_field", f"{where}.{key} must be {typ.__name__}, got {type(m[key]).__name__}")
    return m[key]


def _as_int(v: Any, where: str, lo: int = 0, hi: int = I64_MAX) -> int:
    if type(v) is not int:  # `type is`, not isinstance: True/False are ints in Python
        raise _fail("bad_field", f"{where} must be int, got {type(v).__name__}")
    if not lo <= v <= hi:
        raise _fail("bad_field", f"{where}={v} outside [{lo}, {hi}]")
    return v


def _as_str(v: Any, where: str, max_chars: int | None = None) -> str:
    if type(v) is not str:
        raise _fail("bad_field", f"{where} must be str, got {type(v).__name__}")
    if max_chars is not None and len(v) > max_chars:
        raise _fail("bad_field", f"{where} longer than {max_chars} chars")
    return v


def _int(m: dict[str, Any], key: str, where: str, lo: int = 0) -> int:
    return _as_int(_get(m, key, where), f"{where}.{key}", lo)


def _str(m: dict[str, Any], key: str, where: str, max_chars: int | None = None) -> str:
    return _as_str(_get(m, key, where), f"{where}.{key}", max_chars)


def _number(v: Any, where: str) -> float:
    # Ints are accepted for float fields: other languages may pack 1.0 as 1.
    if type(v) not in (int, float):
        raise _fail("bad_field", f"{where} must be a number, got {type(v).__name__}")
    f = float(v)
    if not math.isfinite(f):
        raise _fail("non_finite", f"{where} is {f}")
    return f


def _map(v: Any, where: str) -> dict[str, Any]:
    if type(v) is not dict or len(v) > MAX_MAP_ITEMS:
        raise _fail("bad_field", f"{where} must be a map of at most {MAX_MAP_ITEMS} items")
    for k in v:
        if type(k) is not str or len(k) > MAX_ID_CHARS:
            raise _fail("bad_field", f"{where} keys must be str of <= {MAX_ID_CHARS} chars")
    return v


def _float_map(v: Any, where: str) -> dict[str, float]:
    return {k: _number(x, f"{where}[{k!r}]") for k, x in _map(v, where).items()}


def _meta(v: Any) -> dict[str, object]:
    for k, x in _map(v, "meta").items():
        if type(x) is float:
            _number(x, f"meta[{k!r}]")
        elif type(x) not in (str, int, bool):
            raise _fail("bad_field", f"meta[{k!r}] must be str|int|float|bool")
    return v


# ----------------------------------------------------------------------------- framing


@dataclass(frozen=True)
class _Array:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


def _shape(v: Any, where: str) -> tuple[int, ...]:
    if type(v) is not list or len(v) > 8 or any(type(s) is not int or s < 0 for s in v):
        raise _fail("bad_shape", f"{where}: shape must be a list of non-negative ints")
    return tuple(v)


def _nbytes(shape: tuple[int, ...], dtype: str) -> int:
    # Python ints: a declared 2**40 elements is just a big number, nothing is allocated.
    return math.prod(shape) * DTYPE_SIZES[dtype]


def _arrays(header: dict[str, Any], limits: Limits) -> list[_Array]:
    raw = header.get("arrays", [])  # kinds without payload may omit it
    if type(raw) is not list:
        raise _fail("bad_field", "arrays must be a list")
    if len(raw) + 1 > limits.max_frames:
        raise _fail("too_large", f"{len(raw)} arrays > max_frames-1")
    out = []
    for i, d in enumerate(raw):
        if type(d) is not dict:
            raise _fail("bad_field", f"arrays[{i}] must be a map")
        name = _str(d, "name", f"arrays[{i}]", MAX_ID_CHARS)
        dtype = _str(d, "dtype", f"arrays[{i}]", MAX_ID_CHARS)
        if dtype not in DTYPE_SIZES:
            raise _fail("bad_dtype", f"{name}: unknown dtype {dtype!r}")
        shape = _shape(_get(d, "shape", f"arrays[{i}]"), name)
        nbytes = _nbytes(shape, dtype)
        if nbytes > limits.max_array_bytes:
            raise _fail("too_large", f"{name}: {nbytes} bytes > {limits.max_array_bytes}")
        out.append(_Array(name, dtype, shape, nbytes))
    return out


def _view(frame: Frame) -> memoryview:
    """Zero-copy byte view of a frame (bytes, memoryview, or zmq.Frame via .buffer)."""
    buf = frame.buffer if hasattr(frame, "buffer") else frame
    try:
        mv = memoryview(buf)
        return mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B")
    except (TypeError, ValueError) as e:  # not a buffer, or not C-contiguous
        raise _fail("not_multipart", f"frame is not a contiguous bytes-like buffer: {e}") from None


def _reject_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"msgpack ext type {code} not allowed")


def _has_timestamp(tree: Any) -> bool:
    # msgpack decodes ext type -1 into a Timestamp itself, without calling ext_hook, so it
    # is looked for here: every ext type is refused the same way, wherever it sits.
    stack = [tree]
    while stack:
        node = stack.pop()
        if type(node) is dict:
            stack.extend(node.values())
        elif type(node) is list:
            stack.extend(node)
        elif type(node) is msgpack.Timestamp:
            return True
    return False


def _header(frames: Sequence[Frame], limits: Limits) -> tuple[dict[str, Any], list[memoryview]]:
    if isinstance(frames, (bytes, bytearray, memoryview, str)) or not isinstance(frames, Sequence):
        raise _fail("not_multipart", f"expected a list of frames, got {type(frames).__name__}")
    if len(frames) == 0:
        raise _fail("not_multipart", "no frames")
    if len(frames) > limits.max_frames:
        raise _fail("too_large", f"{len(frames)} frames > {limits.max_frames}")
    views = [_view(f) for f in frames]
    if views[0].nbytes > limits.max_header_bytes:
        raise _fail("too_large", f"header {views[0].nbytes} bytes > {limits.max_header_bytes}")
    try:
        header = msgpack.unpackb(views[0], raw=False, strict_map_key=True, ext_hook=_reject_ext,
                                 use_list=True)
    except Exception as e:  # any malformed input; msgpack raises several types
        raise _fail("bad_header", f"undecodable msgpack header: {type(e).__name__}: {e}") from None
    if type(header) is not dict or any(type(k) is not str for k in header):
        raise _fail("bad_header", f"header must be a map with str keys, got {type(header).__name__}")
    if b"\xff" in bytes(views[0]) and _has_timestamp(header):  # a timestamp's type byte is 0xff
        raise _fail("bad_header", "msgpack ext type -1 (timestamp) not allowed")
    schema = header.get("schema")
    if type(schema) is not int or schema != SCHEMA_VERSION:
        raise _fail("bad_schema", f"schema {schema!r} != {SCHEMA_VERSION}")
    if header.get("kind") not in KINDS:
        raise _fail("bad_kind", f"unknown kind {header.get('kind')!r}")
    return header, views

