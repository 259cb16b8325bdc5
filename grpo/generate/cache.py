"""The engine's device state: a static KV cache of one length in every layer (`static_cache`,
`reset_cache`), and the static buffers around it that a captured decode graph reads and writes:
a fixed batch's (`Slot`, RolloutEngine.generate) and the in-flight ring's (`Ring`, RolloutEngine.stream).
One object per (rows, prompt width, max_new_tokens) shape, so every step has the same shapes and
tensor addresses."""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, StaticCache, StaticLayer

from grpo.generate.attention import LayerPlan, layer_plan


def static_cache(model, length: int, device: torch.device, plan: LayerPlan | None = None):
    """A StaticCache of `length` slots in every layer, sliding ones included (transformers' own gives
    those a StaticSlidingWindowLayer of `window` slots, which rolls its keys and keeps a Python-side
    counter): slot i holds position i in every layer, and the sliding layers' window is in the mask.

    Each layer's write index is made on `device`: transformers makes it on the CPU and moves it at
    the layer's first write, a pageable copy that waits for all queued work, so a prefill queued
    behind decode steps would wait for them."""
    plan = plan or layer_plan(model)
    cache = StaticCache.__new__(StaticCache)
    layers = [StaticLayer(max_cache_len=length) for _ in plan.kinds]
    for layer in layers:
        layer.cumulative_length = torch.zeros_like(layer.cumulative_length, device=device)
    Cache.__init__(cache, layers=layers)
    return cache


def reset_cache(cache) -> None:
    """Every layer back to an empty cache (the slots are overwritten, not zeroed): the tensor write
    index, and the Python-side counters some layers keep (a StaticSlidingWindowLayer's
    cumulative_length_int, which transformers' reset only clears with the keys)."""
    for layer in cache.layers:
        if not getattr(layer, "is_initialized", False):
            continue
        length = getattr(layer, "cumulative_length", None)
        if isinstance(length, torch.Tensor):
            length.zero_()
        elif length is not None:
            layer.cumulative_length = 0
        if hasattr(layer, "cumulative_length_int"):
            layer.cumulative_length_int = 0



class Slot:
    """Everything one (batch rows, prompt width, max_new_tokens) shape needs: static cache,
    static input/output buffers and the captured decode graphs, one per (greedy, attention
    length): greedy or sampling, and how many cache slots the step reads (attend_limit)."""

    def __init__(self, model, rows: int, width: int, max_new: int, pad_id: int, device: torch.device,
                 plan: LayerPlan | None = None):
        self.rows, self.width, self.max_new = rows, width, max_new
        length = width + max_new
        self.cache = static_cache(model, length, device, plan)
        kw = dict(device=device)
        self.key_valid = torch.zeros((rows, length), dtype=torch.bool, **kw)    # real prompt tokens + all generated slots
        self.key_index = torch.arange(length, **kw)                             # [L]
        self.tok = torch.full((rows, 1), pad_id, dtype=torch.long, **kw)        # token fed to the next step
        self.pos = torch.zeros((rows, 1), dtype=torch.long, **kw)               # its position id
        self.t = torch.zeros((), dtype=torch.long, **kw)                        # its cache slot
        self.col = torch.zeros((1,), dtype=torch.long, **kw)                    # its output column
        self.finished = torch.zeros((rows,), dtype=torch.bool, **kw)
        self.inv_t = torch.ones((), dtype=torch.float32, **kw)                  # 1 / temperature
        self.out = torch.full((rows, max_new), pad_id, dtype=torch.long, **kw)
        self.out_lp = torch.zeros((rows, max_new), dtype=torch.float32, **kw)
        self.graphs: dict[tuple[bool, int | None], torch.cuda.CUDAGraph | None] = {}
        # The slot's graphs (greedy, sampling; each attention length) share one memory pool, which lives as long as they
        # do. One pool handle for the whole engine broke once every graph of a freed slot was
        # gone: PyTorch releases a pool with its last graph, and capturing into the stale
        # handle then fails an allocator assertion (seen with torch 2.11).
        self.pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None

    def reset_cache(self) -> None:
        reset_cache(self.cache)


class Ring:
    """In-flight decoding state (`RolloutEngine.stream`): `rows` rows, each busy with one sample of
    a group or free, over one static cache whose `length` = width + max_new slots are used as a ring.

    Every decode step writes every row's key at the same slot t (HF's StaticCache writes one
    column for the whole batch), then t advances modulo `length`. A row refilled at slot t gets
    its prompt at slots [t - P, t) and its tokens from t on; it needs P + max_new <= length slots,
    so by the time the ring comes round to a slot, the sequence that wrote it has ended. Attention
    does not care where a key sits (RoPE was applied with the row's own positions before the key
    was stored), so each row attends to exactly the slots marked in its `key_valid` row."""

    def __init__(self, model, rows: int, width: int, max_new: int, pad_id: int, device: torch.device,
                 plan: LayerPlan | None = None):
        self.rows, self.width, self.max_new, self.length = rows, width, max_new, width + max_new
        self.cache = static_cache(model, self.length, device, plan)
        kw = dict(device=device)
        self.key_valid = torch.zeros((rows, self.length), dtype=torch.bool, **kw)   # slots of the row's sequence
        self.key_index = torch.arange(self.length, **kw)                            # [L]
        self.tok = torch.full((rows, 1), pad_id, dtype=torch.long, **kw)
        self.pos = torch.zeros((rows, 1), dtype=torch.long, **kw)                  # each row's own position id
        self.t = torch.zeros((1,), dtype=torch.long, **kw)                         # the slot this step writes
        # Each row's next output column; max_new (a spare column) once the row has ended, so
        # ended rows write their padding where nothing is read.
        self.col = torch.full((rows, 1), max_new, dtype=torch.long, **kw)
        self.finished = torch.ones((rows,), dtype=torch.bool, **kw)                 # free rows count as ended
        self.inv_t = torch.ones((), dtype=torch.float32, **kw)
        self.out = torch.full((rows, max_new + 1), pad_id, dtype=torch.long, **kw)
        self.out_lp = torch.zeros((rows, max_new + 1), dtype=torch.float32, **kw)
        self.graphs: dict[bool, torch.cuda.CUDAGraph | None] = {}
        self.pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None
