"""The learner's global batch: built from groups on rank 0, broadcast, split by tokens.

Rank 0 packs the batch into four flat tensors and broadcasts them (a few hundred KB even
for large batches, so one broadcast costs far less than a step). Every rank then runs the
same deterministic split, keeps its own shard and cuts it into micro-batches. Uneven
shards are fine: the loss uses global normalisers (see grpo.loss.reduce_loss).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from grpo.loss import group_advantages
from grpo.wire import messages as M


@dataclass
class Batch:
    meta: torch.Tensor      # int64 [B, 5]: prompt_len, gen_len, policy_version, group index, finished
    tokens: torch.Tensor    # int64 [sum whole_len]: whole_token_ids of every sequence, concatenated
    floats: torch.Tensor    # float32 [2 * sum gen_len]: old log-probs then reference log-probs
    scalars: torch.Tensor   # float32 [B, 2]: advantage, reward

    @property
    def size(self) -> int:
        return int(self.meta.shape[0])

    def whole_lens(self) -> list[int]:
        return (self.meta[:, 0] + self.meta[:, 1]).tolist()


def build_batch(groups: list[M.Group], group_size: int, scale_rewards: bool) -> Batch:
    rows, toks, old, ref, rewards = [], [], [], [], []
    for gi, g in enumerate(groups):
        P_len = len(g.prefix_token_ids)
        for c in g.completions:
            rows.append((P_len, len(c.generated_token_ids), g.policy_version, gi, int(c.is_finished)))
            toks.append(c.whole_token_ids)
            old.append(c.old_policy_log_probs)
            # Empty: the sampler computed none (the run needs none, beta 0); zeros stand in, unused.
            ref.append(c.ref_policy_log_probs if len(c.ref_policy_log_probs) else
                       np.zeros(len(c.generated_token_ids), np.float32))
            rewards.append(c.reward)
    r = torch.tensor(rewards, dtype=torch.float32)
    adv = group_advantages(r, group_size, scale=scale_rewards)
    return Batch(meta=torch.tensor(rows, dtype=torch.int64).view(-1, 5),
                 tokens=torch.from_numpy(np.concatenate(toks).astype(np.int64)),
                 floats=torch.from_numpy(np.concatenate(old + ref).astype(np.float32)),
                 scalars=torch.stack([adv, r], dim=1))


def broadcast_batch(batch: Batch | None, stop: bool, device: torch.device) -> tuple[Batch | None, bool]:
    """Rank 0 passes its batch (or stop=True); every rank returns the same batch or the stop flag."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        head = torch.zeros(4, dtype=torch.int64, device=device)
        if batch is not None and dist.get_rank() == 0:
            head[:] = torch.tensor([int(stop), batch.size, batch.tokens.numel(), batch.floats.numel()])
        elif dist.get_rank() == 0:
            head[0] = int(stop)
        dist.broadcast(head, src=0)
        stop_flag, b, nt, nf = head.tolist()
        if stop_flag:
            return None, True
        if dist.get_rank() == 0:
            parts = [batch.meta.to(device), batch.tokens.to(device), batch.floats.to(device),
                     batch.scalars.to(device)]
        else:
            parts = [torch.empty((b, 5), dtype=torch.int64, device=device),
                     torch.empty(nt, dtype=torch.int64, device=device),
                     torch.empty(nf, dtype=torch.float32, device=device),
                     torch.empty((b, 2), dtype=torch.float32, device=device)]
        for t in parts:
            dist.broadcast(t, src=0)
        return Batch(*[t.cpu() for t in parts]), False
    return (None, True) if stop else (batch, False)


def balanced_split(lengths: list[int], parts: int) -> list[list[int]]:
    """Indices split into `parts` lists with near-equal token sums (longest first, greedy).

    Deterministic (ties go to the lower part), so every rank computes the same split.
    """
    out: list[list[int]] = [[] for _ in range(parts)]
    load = [0] * parts
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        p = min(range(parts), key=lambda k: (load[k], k))
        out[p].append(i)
        load[p] += lengths[i]
    return [sorted(ix) for ix in out]


