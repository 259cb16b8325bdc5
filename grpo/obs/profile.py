"""--profile-steps: a torch.profiler record of a span of learner steps and sampler chunks.

Each process profiles its own span (the learner its steps, wrapped by `around`; a sampler the
making of its chunks, each a learner step's groups or in fixed rounds a round, marked as each
begins by `mark`, since a stream in flight has no boundary to wrap) and writes,
under <run_dir>/profile/:
  <name>_<a>-<b>.txt       the operators sorted by their total time on the device (CUDA) or the
                           host (CPU), as torch's key_averages table: what a step is made of
  <name>_<a>-<b>.json.gz   the Chrome trace (chrome://tracing, Perfetto), for gaps and overlap
Off by default: a profiled step runs slower than others, and its trace is tens of MB; writing the
traces stalls the processes for a while: a run that profiles is not a timed run.
"""
from __future__ import annotations

import contextlib
import gzip
import logging
import re
import shutil
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

log = logging.getLogger(__name__)

_SPAN = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+))?\s*$")


def parse_span(spec: str) -> tuple[int, int] | None:
    """'A-B' (steps or rounds A to B, both included) or 'A' (that one) -> (A, B); '' -> None."""
    if not spec.strip():
        return None
    m = _SPAN.match(spec)
    if m is None:
        raise ValueError(f"--profile-steps {spec!r}: give a span A-B of step (round) numbers, e.g. 20-21, or one "
                         f"number")
    a = int(m.group(1))
    b = int(m.group(2)) if m.group(2) is not None else a
    if b < a:
        raise ValueError(f"--profile-steps {spec!r}: the span ends before it starts; write {b}-{a}")
    return a, b


class SpanProfiler:
    """Profiles the calls of `around(i)` whose i falls in the span; one record for the span."""

    def __init__(self, spec: str, run_dir: str | Path, name: str):
        self.span = parse_span(spec)   # a bad spec fails here, before anything loads
        self.dir = Path(run_dir) / "profile"
        self.name = name
        self.cuda = False   # whether the record has device time: CUDA in use when it starts
        self._prof = None
        self._done = False   # one record a run, even if an index repeats (a round started again)

    @contextlib.contextmanager
    def around(self, index: int):
        if self._done or self.span is None or not self.span[0] <= index <= self.span[1]:
            yield
            return
        self._start()
        try:
            yield
        finally:
            if index == self.span[1]:
                self._finish()

    def mark(self, index: int) -> None:
        """Unit `index` begins (a sampler's chunk: a stream has no round boundaries to wrap): the
        record starts as unit A begins and ends as unit B + 1 does (or at close())."""
        if self._done or self.span is None:
            return
        if self._prof is None and self.span[0] <= index <= self.span[1]:
            self._start()
        elif self._prof is not None and index > self.span[1]:
            self._finish()

    def close(self) -> None:
        """The work ended inside the span: write what was recorded."""
        if self._prof is not None:
            self._finish()

    def _start(self) -> None:
        if self._prof is None:
            self.cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
            self._prof = profile(activities=acts, record_shapes=False, with_stack=False)
            self._prof.__enter__()

    def _finish(self) -> None:
        """Stop the profiler and write the table and the trace (the device is synchronised first)."""
        prof, self._prof = self._prof, None
        self._done = True
        prof.__exit__(None, None, None)
        a, b = self.span
        self.dir.mkdir(parents=True, exist_ok=True)
        stem = self.dir / f"{self.name}_{a}-{b}"
        key = "self_cuda_time_total" if self.cuda else "self_cpu_time_total"
        table = prof.key_averages().table(sort_by=key, row_limit=40)
        stem.with_suffix(".txt").write_text(table)
        raw = stem.with_suffix(".json")
        prof.export_chrome_trace(str(raw))
        with raw.open("rb") as src, gzip.open(f"{raw}.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        raw.unlink()
        log.info("profile of %s %d-%d written to %s.txt and .json.gz", "steps" if "learner" in self.name else
                 "chunks", a, b, stem)
