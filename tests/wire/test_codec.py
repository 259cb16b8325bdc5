"""Tests for grpo/wire/messages.py: round trips, zero-copy decoding, and one rejection per reason code."""
from __future__ import annotations

import copy
import math
import pathlib
from typing import Any, Callable

import msgpack
import numpy as np
import pytest
import zmq
from builders import VOCAB, make_weights, random_group

from grpo.wire import codec
from grpo.wire import messages as M

# ----------------------------------------------------------------------------- helpers


def assert_groups_equal(a: M.Group, b: M.Group) -> None:
    for f in ("sampler_id", "group_id", "policy_version", "prefix", "prefix_tokens", "meta"):
        assert getattr(a, f) == getattr(b, f), f
    np.testing.assert_array_equal(a.prefix_token_ids, b.prefix_token_ids)
    assert len(a.completions) == len(b.completions)
    for ca, cb in zip(a.completions, b.completions):
        for f in ("generated_token_ids", "old_policy_log_probs", "ref_policy_log_probs", "whole_token_ids"):
            x, y = getattr(ca, f), getattr(cb, f)
            assert x.dtype == y.dtype and x.shape == y.shape, f
            np.testing.assert_array_equal(x, y)
        for f in ("text", "reward", "reward_info", "is_finished"):
            assert getattr(ca, f) == getattr(cb, f), f


def to_bytes(frames: list[Any]) -> list[bytes]:
    return [bytes(f) for f in frames]


def rehead(frames: list[Any], edit: Callable[[dict[str, Any]], Any]) -> list[Any]:
    """Decode the header, let `edit` mutate it, re-encode: corrupts exactly one header thing."""
    h = msgpack.unpackb(bytes(frames[0]), raw=False)
    edit(h)
    return [msgpack.packb(h, use_bin_type=True), *frames[1:]]


def reason(frames: Any, limits: M.Limits = M.Limits()) -> str:
    with pytest.raises(M.ProtocolError) as exc:
        codec.decode(frames, limits)
    assert exc.value.detail and str(exc.value).startswith(exc.value.reason)
    return exc.value.reason


# ----------------------------------------------------------------------------- round trips


def test_group_round_trip() -> None:
    g = random_group()
    frames = codec.encode(g)
    assert len(frames) == 7 and isinstance(frames[0], bytes)
    out = codec.decode(frames, M.Limits(vocab_size=VOCAB, group_size=4))
    assert isinstance(out, M.Group)
    assert_groups_equal(g, out)
    assert_groups_equal(g, codec.decode(to_bytes(frames)))  # same from plain bytes


def test_group_single_completion_and_empty_prefix() -> None:
    g = random_group(lengths=(4,), prefix_len=0)
    g.prefix_tokens = []
    assert_groups_equal(g, codec.decode(codec.encode(g)))


def test_group_max_version_is_optional() -> None:
    """max_version (weights swapped in flight: the newest version among the group's tokens) rides as
    an optional key: sent when said, absent otherwise (-1 on decode, and so to a reader of before it,
    which ignores unknown keys); below policy_version (the oldest) is refused."""
    g = random_group(policy_version=12)
    assert g.max_version == -1
    assert "max_version" not in msgpack.unpackb(bytes(codec.encode(g)[0]), raw=False)
    assert codec.decode(codec.encode(g)).max_version == -1
    g.max_version = 14
    frames = codec.encode(g)
    assert msgpack.unpackb(bytes(frames[0]), raw=False)["max_version"] == 14
    out = codec.decode(frames)
    assert (out.policy_version, out.max_version) == (12, 14)
    assert_groups_equal(g, out)
    g.max_version = 12
    assert codec.decode(codec.encode(g)).max_version == 12
    for bad in (11, -1, True, 13.0):
        assert reason(rehead(frames, lambda h, b=bad: h.update(max_version=b))) == "bad_field"


