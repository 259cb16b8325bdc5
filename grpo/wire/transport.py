"""ZeroMQ transports: a small send/receive/close interface over the protocol's messages.

Two channels (docs/protocol.md):
  data (5555): samplers PUSH (connect)  -> learner rank 0 PULL (bind). Fair-queued across samplers.
  sync (5556): samplers DEALER (connect) <-> learner rank 0 ROUTER (bind). A sampler asks for
               weights newer than the version it has; the learner answers with weights,
               no_update or stop. Pull-based, so a slow sampler gets the newest version
               and never a backlog of old ones.
Every receive has a timeout; every receiving socket has a maximum message size, so
libzmq drops an oversized message before we allocate for it.

The roles see only the small interfaces below (`Sender`, `Receiver`, `Transport` for both, and
`Server` for the request/reply side with many peers); the ZeroMQ classes implement them.
"""
from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections import Counter
from typing import TYPE_CHECKING, Callable, TypeVar

import zmq

from grpo.wire import codec
from grpo.wire import messages as M
from grpo.wire.ports import PortInUse, busy_ports_line

if TYPE_CHECKING:
    from grpo.wire.curve import Curve

log = logging.getLogger(__name__)
T = TypeVar("T")


def bind_each(*binders: Callable[[], T]) -> list[T]:
    """Each of `binders` (a socket's constructor, which binds one port) called in turn, the rest
    tried too after one is refused: then a PortInUse naming every taken port in one line
    (grpo.wire.ports), and those that did bind closed again."""
    made, refused = [], []
    for bind in binders:
        try:
            made.append(bind())
        except PortInUse as exc:
            refused.append(exc)
    if not refused:
        return made
    for sock in made:
        sock.close()   # type: ignore[attr-defined]
    if other := next((exc for exc in refused if not exc.busy), None):
        raise other   # not a taken port (a bad --host, say): its own line
    busy = [b for exc in refused for b in exc.busy]
    raise PortInUse(busy_ports_line(refused[0].host, busy), refused[0].host, busy)


class Sender(ABC):
    """Sends messages; a full queue is reported, never waited on past `timeout_s`."""

    @abstractmethod
    def send(self, msg: M.Message, timeout_s: float | None = None) -> bool:
        """Queue `msg`; False when it could not leave within timeout_s (None: wait as long as it takes)."""

    @abstractmethod
    def close(self) -> None: ...


class Receiver(ABC):
    """Receives checked messages; bad input is counted in `rejected` (by reason) and never raises."""

    rejected: Counter[str]

    @abstractmethod
    def receive(self, timeout_s: float) -> M.Message | None:
        """The next valid message, or None on timeout or when the message was rejected."""

    @abstractmethod
    def poll(self, timeout_s: float = 0.0) -> bool:
        """Whether a message is waiting (within timeout_s)."""

    @abstractmethod
    def close(self) -> None: ...


class Transport(Sender, Receiver):
    """Both directions with one peer (a sampler's side of the sync channel)."""


class Server(ABC):
    """Requests from many peers, each answered by its peer identity (the learner's sync channel)."""

    rejected: Counter[str]

    @abstractmethod
    def receive(self, timeout_s: float) -> tuple[bytes, M.Message] | None:
        """(peer, the next valid request), or None on timeout or rejection."""

    @abstractmethod
    def reply(self, peer: bytes, msg: M.Message) -> int:
        """Send `msg` to `peer`; returns the bytes queued."""

    @abstractmethod
    def close(self) -> None: ...


def _bind(sock: zmq.Socket, host: str, port: int, flag: str) -> None:
    try:
        sock.bind(f"tcp://{host}:{port}")
    except zmq.ZMQError as exc:
        sock.close(linger=0)
        if exc.errno == zmq.EADDRINUSE:
            raise PortInUse(busy_ports_line(host, [(port, flag)]), host, [(port, flag)]) from None
        raise PortInUse(f"cannot bind {host}:{port}: {exc}; pass {flag} with a free port or fix --host") from None


class _Receiving:
    """Decode + validate with counted, rate-limited rejections; bad input never raises."""

    def __init__(self, sock: zmq.Socket, limits: M.Limits, what: str):
        self.sock, self.limits, self.what = sock, limits, what
        self.rejected: Counter[str] = Counter()
        # Called with (error, peer identity or None) for every rejected message, so the owner can
        # charge it to its ledgers; it runs on the receiving thread and must not raise.
        self.on_reject: Callable[[M.ProtocolError, bytes | None], None] | None = None
        self.messages = 0
        self.bytes = 0
        self._last_warn = 0.0

    def receive(self, timeout_s: float) -> M.Message | None:
        """The next valid message, or None on timeout or when the message was rejected."""
        if not self.sock.poll(int(timeout_s * 1000)):
            return None
        return self._decode(self.sock.recv_multipart(copy=False))

    def poll(self, timeout_s: float = 0.0) -> bool:
        return bool(self.sock.poll(int(timeout_s * 1000)))

    def close(self) -> None:
        self.sock.close(linger=0)

    def _decode(self, frames: list[zmq.Frame], peer: bytes | None = None) -> M.Message | None:
        self.messages += 1
        self.bytes += sum(len(f.buffer) for f in frames)
        try:
            return codec.decode(frames, self.limits)
        except M.ProtocolError as exc:
            self.rejected[exc.reason] += 1
            if self.on_reject is not None:
                self.on_reject(exc, peer)
            now = time.monotonic()
            if now - self._last_warn > 5.0:  # a flood of garbage must not flood the log
                self._last_warn = now
                log.warning("dropped a bad %s message (%s): %s [rejected so far: %s]",
                            self.what, exc.reason, exc.detail, dict(self.rejected))
            return None


