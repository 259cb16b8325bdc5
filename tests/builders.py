"""Builders of wire messages (grpo.wire.messages), one set for every test folder: ``from builders import ...``.

Every parameter has a default, so a test names only what it is about, and unless told otherwise
each builder makes a message that ``codec.decode`` accepts (with ``M.Limits(vocab_size=VOCAB)``):

* ``make_completion`` / ``make_group``: from token ids the test writes out (hand-worked cases);
* ``random_group``: token ids and log-probs drawn from a seeded generator, with every kind of
  header value (non-ASCII text, an empty completion, a meta of str/int/bool/float);
* ``make_status``, ``make_weights``: a sampler status, a weights announce for each method;
* ``frames_of``: a message encoded, as private bytes a test may edit.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from grpo.wire import codec
from grpo.wire import messages as M

VOCAB = 1000  # random_group draws token ids from [0, VOCAB) unless given another vocab

Ids = Sequence[int] | np.ndarray


def make_completion(generated: Ids = (1, 2), prefix_ids: Ids = (), *, old_log_probs: Any = None,
                    ref_log_probs: Any = None, whole_token_ids: Ids | None = None, text: str = "",
                    reward: float = 0.0, reward_info: dict[str, float] | None = None,
                    is_finished: bool = True) -> M.Completion:
    """The completion `generated` of the prompt `prefix_ids`.

    Log-probs default to -0.1, -0.2, ... (old) and -0.01, -0.02, ... (ref), one per generated token;
    whole_token_ids to prefix_ids ++ generated. Arrays already int32 / float32 are kept, not copied.
    """
    gen = np.asarray(generated, np.int32)
    steps = np.arange(len(gen), dtype=np.float32) + 1
    old = -steps / 10 if old_log_probs is None else np.asarray(old_log_probs, np.float32)
    ref = -steps / 100 if ref_log_probs is None else np.asarray(ref_log_probs, np.float32)
    whole = (np.concatenate([np.asarray(prefix_ids, np.int32), gen]) if whole_token_ids is None
             else np.asarray(whole_token_ids, np.int32))
    return M.Completion(generated_token_ids=gen, old_policy_log_probs=old, ref_policy_log_probs=ref,
                        whole_token_ids=whole, text=text, reward=reward,
                        reward_info={} if reward_info is None else reward_info, is_finished=is_finished)


def make_group(completions: Sequence[M.Completion | Ids] = ((1, 2),), prefix_ids: Ids = (1, 2), *,
               rewards: Sequence[float] | None = None, sampler_id: int = 0, group_id: str = "g",
               policy_version: int = 0, prefix: str = "", prefix_tokens: list[str] | None = None,
               meta: dict[str, object] | None = None, incarnation: int = 0) -> M.Group:
    """A group of the prompt `prefix_ids`: each of `completions` is a Completion, or the generated token
    ids of one (make_completion's defaults, and rewards[i] as its reward if rewards are given).

    prefix_tokens defaults to one token string "tok<i>" per prefix id.
    """
    prefix_ids = np.asarray(prefix_ids, np.int32)
    comps = [c if isinstance(c, M.Completion)
             else make_completion(c, prefix_ids, reward=0.0 if rewards is None else rewards[i])
             for i, c in enumerate(completions)]
    return M.Group(sampler_id=sampler_id, group_id=group_id, policy_version=policy_version, prefix=prefix,
                   prefix_tokens=[f"tok{i}" for i in range(len(prefix_ids))] if prefix_tokens is None
                   else prefix_tokens,
                   prefix_token_ids=prefix_ids, completions=comps, meta={} if meta is None else meta,
                   incarnation=incarnation)


def mixed_completion(i: int) -> dict[str, Any]:
    """random_group's default text, reward, reward_info and is_finished of completion i."""
    return {"text": f"completion {i} ✓", "reward": float(i) - 0.5,
            "reward_info": {"correct": float(i % 2), "format": 0.25}, "is_finished": i % 2 == 0}


def random_group(lengths: Sequence[int] = (3, 0, 7, 2), prefix_len: int = 5, *,
                 rng: np.random.Generator | int = 0, vocab: int = VOCAB, log_prob_margin: float = 0.0,
                 completion_fields: Callable[[int], dict[str, Any]] = mixed_completion, sampler_id: int = 3,
                 group_id: str = "s3-r7-g1", policy_version: int = 12, prefix: str = "What is 8*9?",
                 prefix_tokens: list[str] | None = None, meta: dict[str, object] | None = None,
                 incarnation: int = 0) -> M.Group:
    """A group with one completion per entry of `lengths` (0: an empty one) after a prompt of prefix_len ids.

    `rng` is a Generator (drawn from, so successive groups differ) or a seed. It draws, in this order,
    the prompt's ids, then per completion its ids and its old and ref log-probs, each in
    (-5 - log_prob_margin, -log_prob_margin]; ids are in [0, vocab). completion_fields(i) gives the other
    fields of completion i (make_completion's keywords); meta defaults to a fresh
    {"answer": "72", "idx": 5, "hard": True, "w": 0.5}, prefix_tokens to one "tok<i>" per prompt id.
    """
    rng = np.random.default_rng(rng)  # a Generator comes back unchanged
    prefix_ids = rng.integers(0, vocab, prefix_len, dtype=np.int32)
    comps = []
    for i, n in enumerate(lengths):
        gen = rng.integers(0, vocab, n, dtype=np.int32)
        old = -rng.random(n, dtype=np.float32) * 5 - log_prob_margin
        ref = -rng.random(n, dtype=np.float32) * 5 - log_prob_margin
        comps.append(make_completion(gen, prefix_ids, old_log_probs=old, ref_log_probs=ref, **completion_fields(i)))
    return make_group(comps, prefix_ids, sampler_id=sampler_id, group_id=group_id, policy_version=policy_version,
                      prefix=prefix, prefix_tokens=prefix_tokens,
                      meta={"answer": "72", "idx": 5, "hard": True, "w": 0.5} if meta is None else meta,
                      incarnation=incarnation)


def make_status(sampler_id: int = 0, incarnation: int = 0, groups_sent: int = 0, final: bool = False, *,
                policy_version: int = 0, **stats: float) -> M.SamplerStatus:
    """A status of the process (sampler_id, incarnation); the other keyword arguments are its stats, as floats."""
    return M.SamplerStatus(sampler_id=sampler_id, policy_version=policy_version, groups_sent=groups_sent,
                           final=final, stats={k: float(v) for k, v in stats.items()}, incarnation=incarnation)


def make_weights(method: str = "tcp", *, version: int = 9, request_id: int = -1) -> M.WeightsAnnounce:
    """A weights announce of three tensors in two buckets, carried by `method` (tcp, ipc, nccl or shared).

    bucket 0: float32 [a.weight (2, 3) @0 = 0, 0.5, ..., 2.5; b.bias (4,) @32 (16-byte aligned)];
    bucket 1: bfloat16 bit patterns [c.weight (2, 4) @0]. Only tcp carries the buckets as frames.
    """
    b0 = np.arange(12, dtype="<f4") * 0.5
    b1 = np.arange(8, dtype="<u2") + 0x3F80
    layout = [M.TensorSpec("a.weight", "float32", (2, 3), 0, 0),
              M.TensorSpec("b.bias", "float32", (4,), 0, 32),
              M.TensorSpec("c.weight", "bfloat16", (2, 4), 1, 0)]
    buckets = [memoryview(b0).cast("B"), memoryview(b1).cast("B")] if method == M.TCP else []
    ipc = (M.IpcHandle(gpu_uuid="GPU-0a1b", slot=1, handle=bytes(range(64)), storage_nbytes=128, storage_offset=0,
                       ref_counter_handle=b"/torch_123_456", ref_counter_offset=3, event_handle=bytes(64),
                       event_sync_required=True, stamp_offset=64) if method == M.IPC else None)
    nccl = M.NcclRendezvous("10.0.0.7", 29555, "nccl") if method == M.NCCL else None
    shared = ([M.IpcHandle("GPU-0a1b", i, bytes(range(64)), n, 0, b"/torch_1_2", i, bytes(64), False, 0)
               for i, n in enumerate((48, 16))] if method == M.SHARED else None)
    return M.WeightsAnnounce(version=version, method=method, layout=layout, bucket_dtypes=["float32", "bfloat16"],
                             bucket_nbytes=[48, 16], buckets=buckets, request_id=request_id, ipc=ipc, nccl=nccl,
                             shared=shared)


def frames_of(msg: M.Message) -> list[bytes]:
    """`msg` encoded, each frame copied to bytes of its own (safe to slice, edit, send twice)."""
    return [bytes(f) for f in codec.encode(msg)]
