"""The engine's in-flight path: RingStream keeps rows busy on a Ring of cache slots (a row whose
sample ends takes the next one), and says which weights version drew each token.

The stream is the rollout path's one interface: `stream(next_prompt, group_size, max_new_tokens,
temperature, greedy, rows, should_stop, swap, version, min_width)` yields FinishedGroups as their
rows end. RingStream is our engine's (RolloutEngine.stream); grpo.generate.batch's BatchStream gives
the same over an engine that decodes fixed batches (a fixed round, Hugging Face generate); another
engine (vLLM's) plugs in by giving the same.

Each prompt is prefilled once (_prefill_prompts) and its keys and values are copied into the ring
slots of every row its samples take (_refill); one decode step moves every row by a token
(RingStream.step, what the ring's graph captures) and writes it at the row's own output column
(_ring_emit). The host looks at the rows only every `check_every` steps; with `refill_behind` it
queues a check's steps before it prefills and refills, so that the GPU decodes while it does.

`stream` never has to drain for new weights: at each host check its `swap` callback may copy a
new version into the parameters in place, and the rows in flight go on from their KV cache (keys
and values the older version computed; the learner's off-policy correction covers the mix).
Each token's log-prob is under the version that drew it, and each FinishedGroup carries those
versions per token (`versions`, `min_version`, `max_version`), worked out on the host from the
decode step that drew the token (token_versions): the captured step is the same with or without swaps.

RingStream holds its RolloutEngine (grpo.generate.engine), which holds it: the stream uses the
engine's model, generator, slots and helpers (_cut, _capture, clear), and keeps its own rings,
decode step and counts from one stream to the next.
"""
from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol

import numpy as np
import torch

from grpo.generate.attention import layer_masks
from grpo.generate.cache import Ring, static_cache
from grpo.model.logprobs import left_pad


@dataclass
class FinishedGroup:
    """One group out of a stream (RingStream, BatchStream): its rows all ended (EOS or max_new_tokens)."""
    key: object                  # what the caller's source returned with the prompt
    token_ids: list[list[int]]   # per row, cut after the first EOS (kept)
    finished: list[bool]         # ended with EOS
    logprobs: list[np.ndarray] | None   # per generated token, under the sampling distribution of the weights that
    #                              drew it; None: the engine gives none (Hugging Face generate: a pass does)
    decode_steps: int            # steps the group was in flight (its refill to its last row's end)
    versions: list[np.ndarray] = field(default_factory=list)   # per row, int32, aligned with token_ids: the
    #                              weights version that drew each token (token_versions)
    min_version: int = 0         # the oldest version over the group's tokens (its age is that of this one)
    max_version: int = 0         # the newest
    last_in_check: bool = True   # no other group ended at the host check that ended this one


class Stream(Protocol):
    """The rollout path's one interface (the module's docstring): RingStream.stream (RolloutEngine's),
    BatchStream.stream (grpo.generate.batch); an engine of vLLM's plugs in by giving the same."""

    def stream(self, next_prompt: Callable[[], tuple[object, list[int]] | None], group_size: int,
               max_new_tokens: int, temperature: float = 1.0, greedy: bool = False, rows: int | None = None,
               should_stop: Callable[[], bool] | None = None, swap: Callable[[], int | None] | None = None,
               version: int = 0, min_width: int = 0) -> Iterator[FinishedGroup]: ...


def samples_of(item: tuple, group_size: int) -> int:
    """How many samples a stream's source asks for with a prompt: (key, ids) is a group of
    `group_size`; (key, ids, n) asks for n (1 <= n <= group_size: a screened group's first or
    second part, grpo.sampler.workflow)."""
    if len(item) < 3:
        return group_size
    n = item[2]
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= group_size:
        raise ValueError(f"stream: a prompt asked for {n!r} samples; give 1..{group_size} (the group size), "
                         f"or (key, ids) for a whole group")
    return int(n)


