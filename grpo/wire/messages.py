"""Wire messages between samplers and the learner: the types, the size limits and the error.

The codec (grpo.wire.codec) turns these into ZeroMQ frames and back, checking everything;
the transport (grpo.wire.transport) moves the frames. docs/protocol.md is the specification.
This module has no dependencies beyond numpy, so any process (or test) can use it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

import numpy as np

# 2: the first answer on the sync channel carries the run's facts (RunFacts); version 0 is
#    published, so a weights_request with have_version -1 gets the starting weights.
SCHEMA_VERSION = 2
KINDS = ("group", "status", "weights_request", "weights", "no_update", "stop")
# name -> itemsize. Explicit '<' byte order: the wire is little-endian whatever the host.
DTYPE_SIZES = {"int32": 4, "int64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "uint8": 1}
NP_DTYPES = {"int32": "<i4", "int64": "<i8", "float32": "<f4", "float16": "<f2", "uint8": "u1"}
# How weights travel (docs/weight-sync.md); grpo.weights chooses among them.
TCP, IPC, NCCL, SHARED = "tcp", "ipc", "nccl", "shared"
WEIGHT_METHODS = (TCP, IPC, NCCL, SHARED)
# (name, dtype) of the array frames of a "group", in wire order.
GROUP_ARRAYS = (("prefix_token_ids", "int32"), ("generated_lengths", "int32"), ("generated_token_ids", "int32"),
                ("old_policy_log_probs", "float32"), ("ref_policy_log_probs", "float32"), ("whole_token_ids", "int32"))
MAX_LOG_PROB = 1e-3  # log p <= 0; allow a little float noise from log_softmax
MAX_ID_CHARS = 128  # group_id, map keys, tensor names are short identifiers
MAX_MAP_ITEMS = 256  # meta / reward_info / stats are "small maps"
MAX_REASON_CHARS = 4096
# A CUDA IPC memory handle: 64 bytes for a plain allocation; under PYTORCH_CUDA_ALLOC_CONF=
# expandable_segments:True torch serialises one entry per mapped page of the segment, which for
# a slot of a multi-billion-parameter model's weights runs to hundreds of bytes: a small limit
# would drop every version.
MAX_IPC_HANDLE_BYTES = 1 << 18   # within the 1 MiB header limit
I64_MAX = (1 << 63) - 1


@dataclass(frozen=True)
class Origin:
    """Who a rejected group or status says it is: read from its header when the header itself
    was valid, so that a malformed group of a known sampler process can be charged to its books."""
    kind: str
    sampler_id: int
    incarnation: int
    seq: int = 0   # a group's place among its process's handed groups (Group.seq; 0: not said)


class ProtocolError(ValueError):
    """A message that must be dropped. ``reason`` is a short code for counters; ``origin`` is set
    when the header parsed and names a sampler process (see Origin)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.origin: Origin | None = None


@dataclass(frozen=True)
class Limits:
    max_header_bytes: int = 1 << 20
    max_frames: int = 64
    max_array_bytes: int = 1 << 28  # per array frame (weights: see weights_limits)
    max_completions: int = 1024  # completions per group
    max_tokens: int = 1 << 16  # per completion (generated) and per prefix
    vocab_size: int | None = None  # if set, every token id must be in [0, vocab_size)
    group_size: int | None = None  # if set, a group must have exactly this many completions


def weights_limits(total_bytes: int) -> Limits:
    """Limits for the sync socket: one bucket frame may hold the whole model."""
    return Limits(max_array_bytes=max(int(total_bytes), Limits.max_array_bytes), max_frames=4096)


@dataclass
class Completion:
    generated_token_ids: np.ndarray  # int32 [n]
    old_policy_log_probs: np.ndarray  # float32 [n] behaviour-policy log-prob per generated token
    ref_policy_log_probs: np.ndarray  # float32 [n] reference-model log-prob per generated token
    whole_token_ids: np.ndarray  # int32 [P + n] == prefix_token_ids ++ generated_token_ids
    text: str
    reward: float
    reward_info: dict[str, float]
    is_finished: bool  # generation ended with EOS before the length cap


@dataclass
class Group:  # the unit of transfer: all G completions of one prompt
    sampler_id: int
    group_id: str
    policy_version: int
    prefix: str  # prompt text after chat template
    prefix_tokens: list[str]  # token strings of the prefix, one per prefix token id
    prefix_token_ids: np.ndarray  # int32 [P]
    completions: list[Completion]
    meta: dict[str, object]  # small map str -> str|int|float|bool, e.g. {"answer": "72"}
    incarnation: int = 0  # random id of the sampler process that made it (a restart gets a new one)
    # policy_version is the oldest version that drew any of its tokens (its age: the staleness bound's);
    # with weights swapped in flight later tokens may come from newer ones, up to this (-1: not said).
    max_version: int = -1
    # Its place among the groups its process has handed to the data socket, from 1 (0: not said). One
    # process's groups leave on one connection in this order, so the learner can tell those a weights
    # request's `sent` counts from those handed after it (grpo.sync.flow.received_among).
    seq: int = 0