def test_group_seq_and_request_incarnation_are_optional() -> None:
    """A group's seq (its place among its process's handed groups) rides as an optional key, as
    max_version; a weights_request says its process's incarnation (absent: 0). A rejected group's
    origin keeps the seq its valid header named."""
    g = random_group()
    assert g.seq == 0 and "seq" not in msgpack.unpackb(bytes(codec.encode(g)[0]), raw=False)
    assert codec.decode(codec.encode(g)).seq == 0
    g.seq, g.incarnation = 7, 99
    frames = codec.encode(g)
    assert msgpack.unpackb(bytes(frames[0]), raw=False)["seq"] == 7 and codec.decode(frames).seq == 7
    for bad in (-1, True, 7.0):
        assert reason(rehead(frames, lambda h, b=bad: h.update(seq=b))) == "bad_field"
    with pytest.raises(M.ProtocolError) as info:   # a body the codec refuses: the header still names who and which
        codec.decode(rehead(frames, lambda h: h.update(group_id=5)))
    assert info.value.origin == M.Origin("group", g.sampler_id, 99, 7)
    req = M.WeightsRequest(1, 2, 3, "", sent=5, incarnation=99)
    assert codec.decode(codec.encode(req)) == req
    h = msgpack.unpackb(bytes(codec.encode(M.WeightsRequest(1, 2, 3, sent=5))[0]), raw=False)
    del h["incarnation"]
    assert codec.decode([msgpack.packb(h)]).incarnation == 0
    import dataclasses   # an answer's `counted` (the newest seq its budget accounts for) rides as queued and budget do
    w = codec.decode(codec.encode(dataclasses.replace(make_weights("tcp"), queued=1, budget=2, counted=3)))
    assert (w.queued, w.budget, w.counted) == (1, 2, 3)
    assert codec.decode(codec.encode(make_weights("tcp"))).counted == -1


def test_group_array_frames_layout() -> None:
    g = random_group(lengths=(2, 3), prefix_len=4)
    frames = codec.encode(g)
    h = msgpack.unpackb(frames[0], raw=False)
    assert (h["schema"], h["kind"]) == (M.SCHEMA_VERSION, "group")
    assert [(a["name"], a["dtype"], a["shape"]) for a in h["arrays"]] == [
        ("prefix_token_ids", "int32", [4]), ("generated_lengths", "int32", [2]),
        ("generated_token_ids", "int32", [5]), ("old_policy_log_probs", "float32", [5]),
        ("ref_policy_log_probs", "float32", [5]), ("whole_token_ids", "int32", [13])]
    assert np.frombuffer(frames[2], "<i4").tolist() == [2, 3]
    assert isinstance(frames[1], memoryview)


def test_encode_accepts_numpy_scalars_and_lists() -> None:
    g = random_group(lengths=(2,))
    g.sampler_id, g.policy_version = np.int64(3), np.int32(12)
    g.completions[0].reward = np.float32(1.5)
    g.completions[0].generated_token_ids = g.completions[0].generated_token_ids.astype(np.int64).tolist()
    out = codec.decode(codec.encode(g))
    assert (out.sampler_id, out.policy_version, out.completions[0].reward) == (3, 12, 1.5)
    assert out.completions[0].generated_token_ids.dtype == np.int32


@pytest.mark.parametrize("msg", [
    M.SamplerStatus(sampler_id=2, policy_version=7, groups_sent=123, final=True,
                    stats={"samples_per_s": 12.5, "tokens": 4096.0}),
    M.SamplerStatus(sampler_id=0, policy_version=0, groups_sent=0, final=False, stats={}),
    M.WeightsRequest(sampler_id=1, have_version=-1),
    M.WeightsRequest(sampler_id=1, have_version=41),
    M.NoUpdate(version=5),
    M.NoUpdate(version=5, request_id=2, queued=3, budget=4, counted=9),
    M.Stop(version=100, reason="max_steps reached"),
])
def test_header_only_round_trip(msg: M.Message) -> None:
    frames = codec.encode(msg)
    assert len(frames) == 1
    assert codec.decode(frames) == msg