class DataSender(Sender):
    """Sampler side of the data channel."""

    def __init__(self, host: str, port: int, hwm: int, ctx: zmq.Context | None = None,
                 curve: Curve | None = None):
        self.sock = (ctx or zmq.Context.instance()).socket(zmq.PUSH)
        if curve:
            curve.apply_client(self.sock)
        # At the high-water mark a PUSH send blocks: that is the backpressure that keeps a
        # sampler from queueing unbounded groups while the learner is slow or absent.
        self.sock.setsockopt(zmq.SNDHWM, hwm)
        self.sock.setsockopt(zmq.LINGER, 10_000)  # on close, give queued groups 10 s to leave
        self.sock.connect(f"tcp://{host}:{port}")
        self.bytes_sent = 0

    def send(self, msg: M.Message, timeout_s: float | None = None) -> bool:
        frames = codec.encode(msg)
        self.sock.setsockopt(zmq.SNDTIMEO, -1 if timeout_s is None else int(timeout_s * 1000))
        try:
            self.sock.send_multipart(frames, copy=False)
        except zmq.Again:
            return False
        self.bytes_sent += sum(memoryview(f).nbytes for f in frames)
        return True

    def close(self, linger_s: float | None = None) -> None:
        self.sock.close(linger=None if linger_s is None else int(linger_s * 1000))


class DataReceiver(_Receiving, Receiver):
    """Learner rank 0 side of the data channel."""

    def __init__(self, host: str, port: int, limits: M.Limits, max_message_bytes: int,
                 ctx: zmq.Context | None = None, curve: Curve | None = None):
        sock = (ctx or zmq.Context.instance()).socket(zmq.PULL)
        if curve:
            curve.apply_server(sock)
        sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)  # per frame; checked before allocation
        sock.setsockopt(zmq.RCVHWM, 1000)
        sock.setsockopt(zmq.LINGER, 0)
        _bind(sock, host, port, "--data-port")
        super().__init__(sock, limits, "data")


class SyncClient(_Receiving, Transport):
    """Sampler side of the weight channel."""

    def __init__(self, host: str, port: int, limits: M.Limits, ctx: zmq.Context | None = None,
                 curve: Curve | None = None):
        sock = (ctx or zmq.Context.instance()).socket(zmq.DEALER)
        if curve:
            curve.apply_client(sock)
        # Largest frame: one weight bucket (or the header); libzmq drops a larger one unread.
        sock.setsockopt(zmq.MAXMSGSIZE, max(limits.max_array_bytes, limits.max_header_bytes))
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(f"tcp://{host}:{port}")
        super().__init__(sock, limits, "sync")

    def send(self, msg: M.Message, timeout_s: float | None = None) -> bool:
        try:
            self.sock.send_multipart(codec.encode(msg), copy=False, flags=zmq.NOBLOCK)
        except zmq.Again:  # not connected yet and its queue is full: the next round asks again
            return False
        return True


class SyncServer(_Receiving, Server):
    """Learner rank 0 side of the weight channel. Lives in one thread (zmq sockets are not thread-safe)."""

    def __init__(self, host: str, port: int, ctx: zmq.Context | None = None, curve: Curve | None = None):
        sock = (ctx or zmq.Context.instance()).socket(zmq.ROUTER)
        if curve:
            curve.apply_server(sock)
        sock.setsockopt(zmq.MAXMSGSIZE, 1 << 16)  # requests are tiny
        # A ROUTER drops (not blocks) when a peer's queue is full; weights are re-requested
        # by the sampler's next round, so a dropped reply costs one round of staleness at most.
        sock.setsockopt(zmq.SNDHWM, 4)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        _bind(sock, host, port, "--sync-port")
        super().__init__(sock, M.Limits(), "sync")

    def receive(self, timeout_s: float) -> tuple[bytes, M.Message] | None:  # type: ignore[override]
        if not self.sock.poll(int(timeout_s * 1000)):
            return None
        frames = self.sock.recv_multipart(copy=False)
        identity, body = frames[0].bytes, frames[1:]
        msg = self._decode(body, identity)
        return None if msg is None else (identity, msg)

    def reply(self, peer: bytes, msg: M.Message) -> int:
        frames = codec.encode(msg)
        self.sock.send_multipart([peer, *frames], copy=False)
        return sum(memoryview(f).nbytes for f in frames)
