"""Graph capture: one decode step captured as a CUDA graph (after an optional torch.compile and an
eager warm-up that fails loudly on any host sync), what to do when a capture fails half-way, and
how many compiled versions of the step torch.compile may keep."""
from __future__ import annotations

import logging
import warnings
from typing import Callable

import torch

from grpo.generate.backend import describe

log = logging.getLogger(__name__)

# Compiled versions of the decode step torch.compile may keep (dynamo's default is 8): one per
# (rows, prompt width, max new tokens) shape, greedy flag and attention length. 5 buckets x a few
# widths x 2 x up to 16 lengths stays under it; past it dynamo would run the step uncompiled.
COMPILED_VERSIONS = 512


class CaptureFailed(RuntimeError):
    """A capture that did not succeed: `stage` (compile, warm-up or capture) and `reason` (one line)."""

    def __init__(self, stage: str, reason: str):
        super().__init__(f"{stage}: {reason}")
        self.stage, self.reason = stage, reason


def capture_decode(step: Callable, s, greedy: bool, generator: torch.Generator, compile_first: bool,
                   limit: int | None = None) -> torch.cuda.CUDAGraph:
    """Capture step(s, greedy) (s: a Slot or Ring: its rows, shapes and memory pool) as a graph;
    CaptureFailed if it cannot be.

    The warm-up runs with torch's sync debug mode set to "error": an operation that would
    synchronise with the host (and so cannot be captured) raises there, in eager mode, with
    its name, instead of invalidating a capture half-way (the error a failed capture reports
    is only "operation not permitted when stream is capturing")."""
    stage = "warm-up"
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        if compile_first:  # compile first: compiling may synchronise; the result may not
            stage = "compile"
            with torch.cuda.stream(stream):
                step(s, greedy)
            stage = "warm-up"
        prev = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("error")
        try:
            with torch.cuda.stream(stream):  # warm-up outside capture (cuBLAS workspaces, lazy inits)
                for _ in range(min(2, s.max_new - 1)):
                    step(s, greedy)
        finally:
            torch.cuda.set_sync_debug_mode(prev)
        torch.cuda.current_stream().wait_stream(stream)
        stage = "capture"
        graph = torch.cuda.CUDAGraph()
        if hasattr(graph, "register_generator_state"):
            graph.register_generator_state(generator)
        # thread_local: a CUDA call from another thread of the sampler (heartbeats, weight
        # receiver) cannot invalidate this capture; only this thread's calls are checked.
        with torch.cuda.graph(graph, pool=s.pool, capture_error_mode="thread_local"):
            step(s, greedy)
        torch.cuda.synchronize()
        log.info("captured the decode step for %d rows x %d cache slots, attending to %d (greedy=%s)",
                 s.rows, s.width + s.max_new, limit or s.width + s.max_new, greedy)
        return graph
    except RuntimeError as exc:
        raise CaptureFailed(stage, describe(exc)) from exc


def reset_generators_after_failed_capture(generator: torch.Generator) -> None:
    """A capture that fails inside torch.cuda.graph ends without running the generators'
    capture epilogue, so they stay in capture mode, and the next eager draw, or the next replay of
    any graph that registered them, fails with "Offset increment outside graph capture". One
    empty, successful capture that registers `generator` (the default one always is) runs their
    prologue and epilogue and leaves them out of capture mode. Replacing the generator instead
    would not do: graphs captured earlier still hold the stuck one and fail on their next replay."""
    try:
        torch.cuda.synchronize()
    except RuntimeError:
        pass
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "the CUDA graph is empty"
            empty = torch.cuda.CUDAGraph()
            if hasattr(empty, "register_generator_state"):
                empty.register_generator_state(generator)
            with torch.cuda.graph(empty, capture_error_mode="thread_local"):
                pass
    except RuntimeError as exc:
        log.warning("could not reset the CUDA RNG after the failed capture (%s)", describe(exc))


def allow_recompiles(n: int) -> None:
    """Let torch.compile keep at least n compiled versions of one function (the engine's decode
    step has one per shape, greedy flag and attention length) instead of falling back to eager."""
    import torch._dynamo  # here: torch._dynamo brings the compiler stack; only graph capture needs it

    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):   # the name changed in torch 2.6
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), n))
            break
    if hasattr(cfg, "accumulated_recompile_limit"):
        cfg.accumulated_recompile_limit = max(cfg.accumulated_recompile_limit, 4 * n)
