"""Progress on long work: a tqdm bar on a terminal, plain log lines otherwise.

The launcher captures every process's stderr into a file, where a bar's carriage returns
would be noise; there each Progress logs one line at most every `every_s` seconds (and on
close) with count, rate and ETA. GRPO_PROGRESS=bar|lines forces either mode.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from typing import Iterable, Iterator, TypeVar

from tqdm import tqdm

log = logging.getLogger("grpo.obs.progress")
T = TypeVar("T")


def _use_bar(stream) -> bool:
    forced = os.environ.get("GRPO_PROGRESS", "").lower()
    if forced in ("bar", "lines"):
        return forced == "bar"
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _fmt_s(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class Progress:
    """Count work done: ``with Progress("steps", total=100, unit="step") as p: ... p.update(1, loss=0.3)``."""

    def __init__(self, desc: str, total: int | None = None, unit: str = "it", every_s: float = 30.0,
                 stream=None):
        self.desc, self.total, self.unit, self.every_s = desc, total, unit, every_s
        self.n = 0
        self.postfix: dict = {}
        self._t0 = self._last = time.monotonic()
        self._bar = None
        stream = stream or sys.stderr
        if _use_bar(stream):
            self._bar = tqdm(total=total, desc=desc, unit=unit, file=stream, dynamic_ncols=True)

    def line(self, final: bool = False) -> str:
        """The plain-text status, e.g. 'learner steps: 12/100 (12%), 0.50 step/s, eta 2m56s'."""
        elapsed = time.monotonic() - self._t0
        rate = self.n / elapsed if elapsed > 0 else 0.0
        count = f"{self.n}/{self.total} ({100 * self.n / self.total:.0f}%)" if self.total else f"{self.n}"
        text = f"{self.desc}: {'done ' if final else ''}{count}, {rate:.2f} {self.unit}/s, {_fmt_s(elapsed)} elapsed"
        if not final and self.total and rate > 0:
            text += f", eta {_fmt_s((self.total - self.n) / rate)}"
        if self.postfix:
            text += " | " + " ".join(f"{k} {v}" for k, v in self.postfix.items())
        return text

    def update(self, n: int = 1, **postfix) -> None:
        self.n += n
        self.postfix.update({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in postfix.items()})
        if self._bar is not None:
            self._bar.update(n)
            if postfix:
                self._bar.set_postfix(self.postfix, refresh=False)
            return
        now = time.monotonic()
        if now - self._last >= self.every_s and not (self.total and self.n >= self.total):  # close() says done
            self._last = now
            log.info("%s", self.line())

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self.n:
            log.info("%s", self.line(final=True))

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress(items: Iterable[T], desc: str, total: int | None = None, unit: str = "it",
             every_s: float = 30.0) -> Iterator[T]:
    """Iterate `items` with a Progress (total taken from len() when it has one)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with Progress(desc, total, unit, every_s) as p:
        for item in items:
            yield item
            p.update(1)
