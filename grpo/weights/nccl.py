"""Method "nccl": each version sent point-to-point from learner rank 0 to one sampler.

Every sampler that asks for nccl gets its own two-rank process group with learner rank 0
(rank 0: learner, rank 1: sampler), built outside the learner's DeepSpeed world: its own
TCP store, hosted by the learner on a fresh port that the announcement names. Pairs rather
than one broadcast group because samplers ask at different times (each between its own
generation rounds): a broadcast would make every sampler wait for the slowest, and one dead
member would stall them all. A sampler that joins gets a pair on its first request; one that
dies loses its pair at the first send that times out; one that restarts is a new peer and
gets a new pair and the current weights. On CPU the same code runs on gloo (tests).

Timeouts: the library's own watchdog is set far beyond ours; every send/recv is polled
against `timeout_s` and, past it, the pair is aborted and forgotten, so a dead peer costs the
learner's sync thread at most `timeout_s` once and never the training loop.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from grpo.weights.receiver import FlatReceiver
from grpo.wire import messages as M
from grpo.wire.ports import free_port

log = logging.getLogger(__name__)
WATCHDOG_S = 24 * 3600  # the library's timeout: ours (polling) always fires first


def make_group(store, rank: int, backend: str, timeout_s: float):
    if backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timedelta(seconds=WATCHDOG_S)
        return dist.ProcessGroupNCCL(store, rank, 2, opts)
    # gloo connects both ranks in its constructor: bounded by our timeout, it raises cleanly.
    return dist.ProcessGroupGloo(store, rank, 2, timedelta(seconds=timeout_s))


def finished(work, timeout_s: float, backend: str) -> bool:
    """Wait for `work` up to `timeout_s`: True when done, False on timeout or error.

    NCCL: poll is_completed() (wait() would only order the CUDA stream, not block the host);
    gloo's send/recv work does not implement is_completed(), but its wait() takes a timeout.
    """
    try:
        if backend == "gloo":
            return bool(work.wait(timedelta(seconds=timeout_s)))
        deadline = time.monotonic() + timeout_s
        while not work.is_completed():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.0001)
        work.wait()   # raises if the op failed; orders the current stream after it
        return True
    except Exception as exc:  # noqa: BLE001 - a broken or absent peer is reported by the caller
        log.warning("nccl: transfer failed: %s", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return False


def abort(pg) -> None:
    for name in ("abort", "_shutdown", "shutdown"):
        fn = getattr(pg, name, None)
        if fn is not None:
            try:
                fn()
            except Exception:  # noqa: BLE001 - best effort on a group we are discarding
                pass
            return


@dataclass
class Pair:
    store: object
    port: int
    pg: object = None


class PairGroups:
    """Learner side: one pair group per sampler connection (ZeroMQ identity)."""

    def __init__(self, host: str, backend: str, timeout_s: float):
        self.host, self.backend, self.timeout_s = host, backend, timeout_s
        self.pairs: dict[bytes, Pair] = {}
        self.sent = 0
        self.failed = 0

    def rendezvous(self, identity: bytes, slot: int) -> M.NcclRendezvous:
        pair = self.pairs.get(identity)
        if pair is None:
            port = free_port(self.host)
            store = dist.TCPStore(self.host, port, 2, True, timeout=timedelta(seconds=self.timeout_s),
                                  wait_for_workers=False)
            pair = self.pairs[identity] = Pair(store, port)
            log.info("nccl: new pair group for a sampler at %s:%d (%s)", self.host, port, self.backend)
        return M.NcclRendezvous(self.host, pair.port, self.backend)

    def send(self, identity: bytes, flat: torch.Tensor) -> bool:
        """Send `flat` to the sampler; False (and the pair dropped) if it did not take it in time."""
        pair = self.pairs[identity]
        try:
            if pair.pg is None:
                pair.pg = make_group(pair.store, 0, self.backend, self.timeout_s)
            ok = finished(pair.pg.send([flat], 1, 0), self.timeout_s, self.backend)
        except Exception as exc:  # noqa: BLE001 - the peer never came (store timeout) or broke
            log.warning("nccl: pair setup failed: %s", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            ok = False
        if ok:
            self.sent += 1
        else:
            log.warning("nccl: sampler did not receive within %.0f s; dropping its pair group", self.timeout_s)
            self.drop(identity)
            # Counted after the drop: a reader on another thread that sees the count sees the pair gone.
            self.failed += 1
        return ok

    def drop(self, identity: bytes) -> None:
        pair = self.pairs.pop(identity, None)
        if pair is not None and pair.pg is not None:
            abort(pair.pg)

    def close(self) -> None:
        for identity in list(self.pairs):
            self.drop(identity)


class NcclReceiver(FlatReceiver):
    """Sampler side: joins the pair group the announcement names and receives into its flat buckets."""

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype, timeout_s: float = 60.0):
        super().__init__(model, dtype)
        self.timeout_s = timeout_s
        self.key: tuple[str, int] | None = None
        self.pg = None

    def apply(self, announce: M.WeightsAnnounce) -> bool:
        self.check_layout(announce)
        r = announce.nccl
        if (r.backend == "nccl") != (self.local.device.type == "cuda"):
            raise RuntimeError(f"the learner sends over {r.backend} but this sampler's weights are on "
                               f"{self.local.device.type}")
        if self.key != (r.host, r.port):
            self.close()
            store = dist.TCPStore(r.host, r.port, 2, False, timeout=timedelta(seconds=self.timeout_s))
            self.pg = make_group(store, 1, r.backend, self.timeout_s)
            self.key = (r.host, r.port)
        ok = finished(self.pg.recv([self.staging], 0, 0), self.timeout_s, r.backend)
        if self.local.device.type == "cuda":
            torch.cuda.synchronize(self.local.device)
        if not ok:
            self.close()
            return False
        self.commit()
        return True

    def close(self) -> None:
        if self.pg is not None:
            abort(self.pg)
        self.pg, self.key = None, None
