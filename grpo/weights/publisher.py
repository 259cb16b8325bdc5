"""Weight publication: learner rank 0 serves versions on the sync port.

The exchange is the same for every method (docs/weight-sync.md): a sampler sends a
weights_request naming the version it has; the publisher's thread answers at once with the
newest version's announcement (version, method, layout, and for tcp the bytes), no_update,
or stop. How a version is captured and how its bytes travel is each method's own
(grpo.weights.tcp, .slots for ipc and nccl, .shared); `Publisher` is the common part.
What else an answer carries (the run's facts, curriculum levels, the generation budget) is the
control channel's, grpo.sync.answer, given to the publisher as `answers`; the sampler's side
of the exchange is grpo.sync.client.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from grpo.weights.layout import plan_layout
from grpo.weights.pack import Coalescer
from grpo.wire import messages as M
from grpo.wire.transport import Server

log = logging.getLogger(__name__)
MAX_TOLD = 4096   # sync connections remembered as answered (told the run's facts; told stop at the end)


@torch.no_grad()
def publish_named(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """What samplers receive: (name, tensor) under the base model's parameter names.

    For a peft (LoRA) model, every LoRA-wrapped weight is W + scale * B @ A (computed into a new
    tensor; the trained weights are not touched), named as the plain
    `AutoModelForCausalLM.named_parameters()` names it, and adapter tensors are left out: samplers
    need no peft (grpo.learner.lora says why merged). For a plain model this is just
    `list(model.named_parameters())`.
    """
    if not hasattr(model, "peft_config"):
        return list(model.named_parameters())
    from peft.tuners.lora import LoraLayer  # here: peft only for a LoRA model (a plain one needs none)

    base = model.get_base_model()  # the transformers model, with LoRA layers injected
    deltas: dict[str, torch.Tensor] = {}
    for mod_name, mod in base.named_modules():
        if isinstance(mod, LoraLayer) and not mod.merged:
            delta = None
            for adapter in mod.active_adapters:
                if adapter in mod.lora_A:
                    d = mod.get_delta_weight(adapter)
                    delta = d if delta is None else delta + d
            if delta is not None:
                deltas[f"{mod_name}.base_layer.weight"] = delta
    out: list[tuple[str, torch.Tensor]] = []
    for name, p in base.named_parameters():
        if ".lora_" in name or "lora_embedding" in name:
            continue
        t = p.detach()
        if name in deltas:
            t = t + deltas[name].to(t.dtype)
        out.append((name.replace(".base_layer.", "."), t))
    return out


@dataclass
class Snapshot:
    """One published version: the announcement and the CPU buckets it points into."""
    version: int
    announce: M.WeightsAnnounce
    created: float = field(default_factory=time.monotonic)
    slot: int = -1  # slot publishers (ipc/nccl): which slot holds this version


class Publisher:
    """Learner rank 0: keeps the newest snapshot and serves it from a thread on the sync port.

    The thread answers each weights_request at once: weights if the sampler is behind,
    no_update if it is current, stop once the learner is finishing. It also records, per
    sampler, the version that sampler last reported, so the metrics show who runs what.
    A method's publisher (tcp, slots, shared) says how a version is captured (`publish`) and
    how its bytes travel (`_reply_weights`); the request/answer rules are the same for all.

    `answers` (grpo.sync.answer.SyncAnswer, or None for answers with no control fields) gives
    the control fields of every answer: `answers.fields(identity, request, first, version, fresh,
    stopping)` and, for the unprompted stop at the end, `answers.unsolicited_stop()`.
    """

    method = ""

    def __init__(self, server: Server, model: torch.nn.Module, dtype: torch.dtype | None = None,
                 start: bool = True, answers: Any = None):
        self.server = server
        # Samplers run in `dtype` (bf16 on GPU): publishing fp32 master weights would double
        # the bytes for nothing, since the sampler casts them down anyway.
        named = [(n, p if dtype is None else p.detach().to("meta", dtype)) for n, p in publish_named(model)]
        self.layout, self.bucket_dtypes, self.bucket_nbytes = plan_layout(named)
        self.coalescer = Coalescer(self.layout, self.bucket_nbytes)   # which tensors copy as one
        self._snapshot: Snapshot | None = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._closed = threading.Event()
        self.sampler_versions: dict[int, int] = {}
        self.bytes_served = 0
        self.replies = {"weights": 0, "no_update": 0, "stop": 0}
        self.stopped_samplers: set[int] = set()
        self.peers = None  # grpo.learner.liveness.SyncPeers: binds a connection to one sampler id (set by the learner)
        self.on_reject: Callable[[str, bytes], None] | None = None   # (reason, peer): the learner's message ledger
        self.answers = answers   # the control fields of each answer (grpo.sync.answer)
        # Connections answered (so told the run's facts, if any): the newest MAX_TOLD; told stop at the end.
        self._told: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        # Requests with have_version -1 that came before anything was published: answered with
        # the first version published (a client with no weights must not be told "no update").
        self._deferred: dict[bytes, M.WeightsRequest] = {}
        self._thread = threading.Thread(target=self._serve, name="weight-sync", daemon=True)
        if start:   # a subclass starts it once its own state exists
            self._thread.start()

    def publish(self, version: int, model: torch.nn.Module) -> float:
        """Capture the model as `version`; returns the seconds the learner was stalled."""
        raise NotImplementedError

    def stop_samplers(self) -> None:
        """From now on every request is answered with stop; every connection answered so far is
        also sent one stop unprompted (by the serving thread, which owns the socket), so a sampler
        in the middle of a long round hears it between decode chunks instead of after the round."""
        self._stopping.set()

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5)
        self.server.close()

    def _serve(self) -> None:
        told_stop = False
        while not self._closed.is_set():
            if self._stopping.is_set() and not told_stop:
                told_stop = True
                self._tell_stop()
            got = self.server.receive(timeout_s=0.1)
            if self._deferred and self._snapshot is not None:   # the first version is out: answer them
                deferred, self._deferred = self._deferred, {}
                for identity, msg in deferred.items():
                    self._answer(identity, msg)
            if got is None:
                continue
            # Requests that queued up while we were busy (or before this thread existed, while
            # the model loaded) are answered only by each sampler's newest one: a sampler waits
            # for the answer to its latest request alone, and sending full weights to every
            # stale one would fill the ROUTER's queue to that peer (SNDHWM), so the answer
            # that matters would be dropped.
            latest: dict[bytes, M.WeightsRequest] = {}
            while got is not None:
                identity, msg = got
                if not isinstance(msg, M.WeightsRequest):
                    self._reject("unexpected_kind", identity)
                elif self.peers is not None and (why := self.peers.accept(identity, msg.sampler_id)):
                    self._reject(why, identity)  # a made-up or borrowed sampler id: no answer
                elif identity not in latest or msg.request_id >= latest[identity].request_id:
                    latest[identity] = msg
                got = self.server.receive(timeout_s=0)
            for identity, msg in latest.items():
                self._answer(identity, msg)

    def _tell_stop(self) -> None:
        """One unsolicited stop (request_id -1) to every connection answered so far (at most MAX_TOLD).
        Never blocks: the ROUTER drops it for a peer gone or with a full queue, and that sampler
        gets stop as the answer to its next request instead."""
        with self._lock:
            version = self._snapshot.version if self._snapshot else 0
        for identity in list(self._told):
            self.server.reply(identity, M.Stop(version=version, reason="learner finished", request_id=-1,
                                               **(self.answers.unsolicited_stop() if self.answers else {})))
        if self._told:
            log.info("told %d sampler connection(s) to stop", len(self._told))

    def _reject(self, reason: str, identity: bytes) -> None:
        self.server.rejected[reason] += 1
        if self.on_reject is not None:
            self.on_reject(reason, identity)

    def guard(self):
        """Held around a training step and its publish (method shared locks; the others need nothing)."""
        return contextlib.nullcontext()

    def _on_request(self, identity: bytes, msg: M.WeightsRequest) -> None:
        """Hook: every request, before it is answered (ipc counts acknowledgements here)."""

    def _reply_weights(self, identity: bytes, msg: M.WeightsRequest, snap: Snapshot, extra: dict) -> int:
        # Same buckets (no copy), only the header differs: the request id and the control fields.
        return self.server.reply(identity, dataclasses.replace(snap.announce, **extra))

    def _first_answer_to(self, identity: bytes) -> bool:
        """Whether `identity` was never answered before; it counts as answered from now on."""
        first = identity not in self._told
        self._told[identity] = None
        self._told.move_to_end(identity)
        while len(self._told) > MAX_TOLD:   # bounded: a peer making up connections cannot grow it
            self._told.popitem(last=False)
        return first

    def _answer(self, identity: bytes, msg: M.WeightsRequest) -> None:
        self.sampler_versions[msg.sampler_id] = msg.have_version
        self._on_request(identity, msg)
        with self._lock:
            snap = self._snapshot
        if snap is None and msg.have_version < 0 and not self._stopping.is_set():
            if identity in self._deferred or len(self._deferred) < MAX_TOLD:
                self._deferred[identity] = msg
            return
        current = snap.version if snap else 0
        first = self._first_answer_to(identity)
        fresh = snap is not None and msg.have_version < snap.version   # the answer carries weights
        stopping = self._stopping.is_set()
        # What every answer carries besides its kind's own fields: the request id and the control fields.
        extra = {"request_id": msg.request_id,
                 **(self.answers.fields(identity, msg, first, current, fresh, stopping) if self.answers else {})}
        if stopping:
            self.server.reply(identity, M.Stop(version=current, reason="learner finished", **extra))
            self.replies["stop"] += 1
            self.stopped_samplers.add(msg.sampler_id)
            return
        if fresh:
            self.bytes_served += self._reply_weights(identity, msg, snap, extra)
            self.replies["weights"] += 1
        else:
            self.server.reply(identity, M.NoUpdate(version=current, **extra))
            self.replies["no_update"] += 1
