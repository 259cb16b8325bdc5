"""Calls that may never return, made within a time limit each: reasoning-gym's scorers parse a
completion's answer with sympy (countdown's `parse_expr("9**9**9**9")` computes a number of
billions of digits), and such a call holds the interpreter the whole time, so no thread can stop it
and signal.alarm works only on the main thread. Here the calls run in a forked child, one after
another; a call that passes its limit has the child killed, costs that call a TimeoutError, and a
new child takes the calls after it.

The child is a fork: it has the callables and their arguments without serialising them, and it
sends back only one line per call (its index, and a float's repr or an exception's type and first
line), which the parent parses as numbers and text: nothing it sends is unpickled or evaluated. It
runs no CUDA and touches none of the parent's sockets; it exits with os._exit, so no atexit hook or
buffered file of the parent runs twice. Where there is no fork (not POSIX), the calls run here,
unbounded.
"""
from __future__ import annotations

import json
import os
import select
import signal
import time
from collections.abc import Callable, Sequence

__all__ = ["CallFailed", "run_bounded"]


class CallFailed(Exception):
    """What a call raised in the child, by its type's name and first line (the object stays there)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def run_bounded(calls: Sequence[Callable[[], float]], limit_s: float) -> list[float | BaseException]:
    """Each call's float, or what it failed with (CallFailed, or TimeoutError past `limit_s`)."""
    if not calls:
        return []
    if not hasattr(os, "fork"):
        return [_here(c) for c in calls]
    out: list[float | BaseException | None] = [None] * len(calls)
    start = 0
    while start < len(calls):
        start = _child_round(calls, start, limit_s, out)
    return out   # type: ignore[return-value]  (every slot is filled by now)


def _here(call: Callable[[], float]) -> float | BaseException:
    try:
        return float(call())
    except Exception as exc:  # noqa: BLE001 - the caller counts it
        return exc


def _child_round(calls, start: int, limit_s: float, out: list) -> int:
    """Fork a child for calls[start:]; fill `out` from its lines; the index to start the next child
    at (len(calls) when it got through them all)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: results as lines, then gone without running the parent's exit hooks
        os.close(r)
        try:
            for j in range(start, len(calls)):
                os.write(w, _line(j, calls[j]).encode())
        finally:
            os._exit(0)
    os.close(w)
    buf, at = b"", start
    deadline = time.monotonic() + limit_s
    try:
        while at < len(calls):
            left = deadline - time.monotonic()
            ready = select.select([r], [], [], max(left, 0.0))[0] if left > 0 else []
            chunk = os.read(r, 1 << 16) if ready else b""
            if not ready or not chunk:   # past the limit, or the child died (killed for memory, say)
                why = (TimeoutError(f"took longer than {limit_s:g} s") if not ready
                       else CallFailed("ChildDied", "the scoring child ended without an answer"))
                out[at] = why
                return at + 1
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                j, value = _parse(line.decode())
                out[j] = value
                at = j + 1
                deadline = time.monotonic() + limit_s   # each call has its own limit
        return at
    finally:
        os.close(r)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)


def _line(j: int, call: Callable[[], float]) -> str:
    try:
        return f"{j} ok {float(call())!r}\n"
    except BaseException as exc:  # noqa: BLE001 - reported, as the parent would see it in process
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        return f"{j} err {json.dumps([type(exc).__name__, first])}\n"


def _parse(line: str) -> tuple[int, float | BaseException]:
    j, kind, rest = line.split(" ", 2)
    if kind == "ok":
        return int(j), float(rest)
    name, message = json.loads(rest)
    return int(j), CallFailed(str(name), str(message))