@pytest.mark.parametrize("method", ["tcp", "ipc", "nccl", "shared"])
def test_weights_round_trip(method: str) -> None:
    w = make_weights(method)
    frames = codec.encode(w)
    assert len(frames) == 1 + (2 if method == "tcp" else 0)
    out = codec.decode(frames)
    assert isinstance(out, M.WeightsAnnounce)
    assert (out.version, out.method, out.bucket_dtypes, out.bucket_nbytes) == (9, method, ["float32", "bfloat16"], [48, 16])
    assert out.layout == w.layout
    assert [bytes(b) for b in out.buckets] == [bytes(b) for b in w.buckets]
    assert all(isinstance(b, memoryview) for b in out.buckets)
    assert (out.ipc, out.nccl, out.shared) == (w.ipc, w.nccl, w.shared)


def test_ipc_handle_is_validated() -> None:
    import dataclasses

    w = make_weights("ipc")
    for bad, why in ((dataclasses.replace(w.ipc, stamp_offset=32), "bad_shape"),      # stamp over the buckets
                     (dataclasses.replace(w.ipc, stamp_offset=124), "bad_shape"),     # stamp past the storage
                     (dataclasses.replace(w.ipc, handle="not bytes"), "bad_field"),
                     (dataclasses.replace(w.ipc, handle=bytes(M.MAX_IPC_HANDLE_BYTES + 1)), "bad_field")):
        assert reason(codec.encode(dataclasses.replace(w, ipc=bad))) == why
    # an expandable segment's handle lists its pages: tens of KB pass (300 bytes were dropped once)
    long = dataclasses.replace(w, ipc=dataclasses.replace(w.ipc, handle=bytes(range(256)) * 160))
    assert codec.decode(codec.encode(long)).ipc.handle == bytes(range(256)) * 160
    assert reason(codec.encode(dataclasses.replace(w, ipc=None))) == "bad_field"       # ipc without a handle
    n = make_weights("nccl")
    for bad in (M.NcclRendezvous("h", 0, "nccl"), M.NcclRendezvous("h", 70000, "nccl"), M.NcclRendezvous("h", 5, "mpi")):
        assert reason(codec.encode(dataclasses.replace(n, nccl=bad))) == "bad_field"
    sh = make_weights("shared")
    assert reason(codec.encode(dataclasses.replace(sh, shared=sh.shared[:1]))) == "bad_field"      # a storage without a handle
    wrong = [dataclasses.replace(sh.shared[0], storage_nbytes=64), sh.shared[1]]
    assert reason(codec.encode(dataclasses.replace(sh, shared=wrong))) == "bad_shape"              # handle vs layout size
    req = M.WeightsRequest(1, 2, 3, "ipc")
    assert codec.decode(codec.encode(req)) == req
    assert reason(codec.encode(M.WeightsRequest(1, 2, 3, "carrier-pigeon"))) == "bad_field"


def test_weights_limits() -> None:
    lim = M.weights_limits(3 << 30)
    assert lim.max_array_bytes >= 3 << 30
    big = M.Limits().max_array_bytes + 16  # one bucket larger than the default per-frame limit
    w = M.WeightsAnnounce(1, "tcp", [M.TensorSpec("x", "uint8", (big,), 0, 0)], ["uint8"], [big],
                          [memoryview(bytearray(big))])
    assert reason(codec.encode(w)) == "too_large"
    assert codec.decode(codec.encode(w), M.weights_limits(big)).bucket_nbytes == [big]


# ----------------------------------------------------------------------------- zero copy