def token_versions(n: int, started: int, first_version: int, change_steps: np.ndarray,
                   change_versions: np.ndarray) -> np.ndarray:
    """The weights version that drew each of a ring row's n tokens (int32 [n]).

    Token 0 is drawn at the row's refill from its prompt's prefill logits: the version that
    prefilled the prompt (`first_version`; a sample may wait for a row across a swap). Token c >= 1
    is drawn by decode step `started + c` (steps counted from the stream's start; `started`: the
    step count at the refill). Decode steps after change_steps[k] (ascending, change_steps[0] = 0)
    run with change_versions[k], up to the next change: swaps happen only at host checks, between
    steps."""
    out = np.empty(n, dtype=np.int32)
    if n == 0:
        return out
    out[0] = first_version
    step = started + np.arange(1, n)                                   # [n - 1], each >= 1 > change_steps[0]
    out[1:] = change_versions[np.searchsorted(change_steps, step, side="left") - 1]
    return out


def group_versions(versions: list[np.ndarray], default: int) -> tuple[int, int]:
    """(oldest, newest) version over a group's tokens; `default` for a group without tokens."""
    nonempty = [v for v in versions if v.size]
    if not nonempty:
        return default, default
    return int(min(v.min() for v in nonempty)), int(max(v.max() for v in nonempty))


def checked_swap(swap: Callable[[], int | None], version: int) -> int | None:
    """swap()'s answer at a host check of a stream: None (no new weights) or the new version."""
    new = swap()
    if new is None:
        return None
    if isinstance(new, bool) or not isinstance(new, (int, np.integer)) or int(new) <= version:
        raise ValueError(f"stream: swap() returned {new!r} at version {version}; it must return None "
                         f"(no new weights) or the new weights' version, an int greater than {version}")
    return int(new)