def minibatches(groups: int, group_size: int, parts: int) -> list[list[int]]:
    """Sequence indices of a batch of `groups` whole groups cut into `parts` optimizer updates
    (--ppo-minibatches): consecutive runs of whole groups, as even as possible (the later runs
    get the extra group), so each update's advantages keep their group. Deterministic."""
    if not 1 <= parts <= groups:
        raise ValueError(f"--ppo-minibatches {parts}: must be between 1 and the groups per step ({groups})")
    cuts = [(k * groups) // parts for k in range(parts + 1)]
    return [list(range(cuts[k] * group_size, cuts[k + 1] * group_size)) for k in range(parts)]


def length_buckets(lengths: list[int], parts: int) -> list[list[int]]:
    """Indices cut into `parts` micro-batches of neighbouring lengths: sorted by length, then
    consecutive runs of near-equal size (the later runs get the extra one). Each micro-batch
    pads to its own longest sequence, so similar lengths travel together and padding stays
    small; no run holds more sequences than ceil(n / parts), so memory per micro-step is
    bounded as with any split of that size. Deterministic; empty runs when n < parts.
    """
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    n = len(order)
    return [sorted(order[(k * n) // parts:((k + 1) * n) // parts]) for k in range(parts)]


def token_buckets(lengths: list[int], budget: int) -> list[list[int]]:
    """Indices cut into as few micro-batches as keep each one's padded size (rows x its longest
    row) within `budget` tokens, and among those cuts the one with the fewest padded slots: rows
    sorted by length, cut into runs of neighbours. A row longer than the budget travels alone.
    Deterministic; no micro-batch for no rows.

    Fewer, fuller micro-batches when sequences are short: a small model's step costs about the
    same host time per micro-batch whatever its rows (kernel launches), so four micro-batches of
    32 short rows cost four times one of 128 (verl's dynamic batch size by tokens, the same idea).
    Filling each micro-batch in turn (first fit) gives the fewest; where it cuts is then chosen
    to waste the least: lengths 2, 2, 2, 3, 4, 4 and a budget of 8 fill as [2 2 2] [3 4] [4], 18
    slots for 17 tokens, and are cut as [2 2 2] [3] [4 4], 17 slots.
    """
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    ln = [lengths[i] for i in order]   # ascending: a run's longest row is its last
    n = len(ln)
    if not n:
        return []
    # First fit: the fewest runs, k.
    k, rows = 1, 0
    for x in ln:
        if rows and (rows + 1) * x > budget:
            k, rows = k + 1, 0
        rows += 1
    # Fewest padded slots over cuts into at most k runs: best[j] = slots of the first j rows in
    # runs so far; a run i..j-1 costs (j - i) x ln[j - 1] and must fit (or be one row).
    inf = float("inf")
    best = [0.0] + [inf] * n
    cut: list[list[int]] = []
    for _ in range(k):
        nxt, back = [inf] * (n + 1), [0] * (n + 1)
        for j in range(1, n + 1):
            longest, i = ln[j - 1], j - 1
            while i >= 0 and ((j - i) * longest <= budget or i == j - 1):
                v = best[i] + (j - i) * longest
                if v < nxt[j]:
                    nxt[j], back[j] = v, i
                i -= 1
        best = nxt
        cut.append(back)
    # Walk back from all n rows in exactly k runs (first fit proved k enough).
    runs, j = [], n
    for back in reversed(cut):
        i = back[j]
        runs.append(sorted(order[i:j]))
        j = i
    return runs[::-1]


def real_token_buckets(lengths: list[int], budget: int) -> list[list[int]]:
    """Indices cut into as few micro-batches as keep each one's real tokens (the sum of its rows'
    lengths) within `budget`, for padding-free passes, which hold those and no padding slot; among
    those cuts, the one whose largest micro-batch is smallest. Rows sorted by length, cut into runs
    of neighbours; a row longer than the budget travels alone. Deterministic; no micro-batch for no
    rows.

    Lengths 5, 3, 8, 2, 7 and a budget of 12: sorted 2 3 5 7 8 (25 tokens) need three runs (first
    fit: [2 3 5] [7] [8]); the least largest run of three is 10 ([2 3 5] [7] [8]: a cap of 9 would
    need four), so indices [3 1 0] [4] [2]."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    ln = [lengths[i] for i in order]

    def runs_at(cap: int) -> list[int]:
        """Where each run starts, filling each in turn up to `cap` tokens (or one row)."""
        starts, total = [], 0
        for j, x in enumerate(ln):
            if not starts or total + x > cap:
                starts.append(j)
                total = 0
            total += x
        return starts

    if not ln:
        return []
    k = len(runs_at(budget))
    lo, hi = min(-(-sum(ln) // k), budget), budget
    while lo < hi:   # the least cap (within the budget) that still needs only k runs
        mid = (lo + hi) // 2
        if len(runs_at(mid)) <= k:
            hi = mid
        else:
            lo = mid + 1
    starts = runs_at(lo) + [len(ln)]
    return [sorted(order[a:b]) for a, b in zip(starts, starts[1:])]


def padded_tokens(lengths: list[int], parts: list[list[int]]) -> int:
    """Token slots the micro-batches occupy once right-padded (rows x longest row, per part)."""
    return sum(len(p) * max(lengths[i] for i in p) for p in parts if p)


@dataclass
class MicroBatch:
    input_ids: torch.Tensor    # [b, L] right-padded
    attention: torch.Tensor    # [b, L]
    gen_mask: torch.Tensor     # [b, L-1] 1 where the target token at t+1 is a generated token
    old_logp: torch.Tensor     # [b, L-1] aligned with gen_mask, 0 elsewhere
    ref_logp: torch.Tensor     # [b, L-1]
    advantages: torch.Tensor   # [b]
    finished: torch.Tensor     # [b] 1.0 if the completion ended with EOS, 0.0 if cut at the length cap
    first: torch.Tensor        # [b] int64 prompt_len - 1: each row's first position gen_mask can hold


def micro_batch(batch: Batch, index: list[int], pad_id: int, device: torch.device) -> MicroBatch:
    meta = batch.meta.tolist()
    tok_off = np.concatenate([[0], np.cumsum([m[0] + m[1] for m in meta])]).tolist()
    gen_off = np.concatenate([[0], np.cumsum([m[1] for m in meta])]).tolist()
    n_gen = gen_off[-1]
    width = max(meta[i][0] + meta[i][1] for i in index)
    b = len(index)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    attn = torch.zeros((b, width), dtype=torch.long)
    gmask = torch.zeros((b, width - 1), dtype=torch.float32)
    old = torch.zeros((b, width - 1), dtype=torch.float32)
    ref = torch.zeros((b, width - 1), dtype=torch.float32)
    for r, i in enumerate(index):
        p, n = meta[i][0], meta[i][1]
        ids[r, :p + n] = batch.tokens[tok_off[i]:tok_off[i + 1]]
        attn[r, :p + n] = 1
        gmask[r, p - 1:p - 1 + n] = 1.0   # generated token t is predicted at position t-1
        old[r, p - 1:p - 1 + n] = batch.floats[gen_off[i]:gen_off[i + 1]]
        ref[r, p - 1:p - 1 + n] = batch.floats[n_gen + gen_off[i]:n_gen + gen_off[i + 1]]
    adv = batch.scalars[index, 0]
    finished = batch.meta[index, 4].float()
    first = batch.meta[index, 0] - 1
    return MicroBatch(*(t.to(device) for t in (ids, attn, gmask, old, ref, adv, finished, first)))
