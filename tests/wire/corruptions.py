"""Corruptions of valid wire messages, and the seeded cases tests/wire/test_fuzz.py sends (not a test file).

Every corruption is built from a valid message (``codec.encode``) by editing its msgpack header or
its frames. A corruption is a function (r, nrng, base_frames) -> frames, drawing from the
``random.Random`` r and the numpy Generator nrng. Sections:

* helpers: header editing, array bytes, wrong values of each type, random msgpack values;
* valid messages: the fuzzing sampler's group (the base of every group corruption);
* generic corruptions: any kind (GENERIC; MAY_STAY_VALID are resampled when they leave a message valid);
* group corruptions (GROUP_SPECIFIC), status corruptions (STATUS_SPECIFIC);
* weights / no_update / stop corruptions (wc_*, nc_*);
* case generation: ``generate_cases`` draws corruptions of base messages and decodes each with the
  receiver's own limits: it must raise ``ProtocolError`` (any other exception is a crash in
  ``decode``), and its reason is what the receiver must count. ``data_cases``, ``sync_cases`` and
  ``oversized_messages`` are the cases of the two sockets.

Everything is seeded, so the messages (and the expected counts) are the same on every run.
"""
from __future__ import annotations

import copy
import math
import random
from typing import Any, Callable

import msgpack
import numpy as np
from builders import frames_of, make_status, make_weights, random_group

from grpo.wire import codec
from grpo.wire import messages as M

SEED = 20240607
VOCAB = 49152  # tiny-random uses SmolLM2's tokenizer
G = 2  # the learner runs with --num-generations 2
SAMPLER_ID = 7  # every group and status of the fuzzing "sampler" carries this id
DATA_LIMITS = M.Limits(group_size=G, vocab_size=VOCAB)  # what the learner checks once its model is loaded
STATUS_STATS = {"samples": 4.0, "seconds": 1.5}  # the stats of every status of the fuzzing sampler

Frames = list[bytes]


# ----------------------------------------------------------------------------- helpers


def header(frames: Frames) -> dict[str, Any]:
    return msgpack.unpackb(frames[0], raw=False)


def pack(h: Any) -> bytes:
    return msgpack.packb(h, use_bin_type=True)


def rehead(frames: Frames, edit: Callable[[dict[str, Any]], Any]) -> Frames:
    h = header(frames)
    edit(h)
    return [pack(h), *frames[1:]]


def reject_reason(frames: Frames, limits: M.Limits) -> str | None:
    """The reason `decode` rejects `frames` with, or None if it accepts them. Other exceptions propagate."""
    try:
        codec.decode(frames, limits)
    except M.ProtocolError as exc:
        return exc.reason
    return None


def i32(x: Any) -> bytes:
    return np.ascontiguousarray(x, dtype="<i4").tobytes()


def f32(x: Any) -> bytes:
    return np.ascontiguousarray(x, dtype="<f4").tobytes()


# Values of the wrong msgpack type (or out of range) for a field of each type. Note that an int
# is a *valid* float, so float fields never get plain ints here.
BAD_INT = [True, False, 1.5, "0", None, [], {}, b"\x00", -1, -(2 ** 63), msgpack.Timestamp(1, 0)]
BAD_FLOAT = [True, "1.0", None, [1.0], {}, b"1", math.nan, math.inf, -math.inf]
BAD_STR = [5, None, b"bytes", [], {}, True, 1.5, msgpack.Timestamp(0, 1)]
BAD_BOOL = [0, 1, "true", None, 1.0, []]
BAD_SCHEMA = [0, 1, 3, -1, "2", 2.0, True, None, 2 ** 40, [2], {"v": 2}, b"\x02", msgpack.Timestamp(2, 0)]
BAD_KIND = ["", "Group", "groups", "weights_requests", "status ", None, 1, ["group"], {"k": "group"}, b"group",
            "grüppe", "\x00", "stop\x00"]
BAD_DTYPE = ["float64", "int", "", "<i4", "i4", "bool", "bfloat32", "INT32", "int32 ", "complex64"]


def rand_str(r: random.Random, n: int) -> str:
    return "".join(chr(r.choice((r.randint(32, 126), r.randint(0x00A0, 0xD7FF)))) for _ in range(n))


def rand_obj(r: random.Random, depth: int = 0) -> Any:
    """A random msgpack value (used where a header or a field should have been)."""
    kinds = ["nil", "bool", "int", "float", "str", "bin"] + (["list", "map"] if depth < 3 else [])
    k = r.choice(kinds)
    if k == "nil":
        return None
    if k == "bool":
        return r.random() < 0.5
    if k == "int":
        return r.choice([r.randint(-2 ** 63, 2 ** 64 - 1), r.randint(-5, 5)])
    if k == "float":
        return r.choice([r.uniform(-1e6, 1e6), math.nan, math.inf, -math.inf, -0.0])
    if k == "str":
        return rand_str(r, r.randint(0, 12))
    if k == "bin":
        return r.randbytes(r.randint(0, 12))
    if k == "list":
        return [rand_obj(r, depth + 1) for _ in range(r.randint(0, 4))]
    return {rand_str(r, r.randint(1, 6)): rand_obj(r, depth + 1) for _ in range(r.randint(0, 4))}