class _StepTimer:
    """The device time of a host check's decode steps: CUDA events around them (read once the check's
    sync has passed them), or the wall time on CPU, where the steps run as they are called."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.start.record()
        self.t0 = time.perf_counter()

    def queued(self) -> None:
        if self.cuda:
            self.end.record()
        self.t1 = time.perf_counter()

    def seconds(self) -> float:
        return self.start.elapsed_time(self.end) / 1e3 if self.cuda else self.t1 - self.t0


# swaps / swap_s: new weights taken in flight and the host seconds of taking them (the receiver's apply
# into the policy, and for vLLM's engine its copy from the policy), inside check_s
STREAM_COUNTS = ("steps", "row_steps", "busy_row_steps", "decode_s", "refill_s", "check_s", "sync_s", "prompts",
                 "swaps", "swap_s")
"""RolloutEngine.stream_counts, over the engine's streams: decode steps; rows x steps; busy rows x
steps (a row is busy from its refill to the check that sees it ended); the device seconds of the
steps; host seconds asking for prompts, prefilling and refilling rows (with refill_behind the
check's steps are queued ahead of them, otherwise none is); host seconds at checks after the sync
(swap, copying ended rows out); host seconds waiting at the sync for the queued work (near zero:
the host is the bottleneck); prompts prefilled."""


@dataclass
class _Flight:
    """One stream's state from host check to host check (RingStream.stream's)."""
    G: int                       # samples a prompt
    rows: int
    max_new: int
    inv_t: float
    greedy: bool
    min_width: int
    version: int                 # the weights' version now
    ring: Ring | None = None
    waiting: collections.deque = field(default_factory=collections.deque)   # (prompt record, sample) without a row
    busy: dict = field(default_factory=dict)   # row -> (prompt record, sample index, step of its refill)
    pending: dict | None = None  # a prompt too wide for the ring in use
    steps: int = 0               # decode steps queued so far
    slot: int = 0                # the ring slot the next queued step writes (ring.t), followed on the host: no sync
    # Which version drew each token is worked out on the host, not recorded per step on the
    # device: versions change only at host checks, so a token's version follows from the decode
    # step that drew it (its row's refill step + its column) and these change points
    # (token_versions). No per-token buffer, nothing added to the captured step, and without
    # swap the graphs and outputs are those of a stream without versions.
    change_steps: list = field(default_factory=list)      # steps after change_steps[k] ran with change_versions[k]
    change_versions: list = field(default_factory=list)
    # What ended at a host check is cut into groups and yielded only once the next check_every steps
    # are queued: the caller's work on them (scoring, sending) then runs while the GPU decodes,
    # instead of between two checks with the GPU idle. Its rows are refilled before those steps are
    # queued, or, with refill_behind, after them (and join a check later).
    ended_at: list = field(default_factory=list)


class RingStream:
    """Our engine's in-flight path (the module's docstring), a stream in the interface every
    rollout engine gives (stream(next_prompt, group_size, ...) yielding FinishedGroups; the fixed
    batches' is grpo.generate.batch's BatchStream).

    It holds its RolloutEngine, whose model, generator, pad and EOS ids, fixed-batch slots and
    capture and cut helpers it uses, and what lasts from one stream to the next: its rings (one at
    a time), its decode step (`step_fn`: through torch.compile with compile_ring) and where its time
    went (`counts`, STREAM_COUNTS)."""

    def __init__(self, engine, compile_ring: bool = False, fused: bool = False):
        self.engine = engine
        self.compile_ring = compile_ring
        self.fused = fused   # the fused sampling kernel (the engine's), in an uncompiled step
        self.rings: dict[tuple[int, int, int], Ring] = {}
        self.counts = dict.fromkeys(STREAM_COUNTS, 0.0)
        self.step_fn = torch.compile(self.step, dynamic=False) if compile_ring else self.step

    @torch.no_grad()
    def stream(self, next_prompt, group_size: int, max_new_tokens: int, temperature: float = 1.0,
               greedy: bool = False, rows: int | None = None, should_stop: Callable[[], bool] | None = None,
               swap: Callable[[], int | None] | None = None, version: int = 0, min_width: int = 0):
        """In-flight batching: yield each group as soon as all its samples have ended; a row whose
        sample ends takes the next waiting sample at the next check, while the other rows keep
        decoding.

        next_prompt() -> (key, prompt token ids) | None is asked for a prompt whenever a row is free
        and no sample is waiting; each prompt is prefilled once and becomes `group_size` waiting
        samples (each draws its own tokens), or n with (key, ids, n) (samples_of), and its group is
        then n rows. None means none for now (the caller's budget, or no more prompts): asked again at
        the next check. The stream ends when no row is busy, nothing waits and the source, asked after
        the last groups were yielded, gives nothing. Rows: `rows` (default the engine's largest
        bucket's), on one ring of cache slots (Ring) of the first prompts' width (at least
        `min_width`) rounded up to prompt_multiple; a longer prompt
        waits until every row is free, then a wider ring is made (so a caller that knows its longest
        prompt gives it as min_width: no drain, no second capture).

        Weights versions: `version` is the version of the model's weights when the stream starts.
        swap() is asked at every host check (every check_every decode steps, after the sync): it may
        write new weights into the model's parameters in place (`param.copy_`, the same storage, in
        stream order before the next decode step: a copy on another CUDA stream must be waited for)
        and return their version (greater than the one before), or return None (no new weights). The
        rows in flight are not drained: they go on from their KV cache as it is (keys and values the
        older weights computed), and their next tokens are drawn by the new weights; a sample whose
        prompt was prefilled before the swap and that takes a row after it draws its first token from
        that prefill's logits (the older version). Every token's log-prob is under the weights that
        drew it, and each FinishedGroup says which those were (`versions` per token, `min_version`,
        `max_version`). A swap that replaces parameters (new storage) is an error: the captured
        graphs would go on reading the old memory. Without swap, every token carries `version`.

        should_stop: asked after every decode step (as in generate); once it says True the stream
        ends there, and the groups still in flight are not yielded."""
        e = self.engine
        G = int(group_size)
        if G < 1 or max_new_tokens < 1:
            raise ValueError(f"stream needs group_size >= 1 and max_new_tokens >= 1, got {G} and {max_new_tokens}")
        if e._param_ptrs() != e._ptrs:
            e.clear()
            e._ptrs = e._param_ptrs()
        greedy = greedy or temperature == 0
        f = _Flight(G, int(rows or (e.buckets[-1] if e.buckets else 8 * G)), max_new_tokens,
                    1.0 if greedy else 1.0 / temperature, greedy, min_width, int(version))
        f.change_steps, f.change_versions = [0], [f.version]
        while True:
            timer = None
            if e.refill_behind and f.busy:
                # The check's steps go first and the refill is queued behind them: the host prefills and
                # refills while the GPU decodes, and the rows it gives join at the next check.
                if (timer := self._queue(f, should_stop)) is None:
                    yield from self._groups(f.ended_at)
                    return
            t_top = time.perf_counter()
            # Free rows take waiting samples; new prompts are asked for only when none waits.
            free = [i for i in range(f.rows) if i not in f.busy] if f.ring is not None else list(range(f.rows))
            fresh = self._ask(f, next_prompt, len(free))
            if f.ring is None or (f.pending is not None and not f.busy):   # (no steps are queued: nothing is busy)
                if not fresh and f.pending is None:
                    yield from self._groups(f.ended_at)
                    return
                free = self._new_ring(f, fresh)
            self._give_rows(f, fresh, free)
            self.counts["prompts"] += len(fresh)
            self.counts["refill_s"] += time.perf_counter() - t_top
            if not f.busy:
                # The caller may answer the groups yielded here with more prompts (the rest of a
                # screened group): the stream ends only once a pass that yielded nothing found none.
                ended, f.ended_at = f.ended_at, []
                yield from self._groups(ended)
                if not ended and f.pending is None and not f.waiting:
                    return
                continue
            if timer is None and (timer := self._queue(f, should_stop)) is None:   # the refill went first
                yield from self._groups(f.ended_at)
                return
            yield from self._groups(f.ended_at)                                   # while the steps run
            f.ended_at = []
            self._check(f, timer, swap)

    # ------------------------------------------------------------------ a stream's parts, in its order
    def _ask(self, f: _Flight, next_prompt, free: int) -> list[dict]:
        """New prompts, while fewer samples wait than rows are free (and no prompt waits for a wider
        ring): each a record, its samples waiting; one too wide for the ring becomes f.pending."""
        fresh: list[dict] = []
        while len(f.waiting) < free and f.pending is None:
            item = next_prompt()
            if item is None:
                break          # nothing for now: asked again at the next check
            if not item[1]:
                raise ValueError("stream: an empty prompt")
            n = samples_of(item, f.G)
            rec = {"key": item[0], "ids": list(item[1]), "out": [None] * n, "left": n, "since": f.steps}
            if f.ring is not None and len(rec["ids"]) > f.ring.width:
                f.pending = rec  # waits until every row is free, for a wider ring
                break
            fresh.append(rec)
            f.waiting.extend((rec, j) for j in range(n))
        return fresh

    def _new_ring(self, f: _Flight, fresh: list[dict]) -> list[int]:
        """The first ring, or a wider one for the pending prompt (every row is free): the rows, all free."""
        if f.pending is not None:
            fresh.append(f.pending)
            f.waiting.extend((f.pending, j) for j in range(len(f.pending["out"])))
            f.pending = None
        width = max(f.min_width, *(len(rec["ids"]) for rec in fresh))
        multiple = self.engine.prompt_multiple
        f.ring = self._ring(f.rows, -(-width // multiple) * multiple, f.max_new, f.inv_t, f.greedy)
        f.slot = int(f.ring.t.item())   # (a new or reused ring: read once, then followed on the host)
        return list(range(f.rows))

    def _give_rows(self, f: _Flight, fresh: list[dict], free: list[int]) -> None:
        """Prefill the new prompts (at the version now) and give the free rows waiting samples."""
        if fresh:
            self._prefill_prompts(fresh)
            for rec in fresh:
                rec["version"] = f.version     # its keys, values and first-token logits are this version's
        take = [(free[n], *f.waiting.popleft()) for n in range(min(len(free), len(f.waiting)))]
        if take:
            self._refill(f.ring, take, f.greedy, f.slot)
            f.busy.update((row, (rec, j, f.steps)) for row, rec, j in take)

    def _queue(self, f: _Flight, should_stop) -> _StepTimer | None:
        """Queue a host check's decode steps and count them; None if should_stop said stop."""
        timer = self._queue_steps(f.ring, f.greedy, should_stop)
        if timer is not None:
            f.steps, f.slot = self._count_steps(f.steps, f.slot, f.ring, len(f.busy))
        return timer

    def _check(self, f: _Flight, timer: _StepTimer, swap) -> None:
        """A host check, once the check's groups are out: the one sync, then the swap (new weights
        between two decode steps) and the ended rows copied out (cut into groups later: _groups)."""
        e, counts = self.engine, self.counts
        t_sync = time.perf_counter()
        ended = f.ring.finished.cpu()                                             # the only host sync
        counts["sync_s"] += time.perf_counter() - t_sync
        counts["decode_s"] += timer.seconds()
        t_check = time.perf_counter()
        if swap is not None and (new := checked_swap(swap, f.version)) is not None:
            # (the device is idle here: the new weights land between two decode steps)
            counts["swaps"] += 1
            counts["swap_s"] += time.perf_counter() - t_check
            if e._param_ptrs() != e._ptrs:
                raise RuntimeError("stream: swap() replaced model parameters (new storage) instead of copying "
                                   "into them, and the captured decode graphs read the old memory: write new "
                                   "weights with param.copy_(new), or apply them between streams")
            f.version = new
            f.change_steps.append(f.steps)
            f.change_versions.append(f.version)
        done_rows = [i for i in sorted(f.busy) if ended[i]]
        if done_rows:
            idx = torch.tensor(done_rows, device=e.device)
            # Copied out now (before a refill resets these rows), cut into groups later.
            f.ended_at.append(([f.busy.pop(row) for row in done_rows], f.ring.out[idx, :f.max_new].cpu(),
                               f.ring.out_lp[idx, :f.max_new].cpu(), np.asarray(f.change_steps),
                               np.asarray(f.change_versions, dtype=np.int32), f.steps))
        counts["check_s"] += time.perf_counter() - t_check

    def _queue_steps(self, ring: Ring, greedy: bool, should_stop) -> _StepTimer | None:
        """Queue a host check's decode steps (the ring's graph, or its step eagerly); None if
        should_stop, asked after each, said stop."""
        graph = ring.graphs.get(greedy)
        timer = _StepTimer(self.engine.device)
        for _ in range(self.engine.check_every):
            graph.replay() if graph is not None else self.step_fn(ring, greedy)
            if should_stop is not None and should_stop():
                return None
        timer.queued()
        return timer

    def _count_steps(self, steps: int, slot: int, ring: Ring, busy: int) -> tuple[int, int]:
        """After a check's steps are queued: the step count and the ring slot the next step writes."""
        n = self.engine.check_every
        counts = self.counts
        counts["steps"] += n
        counts["row_steps"] += ring.rows * n
        counts["busy_row_steps"] += busy * n
        return steps + n, (slot + n) % ring.length

    def _groups(self, ended_at: list[tuple]):
        """The groups that the rows ended at host checks complete (stream's ended_at: per check, the
        ended rows' (record, sample, refill step), their output and log-prob rows, the version change
        points then and the step count), each yielded once all its samples have ended."""
        for samples, out, out_lp, cs, cv, steps in ended_at:
            ids, fin, lps = self.engine._cut(out, out_lp)
            ended_groups: list[FinishedGroup] = []
            for n, (rec, j, started) in enumerate(samples):
                rec["out"][j] = (ids[n], fin[n], lps[n], token_versions(len(ids[n]), started, rec["version"], cs, cv))
                rec["left"] -= 1
                if rec["left"] == 0:
                    rec.pop("kv", None)
                    vs = [o[3] for o in rec["out"]]
                    ended_groups.append(FinishedGroup(rec["key"], [o[0] for o in rec["out"]],
                                                      [o[1] for o in rec["out"]], [o[2] for o in rec["out"]],
                                                      steps - rec["since"], vs, *group_versions(vs, rec["version"]),
                                                      last_in_check=False))
            if ended_groups:   # the caller may send what it holds once a check's groups are all out
                ended_groups[-1].last_in_check = True
            yield from ended_groups

    # ------------------------------------------------------------------ the ring
    def _ring(self, rows: int, width: int, max_new: int, inv_t: float, greedy: bool) -> Ring:
        """A ring for this shape (kept between streams, like the slots), its cache initialised by
        one step over free rows, and its decode step captured."""
        # As with slots: a ring a little wider than needed serves, rather than a capture per width.
        e = self.engine
        ring = next((r for k, r in self.rings.items()
                     if k[0] == rows and k[2] == max_new and width <= k[1] <= width * 3 // 2), None)
        if ring is None:
            e.slots.clear()   # the round-based caches are not needed while streaming: free them first
            self.rings.clear()
            if e.device.type == "cuda":
                torch.cuda.empty_cache()
            ring = self.rings[(rows, width, max_new)] = Ring(e.model, rows, width, max_new, e.pad_id, e.device,
                                                              e.plan)
            self.step(ring, greedy)   # HF allocates the cache on its first write
        ring.inv_t.fill_(inv_t)
        if e.cuda_graphs and greedy not in ring.graphs:
            ring.graphs[greedy] = e._capture(ring, greedy, step=self.step_fn, compiled=self.compile_ring)
        return ring

    def _prefill_prompts(self, recs: list[dict]) -> None:
        """One forward over the new prompts (left-padded together): each record keeps its keys and
        values per layer ([1, H, P, D], its own length) and its last logits, until every sample of
        it has a row (a prompt is prefilled once however many rows its samples take)."""
        e = self.engine
        prompts = [rec["ids"] for rec in recs]
        P = max(len(p) for p in prompts)
        ids, mask = (self._to_device(x) for x in left_pad(prompts, e.pad_id, torch.device("cpu"), width=P))
        valid = mask.bool()
        q = torch.arange(P, device=e.device)
        allowed = (q.view(1, P, 1) >= q.view(1, 1, P)) & (valid.unsqueeze(1) | (q.view(1, P, 1) == q.view(1, 1, P)))
        pos = (valid.long().cumsum(-1) - 1).clamp(min=0)
        tmp = static_cache(e.model, P, e.device, e.plan)
        with e.passes():
            logits = e.model(input_ids=ids, position_ids=pos,
                             attention_mask=layer_masks(e.plan, e.dtype, allowed.unsqueeze(1),
                                                        (q.view(1, 1, P, 1) - q.view(1, 1, 1, P))),
                             past_key_values=tmp, use_cache=True, logits_to_keep=1).logits[:, -1]   # [n, V]
        for i, rec in enumerate(recs):
            n = len(rec["ids"])
            rec["kv"] = [(layer.keys[i:i + 1, :, P - n:], layer.values[i:i + 1, :, P - n:]) for layer in tmp.layers]
            rec["logits"] = logits[i:i + 1]

    def _to_device(self, x: torch.Tensor) -> torch.Tensor:
        """A host tensor on the engine's device without waiting for the device: a copy from pageable
        memory waits for every step queued ahead (refill_behind queues a check's steps first), so on
        CUDA it goes from pinned memory, asynchronously; the pinned block is not reused before the
        copy has run (torch's host caching allocator records the stream)."""
        device = self.engine.device
        if device.type != "cuda":
            return x.to(device)
        return x.pin_memory().to(device, non_blocking=True)

    def _refill(self, r: Ring, take: list[tuple[int, dict, int]], greedy: bool, t: int) -> None:
        """Give each of `take`'s rows its sample: the prompt's keys and values copied into the ring
        slots just before t (the slot the next step writes: r.t once the steps queued ahead have
        run), the row's state reset, and its first token drawn from the prompt's last logits (each
        row its own draw)."""
        by_prompt: dict[int, list[int]] = {}
        for row, rec, _ in take:
            by_prompt.setdefault(id(rec), []).append(row)
        recs = {id(rec): rec for _, rec, _ in take}
        for key, rows_of in by_prompt.items():
            rec = recs[key]
            n = len(rec["ids"])
            rows_t = self._to_device(torch.tensor(rows_of))
            slots = torch.arange(t - n, t, device=self.engine.device) % r.length
            for (k, v), dst in zip(rec["kv"], r.cache.layers):
                # [rows, H, P, D] at (row, slot): advanced indices on dims 0 and 2 put [rows, P] first
                dst.keys[rows_t.view(-1, 1), :, slots.view(1, -1)] = k[0].permute(1, 0, 2).unsqueeze(0)
                dst.values[rows_t.view(-1, 1), :, slots.view(1, -1)] = v[0].permute(1, 0, 2).unsqueeze(0)
            # index_fill_ and a device-side True, not `x[rows] = scalar`: that copies the scalar over
            # from the host, which waits for the steps queued ahead
            r.key_valid.index_fill_(0, rows_t, False)
            r.key_valid.index_put_((rows_t.view(-1, 1), slots.view(1, -1)), r.key_valid.new_ones(()))
            r.pos.index_fill_(0, rows_t, n)
            r.out.index_fill_(0, rows_t, self.engine.pad_id)
            r.out_lp.index_fill_(0, rows_t, 0.0)
            r.col.index_fill_(0, rows_t, 0)
            r.finished.index_fill_(0, rows_t, False)
            self._ring_emit(r, rec["logits"].expand(len(rows_of), -1), greedy, rows_t)

    def step(self, r: Ring, greedy: bool) -> None:
        """One token for every row of the ring (what its graph captures)."""
        e = self.engine
        r.key_valid.index_fill_(1, r.t, True)   # this step's key is written at slot t in every row
        # A row's sequence is contiguous around the ring, so its key at slot i is (t - i) mod length back.
        distance = (r.t - r.key_index).remainder(r.length)                            # [L]
        with e.passes(kernel=e.attention_kernel and not self.compile_ring):   # one shape; compiled: SDPA's
            logits = e.model(input_ids=r.tok, position_ids=r.pos,
                             attention_mask=layer_masks(e.plan, e.dtype, r.key_valid.view(r.rows, 1, 1, -1), distance),
                             past_key_values=r.cache, use_cache=True, logits_to_keep=1).logits[:, -1]
        for layer in r.cache.layers:            # HF advanced its write index by one: wrap it with ours
            layer.cumulative_length.remainder_(r.length)
        r.t.add_(1).remainder_(r.length)
        r.pos.add_(1)
        self._ring_emit(r, logits, greedy, slice(None))

    def _ring_emit(self, r: Ring, logits: torch.Tensor, greedy: bool, rows) -> None:
        """The ring's next token for `rows` (sample_step), written at each row's own output column;
        a row also ends at max_new tokens, and an ended row's column moves to the spare one."""
        col = r.col[rows]
        e = self.engine
        nxt, lp, ended = e.sample(logits, r.inv_t, greedy, r.finished[rows], self.fused)
        r.out[rows] = r.out[rows].scatter(1, col, nxt.unsqueeze(1))
        r.out_lp[rows] = r.out_lp[rows].scatter(1, col, lp.unsqueeze(1))
        ended = ended | (col.squeeze(1) + 1 >= r.max_new)
        r.finished[rows] = ended
        r.col[rows] = torch.where(ended.unsqueeze(1), r.max_new, col + 1)
        r.tok[rows] = nxt.unsqueeze(1)