def test_decode_is_zero_copy_in_process() -> None:
    g = random_group()
    frames = to_bytes(codec.encode(g))
    out = codec.decode(frames)
    whole = np.frombuffer(frames[6], np.uint8)
    assert all(np.shares_memory(c.whole_token_ids, whole) for c in out.completions)
    assert np.shares_memory(out.completions[0].generated_token_ids, np.frombuffer(frames[3], np.uint8))
    assert np.shares_memory(out.prefix_token_ids, np.frombuffer(frames[1], np.uint8))
    src = make_weights()
    w = codec.decode(codec.encode(src))
    assert np.shares_memory(np.frombuffer(w.buckets[0], np.uint8), np.frombuffer(src.buckets[0], np.uint8))


def test_encode_is_zero_copy_for_contiguous_arrays() -> None:
    g = random_group(lengths=(3,))
    frames = codec.encode(g)
    assert np.shares_memory(np.frombuffer(frames[1], np.uint8), g.prefix_token_ids)


@pytest.fixture
def zmq_ctx():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


@pytest.mark.parametrize("pattern", [(zmq.PUSH, zmq.PULL), (zmq.PAIR, zmq.PAIR)])
def test_group_over_real_zmq_sockets(zmq_ctx: zmq.Context, pattern: tuple[int, int]) -> None:
    rx = zmq_ctx.socket(pattern[1])
    tx = zmq_ctx.socket(pattern[0])
    port = rx.bind_to_random_port("tcp://127.0.0.1")
    tx.connect(f"tcp://127.0.0.1:{port}")
    # Big enough that zmq keeps frames out of line (no small-message inlining).
    g = random_group(lengths=(5000, 17, 20000), prefix_len=300)
    tx.send_multipart(codec.encode(g), copy=False)
    assert rx.poll(5000), "nothing received"
    frames = rx.recv_multipart(copy=False)
    assert all(isinstance(f, zmq.Frame) for f in frames)
    out = codec.decode(frames, M.Limits(vocab_size=VOCAB, group_size=3))
    assert_groups_equal(g, out)
    gen_frame = np.frombuffer(frames[3].buffer, np.uint8)
    assert all(np.shares_memory(c.generated_token_ids, gen_frame) for c in out.completions if len(c.generated_token_ids))
    assert out.completions[0].old_policy_log_probs.base is not None  # a view, not an owned copy
    tx.close(linger=0)
    rx.close(linger=0)