# ----------------------------------------------------------------------------- valid messages


def fuzz_completion(i: int) -> dict[str, Any]:
    return {"text": f"completion {i}", "reward": float(i), "reward_info": {"correct": float(i), "format": 0.5},
            "is_finished": i == 0}


def fuzz_group(nrng: np.random.Generator, group_id: str, lengths: tuple[int, ...] = (3, 2),
               prefix_len: int = 4) -> M.Group:
    """A valid group of the fuzzing sampler: ids of the tiny-random vocabulary, log-probs below -0.01."""
    return random_group(lengths, prefix_len, rng=nrng, vocab=VOCAB, log_prob_margin=0.01,
                        completion_fields=fuzz_completion, sampler_id=SAMPLER_ID, group_id=group_id,
                        policy_version=0, prefix_tokens=[f"t{i}" for i in range(prefix_len)])


# ----------------------------------------------------------------------------- generic corruptions
# Each takes (r, nrng, base_frames) and returns corrupted frames. They apply to any kind.


def c_random_bytes(r, nrng, base):
    return [r.randbytes(r.choice([0, 1, 2, r.randint(3, 64), r.randint(64, 600)]))]


def c_random_multipart(r, nrng, base):
    return [r.randbytes(r.randint(0, 200)) for _ in range(r.randint(2, 10))]


def c_random_map_prefix(r, nrng, base):
    # Random bytes behind a fixmap/map16 marker: drives the parser deeper than pure noise.
    return [bytes([r.choice([0x81, 0x82, 0x85, 0x8F, 0xDE])]) + r.randbytes(r.randint(0, 80)),
            *[r.randbytes(r.randint(0, 32)) for _ in range(r.randint(0, 3))]]


def c_bitflip_header(r, nrng, base):
    h = bytearray(base[0])
    for _ in range(r.randint(1, 6)):
        h[r.randrange(len(h))] ^= 1 << r.randrange(8)
    return [bytes(h), *base[1:]]


def c_random_byte_header(r, nrng, base):
    h = bytearray(base[0])
    for _ in range(r.randint(1, 3)):
        h[r.randrange(len(h))] = r.randrange(256)
    return [bytes(h), *base[1:]]


def c_truncate_header(r, nrng, base):
    return [base[0][: r.randrange(len(base[0]))], *base[1:]]


def c_trailing_header(r, nrng, base):
    return [base[0] + r.choice([b"\x00", b"\xc0", pack({"x": 1}), r.randbytes(r.randint(1, 16))]), *base[1:]]


def c_not_a_map(r, nrng, base):
    h = header(base)
    v = r.choice([list(h.items()), list(h.values()), 1, "group", None, b"\x81", 3.5, True,
                  [h], rand_obj(r)])
    if isinstance(v, dict):
        v = [v]
    return [pack(v), *base[1:]]


def c_nonstr_keys(r, nrng, base):
    # strict_map_key refuses int/float/nil/bool keys outright; bin keys reach the str-key check.
    key = r.choice([1, -7, b"schema", b"x", 2.5, None, True])
    return [pack({**header(base), key: 1}), *base[1:]]


def c_ext_type(r, nrng, base):
    h = header(base)
    key = r.choice([k for k in h if k != "arrays"] + ["unknown_key"])
    if r.random() < 0.7:
        h[key] = msgpack.ExtType(r.choice([0, 1, 5, 42, 127]), r.randbytes(r.randint(0, 9)))
        return [pack(h), *base[1:]]
    # Reserved negative codes (msgpack.ExtType refuses to build them): splice raw fixext bytes in.
    h[key] = "@@ext@@"
    raw = bytes([0xD4, r.choice([0xFB, 0x80, 0xFE])]) + r.randbytes(1)  # fixext1, code -5 / -128 / -2
    return [pack(h).replace(pack("@@ext@@"), raw, 1), *base[1:]]


def c_schema(r, nrng, base):
    def edit(h):
        if r.random() < 0.1:
            del h["schema"]
        else:
            h["schema"] = r.choice(BAD_SCHEMA)
    return rehead(base, edit)


def c_kind(r, nrng, base):
    def edit(h):
        if r.random() < 0.1:
            del h["kind"]
        else:
            h["kind"] = r.choice(BAD_KIND + [rand_str(r, r.randint(1, 10))])
    return rehead(base, edit)