@dataclass
class SamplerStatus:
    sampler_id: int
    policy_version: int  # weights version the sampler now runs
    groups_sent: int  # cumulative groups handed to the data socket
    final: bool  # last status before the sampler exits
    stats: dict[str, float]
    incarnation: int = 0  # random id of this sampler process, so a restart's counts start fresh


@dataclass
class WeightsRequest:  # sampler -> learner on the sync socket
    sampler_id: int
    have_version: int  # -1: no weights yet
    request_id: int = 0  # echoed in the answer, so a late answer is never taken for the current one
    method: str = ""  # the weight-sync method this sampler can use ("": whatever the learner offers)
    sent: int = -1  # groups this process has handed to its data socket so far (-1: not said)
    incarnation: int = 0  # random id of the asking process, as its groups carry (0: not said)


@dataclass
class RunFacts:
    """What a sampler must know, and agree with, to produce groups the learner accepts.

    Sent in the first answer on each sync connection (and to any request with have_version -1).
    """
    schema: int               # SCHEMA_VERSION of the learner
    model: str                # the model the learner trains (a path or hub id; informational)
    vocab_size: int           # every token id must be in [0, vocab_size)
    dtype: str                # the dtype weights are published in ("bfloat16" on GPU, "float32" on CPU)
    num_generations: int      # G: completions per group, exactly
    max_new_tokens: int       # longest completion the learner trains on
    max_prompt_tokens: int    # longest prompt the learner trains on
    temperature: float        # the sampling temperature; the learner scores log-probs at it
    needs_ref_logprobs: bool  # whether ref_policy_log_probs are used (beta > 0)
    max_staleness: int        # groups more than this many versions behind the learner are dropped
    groups_per_step: int = 0  # groups the learner trains per step (train batch / G)


@dataclass
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]
    bucket: int
    offset: int  # byte offset inside bucket


@dataclass
class WeightsAnnounce:  # learner -> sampler
    version: int
    method: str  # "tcp": buckets ride as frames; "ipc"/"nccl"/"shared": carried out of band
    layout: list[TensorSpec]
    bucket_dtypes: list[str]
    bucket_nbytes: list[int]
    buckets: list[memoryview]  # tcp: raw bytes of each bucket; empty for other methods
    request_id: int = -1  # the weights_request this answers (-1: unsolicited)
    ipc: IpcHandle | None = None  # method "ipc": where the buckets are on the learner's GPU
    nccl: NcclRendezvous | None = None  # method "nccl": where to meet the learner for the bytes
    shared: list[IpcHandle] | None = None  # method "shared": one handle per storage ("bucket") of the parameters
    run: RunFacts | None = None  # the run's facts: in the first answer to each sync connection
    levels: dict[str, int] | None = None  # --curriculum: every task's current level, in every answer
    queued: int = -1  # groups waiting at the learner to be trained (-1: not said)
    budget: int = -1  # groups this sampler may generate now, none certain to be stale (-1: no limit said)
    counted: int = -1  # the newest Group.seq of the asking process the budget accounts for (-1: not said)


@dataclass
class NcclRendezvous:
    """Method "nccl": the learner sends the buckets (back to back) to this sampler alone over a
    two-rank process group (learner rank 0, sampler rank 1) whose TCP store is at host:port.
    The same host:port means the same group; a new one means build a new group."""
    host: str
    port: int
    backend: str  # "nccl" (CUDA) or "gloo" (CPU)


@dataclass
class IpcHandle:
    """A CUDA IPC handle of one published slot: the buckets back to back, then an int64 stamp.

    The fields are those of torch's ``UntypedStorage._share_cuda_()``; they are bytes and
    integers that name memory on the learner's GPU, never code. ``gpu_uuid`` names that GPU
    (indices differ between processes with different CUDA_VISIBLE_DEVICES).
    """
    gpu_uuid: str
    slot: int
    handle: bytes
    storage_nbytes: int
    storage_offset: int
    ref_counter_handle: bytes
    ref_counter_offset: int
    event_handle: bytes
    event_sync_required: bool
    stamp_offset: int  # byte offset of the int64 version stamp (after the last bucket)


@dataclass
class NoUpdate:
    version: int
    request_id: int = -1
    run: RunFacts | None = None
    levels: dict[str, int] | None = None
    queued: int = -1
    budget: int = -1
    counted: int = -1


@dataclass
class Stop:
    version: int
    reason: str
    request_id: int = -1
    run: RunFacts | None = None
    levels: dict[str, int] | None = None


Message = Union[Group, SamplerStatus, WeightsRequest, WeightsAnnounce, NoUpdate, Stop]
Frame = Union[bytes, memoryview, Any]
