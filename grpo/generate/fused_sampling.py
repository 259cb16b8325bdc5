"""The sampling step as one Triton kernel: the same draw as grpo.generate.sampling.sample_step
(argmax of logits / T, or Gumbel-max over it; the drawn token's log-prob; padding after the end;
EOS) in one pass over each row's logits, where sample_step's torch ops make about ten passes over a
float32 copy of [rows, vocab] (the cast, the scale, the noise, its log, the argmax, the
log-sum-exp). At 320 rows of Qwen2.5's 151,936 logits that copy is 194 MB a step.

One program per row walks the vocabulary in blocks, keeping scalars: the running max and sum of
exp for the log-sum-exp (rescaled as the max grows), and the best score so far with its index and
scaled logit. A block's best replaces the running one only when strictly greater, and tl.argmax
takes the first of equal values, so greedy ties go to the lowest id, as torch.argmax's do.

The noise is Philox's (tl.rand) at (seed, row x vocab + column): `seed` is a device int64 the
caller owns and advances by one after each draw, so a captured CUDA graph draws new noise at every
replay without a host value. Different draws than sample_step's for the same torch seed, from the
same distribution.

Triton is a dependency of torch's CUDA builds; on a CPU machine the kernel runs under Triton's
interpreter (TRITON_INTERPRET=1), which is how the CPU tests check it against sample_step.
"""
from __future__ import annotations

import functools

import torch

from grpo.model.triton_run import failure, runs_here

BLOCK = 2048   # vocabulary columns a program reads at once


available = runs_here   # whether the fused step can run on a device (CUDA, or the interpreter)


@functools.cache
def _compile():
    """The kernel, defined on first use: importing triton costs a second, and CPU runs need none."""
    import triton
    import triton.language as tl

    @triton.jit
    def sample_rows(logits_ptr, row_stride, inv_t_ptr, seed_ptr, done_ptr, eos_ptr, pad_id, tok_ptr, lp_ptr, ended_ptr,
                    V: tl.constexpr, N_EOS: tl.constexpr, GREEDY: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        inv_t = tl.load(inv_t_ptr).to(tl.float32)
        seed = tl.load(seed_ptr)
        base = logits_ptr + row.to(tl.int64) * row_stride
        m = -float("inf")                       # running max of the scaled logits
        s = 0.0                                 # running sum of exp(x - m)
        best = -float("inf")                    # best score (x, or x plus Gumbel noise) so far
        best_i = 0
        best_x = 0.0
        for start in range(0, V, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            inside = cols < V
            x = tl.load(base + cols, mask=inside, other=-float("inf")).to(tl.float32) * inv_t   # [BLOCK]
            block_m = tl.max(x, 0)
            new_m = tl.maximum(m, block_m)
            s = s * tl.exp(m - new_m) + tl.sum(tl.where(inside, tl.exp(x - new_m), 0.0), 0)
            m = new_m
            if GREEDY:
                score = x
            else:
                u = tl.rand(seed, row * V + cols)                                # uniform in [0, 1)
                score = x - tl.log(-tl.log(u))                                    # Gumbel: -log(E), E ~ Exp(1)
            score = tl.where(inside, score, -float("inf"))
            i = tl.argmax(score, 0)
            top = tl.max(score, 0)
            x_i = tl.sum(tl.where(tl.arange(0, BLOCK) == i, x, 0.0), 0)
            take = top > best
            best_i = tl.where(take, start + i, best_i)
            best_x = tl.where(take, x_i, best_x)
            best = tl.maximum(best, top)
        lp = best_x - (m + tl.log(s))
        done = tl.load(done_ptr + row)
        ended = done
        for j in tl.static_range(N_EOS):
            ended = ended | (best_i == tl.load(eos_ptr + j))
        tl.store(tok_ptr + row, tl.where(done, pad_id, best_i).to(tl.int64))
        tl.store(lp_ptr + row, tl.where(done, 0.0, lp))
        tl.store(ended_ptr + row, ended)

    return sample_rows


def check(device: torch.device, vocab: int) -> str | None:
    """None if a draw of 2 rows of `vocab` logits runs on `device` (Triton compiles the kernel for that
    width here, as the engine's steps will use it), else why not, in one line."""
    try:
        logits = torch.zeros(2, vocab, device=device)
        inv_t = torch.ones((), device=device)
        done = torch.zeros(2, dtype=torch.bool, device=device)
        eos = torch.zeros(0, dtype=torch.long, device=device)
        for greedy in (True, False):
            seed = torch.zeros(1, dtype=torch.int64, device=device)   # not torch's RNG: runs repeat as before
            tok, _, _ = fused_sample_step(logits, inv_t, greedy, seed, done, 0, eos)
            tok.cpu()   # a host sync: a kernel that failed on the device says so here
    except Exception as exc:   # noqa: BLE001 - any failure means: use torch's ops
        return failure(exc)
    return None


def new_seed(device: torch.device) -> torch.Tensor:
    """The device seed fused_sample_step draws with, taken from torch's global RNG (a CPU draw), so
    torch.manual_seed still makes runs repeatable."""
    return torch.randint(0, 2**62, (1,), dtype=torch.int64).to(device)


def fused_sample_step(logits: torch.Tensor, inv_t: torch.Tensor, greedy: bool, seed: torch.Tensor,
                      done: torch.Tensor, pad_id: int, eos: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(token, its log-prob, ended) per row, as sample_step gives them, from `logits` [n, V] (any
    float dtype, rows may be a stride-0 expand; the vocabulary contiguous). inv_t: a device float
    scalar; seed [1] int64 on the device, advanced by one here after a sampled draw; done [n] bool;
    eos [k] long. No host sync: capturable in a CUDA graph."""
    n, V = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    tok = torch.empty(n, dtype=torch.long, device=logits.device)
    lp = torch.empty(n, dtype=torch.float32, device=logits.device)
    ended = torch.empty(n, dtype=torch.bool, device=logits.device)
    if n:
        _compile()[(n,)](logits, logits.stride(0), inv_t.reshape(1), seed, done, eos, pad_id, tok, lp, ended,
                         V=V, N_EOS=eos.numel(), GREEDY=greedy, BLOCK=BLOCK)
    if not greedy:
        seed.add_(1)   # the next draw's noise; on the device, so a graph replay advances it too
    return tok, lp, ended