def c_kind_swap(r, nrng, base):
    # A known kind whose fields do not match the header (or that carries arrays it cannot have).
    return rehead(base, lambda h: h.__setitem__("kind", r.choice([k for k in M.KINDS if k != h["kind"]])))


def c_drop_frames(r, nrng, base):
    if len(base) == 1:
        return [*base, r.randbytes(r.randint(0, 16))]
    k = r.randint(1, len(base) - 1)
    return base[: len(base) - k]


def c_extra_frames(r, nrng, base):
    return [*base, *[r.randbytes(r.randint(0, 40)) for _ in range(r.randint(1, 4))]]


def c_too_many_frames(r, nrng, base):
    # 65 or 66 frames: over the data socket's max_frames (64).
    return [base[0], *[b""] * r.choice([64, 65])]


def c_deep_nesting(r, nrng, base):
    depth = r.choice([1100, 5000, 60000])
    return [bytes([0x91]) * depth + b"\xc0"]


def c_huge_container(r, nrng, base):
    # Containers that declare 2**32-1 elements (or a 4 GiB string) in a 5-byte header.
    return [r.choice([b"\xdd", b"\xdf", b"\xdb", b"\xc6"]) + b"\xff\xff\xff\xff" + r.randbytes(r.randint(0, 8)),
            *base[1:]]


def c_arrays_not_list(r, nrng, base):
    return rehead(base, lambda h: h.__setitem__("arrays", r.choice(["x", {}, None, 1, True, {"name": "a"}])))


def c_descriptor_not_map(r, nrng, base):
    def edit(h):
        if not h["arrays"]:
            h["arrays"] = [r.choice(["bucket", 5, None, ["name", "uint8", [0]]])]
            return
        i = r.randrange(len(h["arrays"]))
        d = h["arrays"][i]
        h["arrays"][i] = r.choice([[d["name"], d["dtype"], d["shape"]], d["name"], None, 7, True])
    return rehead(base, edit)


def c_descriptor_field(r, nrng, base):
    def edit(h):
        if not h["arrays"]:
            h["arrays"] = [{"name": "x", "dtype": "uint8", "shape": [0]}]
        d = r.choice(h["arrays"])
        key = r.choice(["name", "dtype", "shape"])
        if r.random() < 0.25:
            del d[key]
        elif key == "shape":
            d[key] = r.choice([[-1], [1.5], [True], "4", [None], [0] * 9, -3, None, {"0": 4}, [-(2 ** 63)]])
        elif key == "dtype":
            d[key] = r.choice(BAD_DTYPE + [5, None, b"int32"])
        else:
            d[key] = r.choice([5, None, b"x", "x" * 129, []])
    return rehead(base, edit)


def c_gigantic_shape(r, nrng, base):
    # Declares gigabytes to exabytes while the frames stay tiny: must be refused from the header.
    def edit(h):
        if not h["arrays"]:
            h["arrays"] = [{"name": "bucket_0", "dtype": "uint8", "shape": [0]}]
        d = r.choice(h["arrays"])
        d["shape"] = r.choice([[2 ** 30], [2 ** 40], [2 ** 64 - 1], [2 ** 62, 2 ** 62], [2 ** 16] * 8,
                               [2 ** 31 - 1], [3, 2 ** 33], [1 << 63]])
    return rehead(base, edit)


def c_frame_resize(r, nrng, base):
    if len(base) == 1:
        return [base[0], r.randbytes(r.randint(1, 9))]
    i = r.randrange(1, len(base))
    f = base[i]
    if f and r.random() < 0.5:
        f = f[: r.randrange(len(f))]
    else:
        f = f + r.randbytes(r.randint(1, 7))
    return [*base[:i], f, *base[i + 1:]]


def c_frames_swapped(r, nrng, base):
    if len(base) < 3:
        return [base[0], b"\x00" * 4]
    i, j = r.sample(range(1, len(base)), 2)
    out = list(base)
    out[i], out[j] = out[j], out[i]
    return out


def c_tree_mutate(r, nrng, base):
    # Replace, delete or duplicate random nodes anywhere in the header tree with random values.
    h = header(base)
    for _ in range(r.randint(1, 3)):
        node, key = h, r.choice(list(h))
        for _ in range(r.randint(0, 3)):  # walk down into containers
            child = node[key]
            if not isinstance(child, (dict, list)) or not child or r.random() < 0.3:
                break
            node, key = child, r.choice(list(child) if isinstance(child, dict) else range(len(child)))
        op = r.randrange(3)
        if op == 0:
            node[key] = rand_obj(r)
        elif op == 1 and isinstance(node, dict):
            del node[key]
        elif isinstance(node, list):
            node.insert(key, copy.deepcopy(node[key]))
        else:
            node[key] = [node[key], node[key]]
    return [pack(h), *base[1:]]


