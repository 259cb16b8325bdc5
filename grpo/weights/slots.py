"""The slot publisher: versions in two slots on the learner's device, served as ipc, nccl or tcp.

Two *slots* on the learner's device, each one allocation holding the flat per-dtype buckets
back to back (grpo.weights.layout) and then an int64 version *stamp*. Publishing version v
copies the parameters into the slot that is not the newest (device-to-device, on the training
stream, so the next optimizer step cannot overtake it) and announces (v, layout, the slot).
The learner's host thread only enqueues the copies. Each sampler is served the way it asks
(grpo.rules.methods.serve_method): the slot's CUDA IPC handle (grpo.weights.ipc), the slot sent over
a point-to-point group (grpo.weights.nccl), or its bytes over the sync socket (tcp).

Ownership: a slot belongs to the learner, which writes it; after it announces version v in
slot s, samplers may read s until they acknowledge v (their next weights_request reports
have_version >= v; the sampler sends one right after applying). Before writing s again
the learner waits for those acknowledgements, up to `ack_timeout_s`; a sampler that has
not answered by then is taken for gone (logged), and one whose sampler id asks again on a new
connection (a restarted process) is released at once. As a last guard an ipc reader checks the
stamp before and after its copy (a seqlock, grpo.weights.ipc), so no torn version is ever
generated with.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time

import torch

from grpo.weights.ipc import share_storage
from grpo.weights.layout import bucket_slices
from grpo.rules.methods import serve_method
from grpo.weights.nccl import PairGroups
from grpo.weights.publisher import Publisher, Snapshot, publish_named
from grpo.wire import messages as M
from grpo.wire.transport import Server

log = logging.getLogger(__name__)
SLOTS = 2


class SlotPublisher(Publisher):
    """Learner rank 0: publishes into two slots on its device and serves each sampler the way it asks.

    'ipc' (CUDA): the slot's IPC handle; 'nccl': the slot sent over a point-to-point group
    with that sampler (NCCL on CUDA, gloo on CPU; see grpo.weights.nccl); 'tcp': bytes copied
    from the slot. All three read the same slots, under the same acknowledgement rule.
    """

    def __init__(self, server: Server, model: torch.nn.Module, dtype: torch.dtype | None = None,
                 ack_timeout_s: float = 10.0, method: str = M.IPC, host: str = "127.0.0.1",
                 nccl_timeout_s: float = 60.0, answers=None):
        super().__init__(server, model, dtype, start=False, answers=answers)
        self.method = method
        device = next(model.parameters()).device
        self.device = device
        self.total = sum(self.bucket_nbytes)
        self.ack_timeout_s = ack_timeout_s
        self.slots = [torch.zeros(self.total + 64, dtype=torch.uint8, device=device) for _ in range(SLOTS)]
        self.stamps = [s[self.total:self.total + 8].view(torch.int64) for s in self.slots]
        for st in self.stamps:
            st.fill_(-1)
        cuda = device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(device)
        # Stamp offset relative to the shared storage, like the buckets (at 0).
        self.handles = [share_storage(self.slots[i].untyped_storage(), device.index, i, self.total) if cuda else None
                        for i in range(SLOTS)]
        self.pairs = PairGroups(host, "nccl" if cuda else "gloo", nccl_timeout_s)
        self.slot_version = [-1] * SLOTS
        self.pending: list[set[bytes]] = [set() for _ in range(SLOTS)]   # readers that have not acked
        self._reader_of: dict[int, bytes] = {}   # sampler id -> the connection it last asked on
        self._cv = threading.Condition(self._lock)
        self.ack_waits_s: list[float] = []
        self._ready: torch.cuda.Event | None = None
        self._tcp_cache = None
        self._thread.start()
        log.info("weight sync: %s, %d slots of %.1f MB on %s", method, SLOTS, self.total / 1e6,
                 self.handles[0].gpu_uuid if cuda else "cpu")

    def publish(self, version: int, model: torch.nn.Module) -> float:
        t0 = time.perf_counter()
        with self._cv:
            newest = self._snapshot.slot if self._snapshot else -1
            slot = (newest + 1) % SLOTS
            # Never write a slot a sampler may still be reading: wait for its acknowledgement.
            deadline = time.monotonic() + self.ack_timeout_s
            while self.pending[slot] and time.monotonic() < deadline:
                self._cv.wait(timeout=deadline - time.monotonic())
            if self.pending[slot]:
                log.warning("ipc: %d sampler(s) did not acknowledge version %d within %.1f s; taking them for "
                            "gone and reusing the slot", len(self.pending[slot]), self.slot_version[slot],
                            self.ack_timeout_s)
                self.pending[slot].clear()
        waited = time.perf_counter() - t0
        # On the training stream: the copies read the parameters before the next step writes them.
        # Parameters that sit back to back in one storage (DeepSpeed's flat bf16 buffer) are
        # copied as one run each; the rest in one _foreach_copy_ (grpo.weights.pack).
        tensors = [p for _, p in publish_named(model)]
        with torch.no_grad():
            self.stamps[slot].fill_(-1)
            self.coalescer.copy_into(self.slots[slot], tensors, cache_key=slot)
            self.stamps[slot].fill_(version)
        done = None
        if self.device.type == "cuda":
            done = torch.cuda.Event(enable_timing=False)
            done.record()
        announce = M.WeightsAnnounce(version=version, method=M.IPC, layout=self.layout,
                                     bucket_dtypes=self.bucket_dtypes, bucket_nbytes=self.bucket_nbytes,
                                     buckets=[], ipc=self.handles[slot])
        with self._cv:
            self.slot_version[slot] = version
            self._snapshot = Snapshot(version, announce, slot=slot)
            self._ready = done
            self._tcp_cache = None
        self.ack_waits_s.append(waited)
        return time.perf_counter() - t0

    def _on_request(self, identity: bytes, msg: M.WeightsRequest) -> None:
        with self._cv:
            # A sampler id asking on a new connection is a restarted process (--restart-samplers):
            # the one it replaces is dead and will never acknowledge what it was reading, so its
            # reads end here rather than holding the next publish for ack_timeout_s.
            old = self._reader_of.get(msg.sampler_id)
            if old is not None and old != identity:
                for s in range(SLOTS):
                    self.pending[s].discard(old)
                self._cv.notify_all()
            self._reader_of[msg.sampler_id] = identity
            for s in range(SLOTS):
                if identity in self.pending[s] and msg.have_version >= self.slot_version[s]:
                    self.pending[s].discard(identity)
                    self._cv.notify_all()

    def _reply_weights(self, identity: bytes, msg: M.WeightsRequest, snap: Snapshot, extra: dict) -> int:
        if self._ready is not None:
            self._ready.synchronize()   # the serve thread, not the learner, waits for the copy to land
        method = serve_method(msg.method, self.method, has_ipc=snap.announce.ipc is not None)
        if method == M.NCCL:
            with self._cv:
                self.pending[snap.slot].add(identity)
            # Header first (version, layout, where to meet), then the bytes on the pair group.
            announce = dataclasses.replace(snap.announce, method=M.NCCL, ipc=None,
                                           nccl=self.pairs.rendezvous(identity, snap.slot), **extra)
            n = self.server.reply(identity, announce)
            if not self.pairs.send(identity, self.slots[snap.slot][:self.total]):
                with self._cv:   # the sampler is gone: it reads nothing more from this slot
                    self.pending[snap.slot].discard(identity)
                    self._cv.notify_all()
            return n + self.total
        if method == M.TCP:
            # A sampler that cannot map our GPU (another host, or not visible): bytes, copied
            # from the slot by this thread, once per version.
            with self._cv:
                cache = self._tcp_cache
            if cache is None or cache[0] != snap.version:
                flat = self.slots[snap.slot][:self.total].to("cpu", copy=True)
                bufs = [memoryview(b.numpy()) for b in bucket_slices(flat, self.bucket_nbytes)]
                cache = (snap.version, M.WeightsAnnounce(snap.version, M.TCP, self.layout, self.bucket_dtypes,
                                                         self.bucket_nbytes, bufs))
                with self._cv:
                    self._tcp_cache = cache
            return super()._reply_weights(identity, msg, Snapshot(snap.version, cache[1]), extra)
        with self._cv:
            self.pending[snap.slot].add(identity)
        return super()._reply_weights(identity, msg, snap, extra)

    def close(self) -> None:
        super().close()
        self.pairs.close()
