"""A stream over an engine that decodes fixed batches: the rollout path's stream (grpo.generate.stream's
interface) for a decoder that generates a whole batch at once and then yields its groups.

Two users. A fixed round (--in-flight-rows 0) is a stream of the round's prompts, capped at that many
by the caller's source, decoded as one batch by our engine's `generate` or by Hugging Face `generate`
(hf_rollout): no weights are swapped inside it, and its groups all end at one host check, once the
batch has. And our engine's fallback, on a model it cannot serve, streams in flight the same way
(`rows` samples a batch, swap() asked between batches, when the batch has drained).
"""
from __future__ import annotations

from typing import Callable, Iterator

import numpy as np
import torch

from grpo.generate.backend import Rollout
from grpo.generate.stream import FinishedGroup, checked_swap, group_versions, samples_of


class BatchStream:
    """A stream (grpo.generate.stream's interface) over `generate(prompts, max_new_tokens, temperature,
    greedy, should_stop) -> Rollout`: the waiting prompts as one fixed batch at a time (up to `rows`
    samples; all the source gives with rows 0 or None), each group yielded once its batch is done."""

    def __init__(self, generate: Callable[..., Rollout]):
        self.generate = generate

    @torch.no_grad()
    def stream(self, next_prompt, group_size: int, max_new_tokens: int, temperature: float = 1.0,
               greedy: bool = False, rows: int | None = None, should_stop: Callable[[], bool] | None = None,
               swap: Callable[[], int | None] | None = None, version: int = 0,
               min_width: int = 0) -> Iterator[FinishedGroup]:
        """As RingStream.stream, batch by batch: next_prompt() is asked until it says None or the
        batch is full, the batch decodes until its longest row ends, and its groups are yielded (the
        last one with last_in_check). swap() is asked after each batch (this stream's host check), so
        every token of a batch is drawn by one version. A batch that should_stop cut short yields
        nothing and ends the stream. min_width: no meaning here (no ring to size)."""
        G = int(group_size)
        greedy = greedy or temperature == 0
        version = int(version)
        while True:
            batch = self._take(next_prompt, G, rows)
            if not batch:
                return
            out = self.generate([p for _, p, n in batch for _ in range(n)], max_new_tokens, temperature, greedy,
                                should_stop)
            if out.stats.get("stopped"):
                return
            drew = version
            if swap is not None and (new := checked_swap(swap, version)) is not None:
                version = new
            yield from _groups(batch, out, drew)

    @staticmethod
    def _take(next_prompt, G: int, rows: int | None) -> list[tuple[object, list[int], int]]:
        """The next batch's (key, prompt ids, samples): up to `rows` samples (at least one prompt),
        or every prompt the source gives before it says None when rows is 0 or None. A prompt asks
        for G samples, or n with (key, ids, n) (samples_of)."""
        batch: list[tuple[object, list[int], int]] = []
        samples = 0
        while not rows or samples + G <= max(rows, G):   # (room for a whole group: n is at most G)
            item = next_prompt()
            if item is None:
                break
            if not item[1]:
                raise ValueError("stream: an empty prompt")
            batch.append((item[0], list(item[1]), samples_of(item, G)))
            samples += batch[-1][2]
        return batch


def _groups(batch: list[tuple[object, list[int], int]], out: Rollout, drew: int) -> Iterator[FinishedGroup]:
    """A decoded batch's groups (each prompt's n rows, in the batch's order), every token drawn by `drew`."""
    start = 0
    for i, (key, _, n) in enumerate(batch):
        sl = slice(start, start + n)
        start += n
        vs = [np.full(len(t), drew, dtype=np.int32) for t in out.token_ids[sl]]
        yield FinishedGroup(key, out.token_ids[sl], out.finished[sl],
                            out.logprobs[sl] if out.logprobs is not None else None,
                            out.stats["decode_steps"], vs, *group_versions(vs, drew),
                            last_in_check=i == len(batch) - 1)