GENERIC = [c_random_bytes, c_random_multipart, c_random_map_prefix, c_bitflip_header, c_random_byte_header,
           c_truncate_header, c_trailing_header, c_not_a_map, c_nonstr_keys, c_ext_type, c_schema, c_kind,
           c_kind_swap, c_drop_frames, c_extra_frames, c_deep_nesting, c_huge_container, c_arrays_not_list,
           c_descriptor_not_map, c_descriptor_field, c_gigantic_shape, c_frame_resize, c_frames_swapped, c_tree_mutate]
# These may (rarely) leave a message valid, e.g. a flipped bit inside a text field: resample then.
# (c_kind_swap: a stop relabelled no_update is a valid no_update with an extra key.)
MAY_STAY_VALID = {c_bitflip_header, c_random_byte_header, c_frames_swapped, c_kind_swap, c_tree_mutate}


# ----------------------------------------------------------------------------- group corruptions


def g_arrays(nrng: np.random.Generator, prefix: Any, gens: list[Any], old: list[Any] | None = None,
             ref: list[Any] | None = None, lengths: Any = None, whole: Any = None) -> dict[str, bytes]:
    old = old if old is not None else [-(nrng.random(len(g)) + 0.1) for g in gens]
    ref = ref if ref is not None else [-(nrng.random(len(g)) + 0.1) for g in gens]
    cat = lambda parts, f: f(np.concatenate([np.asarray(p, dtype=np.float64) for p in parts]) if parts else [])
    return {
        "prefix_token_ids": i32(prefix),
        "generated_lengths": i32([len(g) for g in gens] if lengths is None else lengths),
        "generated_token_ids": cat(gens, i32),
        "old_policy_log_probs": cat(old, f32),
        "ref_policy_log_probs": cat(ref, f32),
        "whole_token_ids": cat([np.concatenate([np.asarray(prefix), np.asarray(g)]) for g in gens], i32)
        if whole is None else i32(whole),
    }