def test_weights_over_real_zmq_router_dealer(zmq_ctx: zmq.Context) -> None:
    router = zmq_ctx.socket(zmq.ROUTER)
    dealer = zmq_ctx.socket(zmq.DEALER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer.connect(f"tcp://127.0.0.1:{port}")
    dealer.send_multipart(codec.encode(M.WeightsRequest(sampler_id=0, have_version=-1)), copy=False)
    assert router.poll(5000)
    ident, *frames = router.recv_multipart(copy=False)
    assert codec.decode(frames) == M.WeightsRequest(0, -1)
    src = make_weights()
    router.send_multipart([ident, *codec.encode(src)], copy=False)
    assert dealer.poll(5000)
    out = codec.decode(dealer.recv_multipart(copy=False))
    assert [bytes(b) for b in out.buckets] == [bytes(b) for b in src.buckets]
    dealer.close(linger=0)
    router.close(linger=0)


# ----------------------------------------------------------------------------- rejections


def test_not_multipart() -> None:
    frames = codec.encode(random_group())
    assert reason(frames[0]) == "not_multipart"  # a single bytes object, not a list of frames
    assert reason([]) == "not_multipart"
    assert reason([frames[0], 12345]) == "not_multipart"  # an element that is no buffer


def test_bad_header_random_bytes() -> None:
    assert reason([b"\xc1\x9a\xff\x00garbage"]) == "bad_header"  # 0xc1 is never valid msgpack
    rng = np.random.default_rng(1)
    for _ in range(50):  # random bytes: either undecodable or decodes to something other than a valid header
        r = reason([rng.bytes(int(rng.integers(1, 64)))])
        assert r in ("bad_header", "bad_schema")


def test_bad_header_not_a_map() -> None:
    assert reason([msgpack.packb([1, "group"])]) == "bad_header"
    assert reason([msgpack.packb("group")]) == "bad_header"


def test_bad_header_trailing_bytes_and_ext_types() -> None:
    frames = codec.encode(M.NoUpdate(3))
    assert reason([bytes(frames[0]) + b"\x01"]) == "bad_header"
    ext = msgpack.packb({"schema": 1, "kind": "no_update", "version": msgpack.ExtType(5, b"x")})
    assert reason([ext]) == "bad_header"
    bin_key = msgpack.packb({b"schema": 1, "kind": "no_update", "version": 1}, use_bin_type=True)
    assert reason([bin_key]) == "bad_header"  # map keys must be str


def test_bad_schema() -> None:
    assert reason(rehead(codec.encode(random_group()), lambda h: h.update(schema=1))) == "bad_schema"   # the old one
    assert reason(rehead(codec.encode(random_group()), lambda h: h.update(schema=3))) == "bad_schema"
    assert reason(rehead(codec.encode(random_group()), lambda h: h.update(schema=True))) == "bad_schema"
    assert reason(rehead(codec.encode(random_group()), lambda h: h.pop("schema"))) == "bad_schema"


def test_bad_kind() -> None:
    assert reason(rehead(codec.encode(random_group()), lambda h: h.update(kind="grupo"))) == "bad_kind"
    assert reason(rehead(codec.encode(M.NoUpdate(1)), lambda h: h.pop("kind"))) == "bad_kind"


@pytest.mark.parametrize("edit", [
    lambda h: h.update(sampler_id=True),  # bool where an int is expected
    lambda h: h.update(policy_version=1.0),
    lambda h: h.update(sampler_id=-1),
    lambda h: h.pop("prefix"),
    lambda h: h.update(group_id="x" * 129),
    lambda h: h.update(prefix_tokens=["a", 3, "b", "c", "d"]),
    lambda h: h["completions"][1].update(is_finished=1),  # int where a bool is expected
    lambda h: h["completions"][1].update(reward="1.0"),
    lambda h: h["completions"][0].update(reward_info={"x": True}),
    lambda h: h["completions"][0].pop("text"),
    lambda h: h.update(meta={"answer": [7, 2]}),
    lambda h: h.update(meta={str(i): i for i in range(M.MAX_MAP_ITEMS + 1)}),
    lambda h: h["arrays"][0].update(name="prefix_ids"),
])
def test_bad_field_group(edit: Callable[[dict[str, Any]], Any]) -> None:
    assert reason(rehead(codec.encode(random_group()), edit)) == "bad_field"


@pytest.mark.parametrize("msg,edit", [
    (M.SamplerStatus(1, 2, 3, False, {}), lambda h: h.update(final=0)),
    (M.SamplerStatus(1, 2, 3, False, {}), lambda h: h.update(groups_sent=False)),
    (M.SamplerStatus(1, 2, 3, False, {}), lambda h: h.update(stats={"a": "fast"})),
    (M.WeightsRequest(1, 2), lambda h: h.update(have_version=-2)),
    (M.NoUpdate(1), lambda h: h.update(version=None)),
    (M.Stop(1, "done"), lambda h: h.update(reason=7)),
    (make_weights(), lambda h: h.update(method="carrier-pigeon")),
    (make_weights(), lambda h: h["layout"][2].__setitem__(0, "a.weight")),  # duplicate name
    (make_weights(), lambda h: h["layout"][0].__setitem__(3, 2)),  # bucket index out of range
    (make_weights(), lambda h: h["layout"][0].pop()),  # layout entry of 4 items
])
def test_bad_field_other_kinds(msg: M.Message, edit: Callable[[dict[str, Any]], Any]) -> None:
    assert reason(rehead(codec.encode(msg), edit)) == "bad_field"


def test_too_large_declared_shape_2_pow_40() -> None:
    # Frames stay tiny: the 2**40-element declaration must be refused from the header alone.
    frames = rehead(codec.encode(random_group()), lambda h: h["arrays"][2].update(shape=[2 ** 40]))
    assert reason(frames) == "too_large"
    assert reason(frames, M.weights_limits(2 ** 50)) == "frame_size"  # allowed size, but the frame is not there
    assert reason(rehead(codec.encode(random_group()), lambda h: h["arrays"][2].update(shape=[2 ** 20, 2 ** 20]))) == "too_large"


def test_too_large_header_frames_and_tokens() -> None:
    g = random_group()
    assert reason(codec.encode(g), M.Limits(max_header_bytes=64)) == "too_large"
    assert reason(codec.encode(g), M.Limits(max_frames=4)) == "too_large"
    assert reason(codec.encode(g), M.Limits(max_tokens=6)) == "too_large"  # one completion has 7 tokens
    assert reason(codec.encode(g), M.Limits(max_tokens=4)) == "too_large"  # prefix has 5 tokens
    many = [b"x"] * 70
    assert reason([codec.encode(M.NoUpdate(1))[0], *many]) == "too_large"


def test_bad_dtype() -> None:
    g = random_group()
    assert reason(rehead(codec.encode(g), lambda h: h["arrays"][0].update(dtype="complex64"))) == "bad_dtype"
    # Same byte size, wrong dtype for this name.
    assert reason(rehead(codec.encode(g), lambda h: h["arrays"][0].update(dtype="float32"))) == "bad_dtype"
    assert reason(rehead(codec.encode(g), lambda h: h["arrays"][3].update(dtype="bfloat16", shape=[24]))) == "bad_dtype"
    assert reason(rehead(codec.encode(make_weights()), lambda h: h["layout"][0].__setitem__(1, "int32"))) == "bad_dtype"
    assert reason(rehead(codec.encode(make_weights()), lambda h: h["bucket_dtypes"].__setitem__(0, "f32"))) == "bad_dtype"


def test_bad_shape() -> None:
    g = random_group()
    assert reason(rehead(codec.encode(g), lambda h: h["arrays"][0].update(shape=[-5]))) == "bad_shape"
    assert reason(rehead(codec.encode(g), lambda h: h["arrays"][0].update(shape=[1, 5]))) == "bad_shape"
    assert reason(rehead(codec.encode(g), lambda h: h["arrays"][0].update(shape=5))) == "bad_shape"
    assert reason(rehead(codec.encode(g), lambda h: h["arrays"][0].update(shape=[5.0]))) == "bad_shape"


def test_frame_size_truncated_frame() -> None:
    frames = to_bytes(codec.encode(random_group()))
    frames[3] = frames[3][:-1]
    assert reason(frames) == "frame_size"


def test_frame_size_extra_and_missing_frame() -> None:
    frames = to_bytes(codec.encode(random_group()))
    assert reason([*frames, b"\x00" * 4]) == "frame_size"
    assert reason(frames[:-1]) == "frame_size"
    assert reason([*codec.encode(M.NoUpdate(1)), b""]) == "frame_size"


def test_length_mismatch_lengths() -> None:
    g = random_group()
    g.completions[2].old_policy_log_probs = g.completions[2].old_policy_log_probs[:-1]
    assert reason(codec.encode(g)) == "length_mismatch"


def test_length_mismatch_generated_lengths_frame() -> None:
    frames = to_bytes(codec.encode(random_group()))
    lengths = np.frombuffer(frames[2], "<i4").copy()
    lengths[0] += 1
    lengths[1] -= 1  # same sum, but now n_1 = -1
    frames[2] = lengths.tobytes()
    assert reason(frames) == "length_mismatch"
    lengths[1] += 1  # sum off by one
    frames[2] = lengths.tobytes()
    assert reason(frames) == "length_mismatch"


def test_length_mismatch_whole_not_prefix_plus_generated() -> None:
    g = random_group()
    w = g.completions[2].whole_token_ids.copy()
    w[-1] = (w[-1] + 1) % VOCAB  # still a valid token id, same length
    g.completions[2].whole_token_ids = w
    assert reason(codec.encode(g)) == "length_mismatch"
    g = random_group()
    g.completions[0].whole_token_ids = g.completions[0].whole_token_ids.copy()
    g.completions[0].whole_token_ids[0] += 1  # prefix part differs
    assert reason(codec.encode(g)) == "length_mismatch"
    g = random_group()
    g.prefix_tokens = g.prefix_tokens[:-1]
    assert reason(codec.encode(g)) == "length_mismatch"


def test_length_mismatch_weights_bucket_frame() -> None:
    frames = rehead(codec.encode(make_weights()), lambda h: h["bucket_nbytes"].__setitem__(1, 32))
    assert reason(frames) == "length_mismatch"


@pytest.mark.parametrize("corrupt", [
    lambda g: setattr(g.completions[1], "reward", math.nan),
    lambda g: setattr(g.completions[1], "reward", math.inf),
    lambda g: g.completions[0].reward_info.update(correct=-math.inf),
    lambda g: g.completions[2].old_policy_log_probs.__setitem__(4, -np.inf),
    lambda g: g.completions[2].ref_policy_log_probs.__setitem__(0, np.nan),
    lambda g: g.meta.update(w=math.nan),
])
def test_non_finite(corrupt: Callable[[M.Group], Any]) -> None:
    g = random_group()
    corrupt(g)
    assert reason(codec.encode(g)) == "non_finite"


def test_non_finite_status_stats() -> None:
    assert reason(codec.encode(M.SamplerStatus(0, 0, 0, False, {"x": math.nan}))) == "non_finite"


def test_bad_log_prob_positive() -> None:
    g = random_group()
    g.completions[2].old_policy_log_probs[3] = 0.5
    assert reason(codec.encode(g)) == "bad_log_prob"
    g = random_group()
    g.completions[0].ref_policy_log_probs[0] = 0.5
    assert reason(codec.encode(g)) == "bad_log_prob"
    g = random_group()
    g.completions[0].ref_policy_log_probs[0] = 1e-4  # float noise around 0 is tolerated
    assert isinstance(codec.decode(codec.encode(g)), M.Group)


def _set_token(g: M.Group, value: int) -> None:
    c = g.completions[2]
    c.generated_token_ids[1] = value
    c.whole_token_ids = np.concatenate([g.prefix_token_ids, c.generated_token_ids])  # keep whole consistent


def test_token_out_of_range_negative() -> None:
    g = random_group()
    _set_token(g, -1)
    assert reason(codec.encode(g)) == "token_out_of_range"  # rejected even without a vocab_size
    g = random_group()
    g.prefix_token_ids[0] = -1
    for c in g.completions:
        c.whole_token_ids = np.concatenate([g.prefix_token_ids, c.generated_token_ids])
    assert reason(codec.encode(g)) == "token_out_of_range"


def test_token_out_of_range_vocab() -> None:
    g = random_group()
    _set_token(g, VOCAB)
    assert isinstance(codec.decode(codec.encode(g)), M.Group)  # fine when the vocab is unknown
    assert reason(codec.encode(g), M.Limits(vocab_size=VOCAB)) == "token_out_of_range"
    assert isinstance(codec.decode(codec.encode(g), M.Limits(vocab_size=VOCAB + 1)), M.Group)


def test_bad_group_size() -> None:
    g = random_group()
    assert reason(codec.encode(g), M.Limits(group_size=8)) == "bad_group_size"
    assert reason(codec.encode(g), M.Limits(max_completions=3)) == "bad_group_size"
    empty = random_group()
    empty.completions = []
    assert reason(codec.encode(empty)) == "bad_group_size"
    # A completion dropped from the header but not from generated_lengths.
    assert reason(rehead(codec.encode(g), lambda h: h["completions"].pop())) == "bad_group_size"


def test_weights_overlapping_tensors() -> None:
    frames = rehead(codec.encode(make_weights()), lambda h: h["layout"][1].__setitem__(4, 16))  # [16,32) vs [0,24)
    assert reason(frames) == "bad_shape"


def test_weights_bucket_overflow() -> None:
    frames = rehead(codec.encode(make_weights()), lambda h: h["layout"][1].__setitem__(2, [5]))  # 32+20 > 48
    assert reason(frames) == "bad_shape"
    frames = rehead(codec.encode(make_weights()), lambda h: h["layout"][2].__setitem__(2, [2 ** 40]))
    assert reason(frames) == "bad_shape"


def test_weights_misaligned_offset() -> None:
    frames = rehead(codec.encode(make_weights()), lambda h: h["layout"][1].__setitem__(4, 30))
    assert reason(frames) == "bad_shape"


def test_weights_frames_for_method() -> None:
    frames = codec.encode(make_weights())
    assert reason(frames[:-1]) == "frame_size"  # descriptor says 2 frames, 1 present
    assert reason(rehead(frames, lambda h: h.update(method="nccl"))) == "frame_size"  # nccl carries no frames
    assert reason(rehead(frames[:2], lambda h: h["arrays"].pop())) == "frame_size"  # 2 buckets, 1 frame


def test_every_reason_code_is_tested() -> None:
    codes = {"not_multipart", "bad_header", "bad_schema", "bad_kind", "bad_field", "too_large", "bad_dtype",
             "bad_shape", "frame_size", "length_mismatch", "non_finite", "token_out_of_range", "bad_group_size",
             "bad_log_prob"}
    src = pathlib.Path(__file__).read_text()
    assert all(f'"{c}"' in src for c in codes)


def test_decode_does_not_mutate_or_keep_header_state() -> None:
    g = random_group()
    frames = codec.encode(g)
    a, b = codec.decode(frames), codec.decode(frames)
    assert_groups_equal(a, b)
    assert copy.deepcopy(a.meta) == g.meta


def test_source_has_no_unsafe_deserialization_and_light_imports() -> None:
    grpo = pathlib.Path(__file__).resolve().parents[2] / "grpo"
    # types, and the codec: encode, the shared checks, each kind's decode
    for name in ("wire/messages.py", "wire/encode.py", "wire/checks.py", "wire/codec.py"):
        src = (grpo / name).read_text()
        for bad in ("pickle", "eval(", "exec("):
            assert bad not in src, (name, bad)
        lines = [line for line in src.splitlines() if line.startswith(("import ", "from "))]
        imports = {line.split()[1] for line in lines}
        # stdlib, numpy and msgpack only; the codec's modules import the messages and each other, nothing else of ours
        assert {m.split(".")[0] for m in imports} <= {"__future__", "dataclasses", "math", "typing", "msgpack",
                                                       "numpy", "grpo"}, (name, imports)
        assert {m for m in imports if m.startswith("grpo")} <= {"grpo.wire.messages", "grpo.wire.encode",
                                                                "grpo.wire.checks", "grpo.wire.codec"}, name


def test_reference_log_probs_may_be_left_out_for_the_whole_group() -> None:
    g = random_group()
    for c in g.completions:
        c.ref_policy_log_probs = np.zeros(0, np.float32)
    back = codec.decode(codec.encode(g), M.Limits(vocab_size=VOCAB))
    assert all(len(c.ref_policy_log_probs) == 0 for c in back.completions)
    g.completions[0].ref_policy_log_probs = np.zeros(1, np.float32)   # some but not all: refused
    assert reason(codec.encode(g)) == "length_mismatch"