def with_arrays(base: Frames, arrays: dict[str, bytes], edit: Callable[[dict], Any] | None = None) -> Frames:
    """Replace the six group arrays (descriptors follow the bytes) and optionally edit the header."""
    h = header(base)
    sizes = {"int32": 4, "float32": 4}
    h["arrays"] = [{"name": n, "dtype": d, "shape": [len(arrays[n]) // sizes[d]]} for n, d in M.GROUP_ARRAYS]
    if edit:
        edit(h)
    return [pack(h), *(arrays[n] for n, _ in M.GROUP_ARRAYS)]


def rand_ids(nrng, n):
    return nrng.integers(0, VOCAB, n)


def gc_int_field(r, nrng, base):
    return rehead(base, lambda h: h.__setitem__(r.choice(["sampler_id", "policy_version"]), r.choice(BAD_INT)))


def gc_str_field(r, nrng, base):
    def edit(h):
        key = r.choice(["group_id", "prefix"])
        h[key] = r.choice(BAD_STR + (["g" * 129, "é" * 200] if key == "group_id" else []))
    return rehead(base, edit)


def gc_missing_field(r, nrng, base):
    def edit(h):
        if r.random() < 0.5:
            del h[r.choice(["sampler_id", "group_id", "policy_version", "prefix", "prefix_tokens", "meta",
                            "completions"])]
        else:
            del r.choice(h["completions"])[r.choice(["text", "reward", "reward_info", "is_finished"])]
    return rehead(base, edit)


def gc_prefix_tokens(r, nrng, base):
    def edit(h):
        toks = h["prefix_tokens"]
        h["prefix_tokens"] = r.choice([
            "t0t1t2t3", None, {}, [1, 2, 3, 4], [*toks[:-1], None], [*toks[:-1], b"t3"], [*toks[:-1], 3],
            toks[:-1], [*toks, "extra"], [], toks * 50])
    return rehead(base, edit)


def gc_meta(r, nrng, base):
    def edit(h):
        m = h["meta"]
        choice = r.randrange(9)
        if choice == 0:
            h["meta"] = r.choice([[], "answer=72", None, 72, [["answer", "72"]]])
        elif choice == 1:
            m["k"] = r.choice([None, [1], {"a": 1}, b"72", msgpack.Timestamp(5, 0)])
        elif choice == 2:
            m["w"] = r.choice([math.nan, math.inf, -math.inf])
        elif choice == 3:
            m["x" * r.randint(129, 300)] = 1
        elif choice == 4:
            h["meta"] = {f"k{i}": i for i in range(r.randint(257, 400))}
        else:
            m[r.choice(["answer", "idx", "hard", "w"])] = r.choice([None, [], {}, b"x", math.nan, math.inf])
    return rehead(base, edit)


def gc_completions(r, nrng, base):
    def edit(h):
        cs = h["completions"]
        choice = r.randrange(4)
        if choice == 0:
            h["completions"] = r.choice(["x", {}, None, 2, {"0": cs[0]}])
        elif choice == 1:
            cs[r.randrange(len(cs))] = r.choice(["text", None, 1, [], [cs[0]]])
        elif choice == 2:
            h["completions"] = r.choice([[], cs[:1], cs + cs[:1], cs * 4])  # G != len(generated_lengths)
        else:
            h["completions"] = cs * 600  # G = 1200 > max_completions (1024)
    return rehead(base, edit)


def gc_completion_field(r, nrng, base):
    def edit(h):
        c = r.choice(h["completions"])
        key = r.choice(["text", "reward", "reward_info", "is_finished"])
        if key == "text":
            c[key] = r.choice(BAD_STR)
        elif key == "reward":
            c[key] = r.choice(BAD_FLOAT)
        elif key == "is_finished":
            c[key] = r.choice(BAD_BOOL)
        else:
            c[key] = r.choice([[], "correct", None, {"correct": math.nan}, {"c": math.inf}, {"c": -math.inf},
                               {"c": "1"}, {"c": True}, {"c": None}, {"c": [1.0]}, {"x" * 200: 1.0},
                               {f"k{i}": 1.0 for i in range(257)}])
    return rehead(base, edit)


def gc_lengths(r, nrng, base):
    # generated_lengths that disagree with the token / log-prob arrays.
    P_, gens = 4, [rand_ids(nrng, 3), rand_ids(nrng, 2)]
    prefix = rand_ids(nrng, P_)
    choice = r.randrange(5)
    if choice == 0:
        lengths = [3, 3]
    elif choice == 1:
        lengths = [-1, 6]
    elif choice == 2:
        lengths = [0, 0]
    elif choice == 3:
        lengths = [2 ** 31 - 1, -(2 ** 31) + 6]
    else:
        lengths = [70000, 2]  # over max_tokens
    return with_arrays(base, g_arrays(nrng, prefix, gens, lengths=lengths))


def gc_logprob_length(r, nrng, base):
    # Log-prob arrays shorter or longer than the generated tokens (descriptors consistent with frames).
    prefix, gens = rand_ids(nrng, 4), [rand_ids(nrng, 3), rand_ids(nrng, 2)]
    arrays = g_arrays(nrng, prefix, gens)
    key = r.choice(["old_policy_log_probs", "ref_policy_log_probs", "generated_token_ids"])
    delta = r.choice([-5, -1, 1, 3])
    if key == "generated_token_ids":
        ids = np.frombuffer(arrays[key], "<i4")
        arrays[key] = i32(ids[:delta] if delta < 0 else np.concatenate([ids, rand_ids(nrng, delta)]))
    else:
        lp = np.frombuffer(arrays[key], "<f4")
        if key == "ref_policy_log_probs" and len(lp) + delta == 0:
            delta = -4   # no reference log-probs at all is valid (schema 2): cut to a wrong length instead
        arrays[key] = f32(lp[:delta] if delta < 0 else np.concatenate([lp, -nrng.random(delta)]))
    return with_arrays(base, arrays)


def gc_whole(r, nrng, base):
    prefix, gens = rand_ids(nrng, 4), [rand_ids(nrng, 3), rand_ids(nrng, 2)]
    arrays = g_arrays(nrng, prefix, gens)
    whole = np.frombuffer(arrays["whole_token_ids"], "<i4").copy()
    choice = r.randrange(3)
    if choice == 0:
        i = r.randrange(len(whole))
        whole[i] = (whole[i] + r.randint(1, VOCAB - 1)) % VOCAB
    elif choice == 1:
        whole = np.concatenate([whole[:1], whole[:-1]])  # shifted by one
    else:
        whole = np.concatenate([gens[0], prefix, gens[1], prefix])  # generated ++ prefix
    arrays["whole_token_ids"] = i32(whole)
    return with_arrays(base, arrays)


def gc_token_range(r, nrng, base):
    prefix, gens = rand_ids(nrng, 4), [rand_ids(nrng, 3), rand_ids(nrng, 2)]
    bad = r.choice([-1, -2 ** 31, VOCAB, VOCAB + 1, 2 ** 31 - 1, 10 ** 6])
    where = r.choice(["prefix", "gen0", "gen1"])
    target = prefix if where == "prefix" else gens[int(where[-1])]
    target[r.randrange(len(target))] = bad
    return with_arrays(base, g_arrays(nrng, prefix, gens))  # whole stays == prefix ++ generated


def gc_log_probs(r, nrng, base):
    prefix, gens = rand_ids(nrng, 4), [rand_ids(nrng, 3), rand_ids(nrng, 2)]
    old = [-(nrng.random(3) + 0.1), -(nrng.random(2) + 0.1)]
    ref = [-(nrng.random(3) + 0.1), -(nrng.random(2) + 0.1)]
    bad = r.choice([math.nan, math.inf, -math.inf, 0.5, 0.002, 3.0, 1e30])
    lp = r.choice([old, ref])[r.randrange(2)]
    lp[r.randrange(len(lp))] = bad
    return with_arrays(base, g_arrays(nrng, prefix, gens, old=old, ref=ref))


def gc_group_size(r, nrng, base):
    # Well-formed groups of the wrong size (the learner fixes G = 2).
    n = r.choice([1, 3, 4, 8])
    g = fuzz_group(nrng, "wrong-size", lengths=tuple(r.randint(0, 4) for _ in range(n)))
    return frames_of(g)


def gc_too_long(r, nrng, base):
    # A prompt over max_tokens (65536): 256 KiB frames, still under the 1 MiB socket cap.
    prefix = rand_ids(nrng, 65537)
    return with_arrays(base, g_arrays(nrng, prefix, [rand_ids(nrng, 1), rand_ids(nrng, 1)]),
                       lambda h: h.__setitem__("prefix_tokens", ["t"] * 65537))


def gc_array_meta(r, nrng, base):
    # Descriptors with the right sizes but the wrong name, order, dtype or rank.
    def edit(h):
        ds = h["arrays"]
        choice = r.randrange(5)
        if choice == 0:
            r.choice(ds)["name"] = r.choice(["prefix_ids", "tokens", "", "bucket_0", "whole_token_ids "])
        elif choice == 1:
            i, j = r.sample(range(6), 2)
            ds[i]["name"], ds[j]["name"] = ds[j]["name"], ds[i]["name"]
        elif choice == 2:
            d = r.choice(ds)
            d["dtype"] = "float32" if d["dtype"] == "int32" else "int32"  # same itemsize, wrong dtype
        elif choice == 3:
            d = r.choice([d for d in ds if d["shape"][0] % 2 == 0 and d["shape"][0] > 0])
            d["shape"] = [2, d["shape"][0] // 2]  # same bytes, 2-D
        else:
            d = r.choice(ds)
            d["dtype"], d["shape"] = "uint8", [d["shape"][0] * 4]  # raw bytes instead of int32/float32
    return rehead(base, edit)


def gc_unknown_kind_fields(r, nrng, base):
    # A valid group except for an unknown kind string; extra keys alone would be legal.
    def edit(h):
        h["extra_key"] = rand_obj(r)
        h["kind"] = r.choice(["group2", "Group", "rollout"])
    return rehead(base, edit)


GROUP_SPECIFIC = [gc_int_field, gc_str_field, gc_missing_field, gc_prefix_tokens, gc_meta, gc_completions,
                  gc_completion_field, gc_lengths, gc_logprob_length, gc_whole, gc_token_range, gc_log_probs,
                  gc_group_size, gc_array_meta, gc_unknown_kind_fields]


# ----------------------------------------------------------------------------- status corruptions


def sc_field(r, nrng, base):
    def edit(h):
        key = r.choice(["sampler_id", "policy_version", "groups_sent", "final", "stats"])
        if r.random() < 0.15:
            del h[key]
        elif key == "final":
            h[key] = r.choice(BAD_BOOL)
        elif key == "stats":
            h[key] = r.choice([[], None, "x", {"a": math.nan}, {"a": math.inf}, {"a": "1"}, {"a": True},
                               {"a": None}, {"x" * 129: 1.0}, {f"k{i}": 1.0 for i in range(257)}])
        else:
            h[key] = r.choice(BAD_INT)
    return rehead(base, edit)


def sc_arrays(r, nrng, base):
    n = r.randint(1, 3)
    descs = [{"name": f"a{i}", "dtype": "uint8", "shape": [4]} for i in range(n)]
    return [pack({**header(base), "arrays": descs}), *[r.randbytes(4) for _ in range(n)]]


STATUS_SPECIFIC = [sc_field, sc_arrays]


# ----------------------------------------------------------------------------- weights / no_update / stop


def wc_scalar(r, nrng, base):
    def edit(h):
        key = r.choice(["version", "request_id", "method"])
        if r.random() < 0.15:
            del h[key]
        elif key == "method":
            h[key] = r.choice(["udp", "", "TCP", "tcp ", 5, None, b"tcp", ["tcp"], "x" * 200])
        elif key == "request_id":
            h[key] = r.choice([x for x in BAD_INT if x != -1] + [-2, -(2 ** 40)])
        else:
            h[key] = r.choice(BAD_INT)
    return rehead(base, edit)


def wc_buckets(r, nrng, base):
    def edit(h):
        choice = r.randrange(6)
        if choice == 0:
            h[r.choice(["bucket_dtypes", "bucket_nbytes"])] = r.choice(["float32", None, 48, {}, True])
        elif choice == 1:
            h["bucket_dtypes"].append("float32")  # length mismatch with bucket_nbytes
        elif choice == 2:
            h["bucket_nbytes"] = h["bucket_nbytes"][:1]
        elif choice == 3:
            h["bucket_dtypes"][r.randrange(2)] = r.choice(BAD_DTYPE + [5, None, b"float32"])
        elif choice == 4:
            h["bucket_nbytes"][r.randrange(2)] = r.choice([-1, -16, True, 1.5, "48", None, [48]])
        else:
            del h[r.choice(["bucket_dtypes", "bucket_nbytes", "layout"])]
    return rehead(base, edit)


def wc_layout(r, nrng, base):
    def edit(h):
        lay = h["layout"]
        i = r.randrange(len(lay))
        t = lay[i]
        choice = r.randrange(14)
        if choice == 0:
            h["layout"] = r.choice(["a.weight", None, {}, 5, {"a.weight": t}])
        elif choice == 1:
            lay[i] = r.choice([{"name": t[0]}, t[0], None, 3, t[:4], [*t, 0], []])
        elif choice == 2:
            t[0] = r.choice([5, None, b"a.weight", [], "n" * 1025])
        elif choice == 3:
            t[1] = r.choice([5, None, b"float32"] + BAD_DTYPE)
        elif choice == 4:
            t[1] = r.choice([d for d in M.DTYPE_SIZES if d != t[1]])  # valid dtype, not the bucket's
        elif choice == 5:
            t[2] = r.choice([[-1], [1.5], "2,3", None, [0] * 9, [True], 6])
        elif choice == 6:
            t[3] = r.choice([2, 3, -1, True, "0", None, 1.0, 2 ** 40])
        elif choice == 7:
            t[4] = r.choice([-16, True, "0", None, 16.0, -(2 ** 63)])
        elif choice == 8:  # misaligned (or, for bfloat16 +2, past the end of its 16-byte bucket)
            t[4] += r.choice([1, 2, 3])
        elif choice == 9:  # bucket overflow: tensor runs past the end of its bucket
            t[4] = h["bucket_nbytes"][t[3]] - (0 if r.random() < 0.5 else 4 if t[1] == "float32" else 2)
            if t[4] % M.DTYPE_SIZES[t[1]]:
                t[4] = h["bucket_nbytes"][t[3]]
        elif choice == 10:
            t[2] = r.choice([[100], [2 ** 40], [2 ** 20, 2 ** 20], [3, 3], [2 ** 62] * 2])
        elif choice == 11:  # overlap: b.bias moved onto a.weight
            h["layout"][1][4] = r.choice([0, 16, 20])
        elif choice == 12:  # a.weight grown into b.bias
            h["layout"][0][2] = r.choice([[3, 3], [2, 5], [9]])
        else:
            lay[r.randrange(len(lay))][0] = lay[(i + 1) % len(lay)][0]  # duplicate name
            if len({x[0] for x in lay}) == len(lay):
                lay.append(list(lay[0]))
    return rehead(base, edit)


def wc_bucket_frames(r, nrng, base):
    h = header(base)
    choice = r.randrange(7)
    if choice == 0:  # bucket frame shorter/longer than its descriptor
        return c_frame_resize(r, nrng, base)
    if choice == 1:  # one bucket missing (descriptor and frame)
        h["arrays"] = h["arrays"][:1]
        return [pack(h), base[1]]
    if choice == 2:  # descriptor and frame agree, bucket_nbytes says otherwise
        h["arrays"][0]["shape"] = [64]
        return [pack(h), base[1] + bytes(16), base[2]]
    if choice == 3:  # out-of-band method, but frames attached
        h["method"] = r.choice(["ipc", "nccl", "shared"])
        return [pack(h), *base[1:]]
    if choice == 4:  # wrong bucket names / dtypes / rank with consistent sizes
        d = r.choice(h["arrays"])
        v = r.randrange(4)
        if v == 0:
            d["name"] = r.choice(["bucket_7", "bucket", "b0", ""])
        elif v == 1:
            d["name"] = "bucket_1" if d["name"] == "bucket_0" else "bucket_0"
        elif v == 2:
            d["dtype"], d["shape"] = "int32", [d["shape"][0] // 4]
        else:
            d["shape"] = [2, d["shape"][0] // 2]
        return [pack(h), *base[1:]]
    if choice == 5:  # an extra bucket frame no bucket_nbytes entry accounts for
        h["arrays"].append({"name": "bucket_2", "dtype": "uint8", "shape": [8]})
        return [pack(h), *base[1:], bytes(8)]
    # more frames than weights_limits allow (4096)
    return [base[0], *[b""] * 4096]


def nc_field(r, nrng, base):
    # no_update / stop fields
    def edit(h):
        keys = ["version", "request_id"] + (["reason"] if h["kind"] == "stop" else [])
        key = r.choice(keys)
        if r.random() < 0.15:
            del h[key]
        elif key == "reason":
            h[key] = r.choice([5, None, b"done", [], "r" * 4097, True])
        elif key == "request_id":
            h[key] = r.choice([x for x in BAD_INT if x != -1] + [-2])
        else:
            h[key] = r.choice(BAD_INT)
    return rehead(base, edit)


def nc_arrays(r, nrng, base):
    return sc_arrays(r, nrng, base)


# ----------------------------------------------------------------------------- case generation


def generate_cases(r: random.Random, nrng: np.random.Generator, n: int, families: list[tuple],
                   limits: M.Limits) -> list[tuple[str, Frames, str]]:
    """n corrupted messages as (family, frames, expected reason), each one checked against `decode`."""
    cases = []
    while len(cases) < n:
        weight_total = sum(w for _, _, w in families)
        x = r.random() * weight_total
        for make_base, fn, w in families:
            x -= w
            if x < 0:
                break
        base = make_base()
        for _ in range(50):
            frames = fn(r, nrng, base)
            reason = reject_reason(frames, limits)  # a crash in decode raises right here
            if reason is not None:
                break
            assert fn in MAY_STAY_VALID, f"{fn.__name__} produced a valid message"
        else:
            raise AssertionError(f"{fn.__name__} kept producing valid messages")
        cases.append((fn.__name__, frames, reason))
    return cases


def data_cases(n: int) -> list[tuple[str, Frames, str]]:
    r, nrng = random.Random(SEED), np.random.default_rng(SEED)
    counter = iter(range(10 ** 9))
    group = lambda: frames_of(fuzz_group(nrng, f"fuzz-{next(counter)}"))
    status = lambda: frames_of(make_status(SAMPLER_ID, groups_sent=r.randint(0, 9), **STATUS_STATS))
    families = [(group, fn, 1.0) for fn in GENERIC + GROUP_SPECIFIC]
    families += [(status, fn, 0.5) for fn in GENERIC]
    families += [(status, fn, 1.0) for fn in STATUS_SPECIFIC]
    families += [(group, gc_too_long, 0.02)]  # 1 MiB of frames each: keep them few
    families += [(group, c_too_many_frames, 0.2), (status, c_too_many_frames, 0.2)]
    return generate_cases(r, nrng, n, families, DATA_LIMITS)


def sync_cases(n: int, limits: M.Limits) -> list[tuple[str, Frames, str]]:
    r, nrng = random.Random(SEED + 2), np.random.default_rng(SEED + 2)
    weights = lambda: frames_of(make_weights(version=r.randint(1, 9), request_id=r.randint(-1, 9)))
    no_update = lambda: frames_of(M.NoUpdate(version=r.randint(0, 9), request_id=r.randint(-1, 9)))
    stop = lambda: frames_of(M.Stop(version=r.randint(0, 9), reason="learner finished",
                                    request_id=r.randint(-1, 9)))
    families = [(weights, fn, 1.0) for fn in GENERIC]
    families += [(weights, wc_scalar, 2.0), (weights, wc_buckets, 2.0), (weights, wc_layout, 5.0),
                 (weights, wc_bucket_frames, 2.0), (weights, c_gigantic_shape, 1.0)]
    families += [(base, fn, 0.4) for base in (no_update, stop) for fn in GENERIC]
    families += [(base, fn, 1.5) for base in (no_update, stop) for fn in (nc_field, nc_arrays)]
    return generate_cases(r, nrng, n, families, limits)


def oversized_messages(r: random.Random, nrng: np.random.Generator, max_message_mb: int) -> list[Frames]:
    """Messages with a frame over the learner's --max-message-mb: libzmq drops them (and the peer), uncounted."""
    big = (max_message_mb << 20) + 1
    prefix = rand_ids(nrng, big // 4 + 1)  # a 1 MiB+ prompt
    group = with_arrays(frames_of(fuzz_group(nrng, "big")), g_arrays(nrng, prefix, [rand_ids(nrng, 1)] * 2),
                        lambda h: h.__setitem__("prefix_tokens", ["t"] * len(prefix)))
    valid_hdr = frames_of(fuzz_group(nrng, "big-frame"))
    return [
        [r.randbytes(big)],                                          # one huge random frame
        [pack({"schema": M.SCHEMA_VERSION, "kind": "status", "pad": "x" * big})],   # a header over the cap
        group,                                                       # a real group, too big
        [valid_hdr[0], valid_hdr[1], r.randbytes(4 << 20)],          # small header, 4 MiB frame
        [b"", r.randbytes(big), b"tail"],
        [frames_of(make_status(SAMPLER_ID, **STATUS_STATS))[0], r.randbytes(big)],
    ]
