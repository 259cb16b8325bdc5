"""The chunked head's log-probs as two Triton kernels: log softmax(logits / T)[target] for each row of a
chunk of logits [n, V] and, in the backward, its gradient, each in one pass over the row in the
logits' own dtype. The torch ops they replace (grpo.model.logprobs._chunk_logprobs) make about ten
passes over a float32 copy of [n, V]: the cast, the scaling, the log-sum-exp's max, subtraction,
exponent and sum, then in the backward the exponent, subtraction and product again, and the cast
back. At Qwen2.5's 151,936 columns a chunk of 880 rows is 535 MB in float32 per pass.

Forward: one program a row keeps the running max and sum of exp (rescaled as the max grows) and
writes the row's log-prob and log-sum-exp (float32). Backward: d logp / d logit_v = (1[v = target] -
softmax_v) / T, times the row's incoming gradient, written in the logits' dtype; the log-sum-exp
saved by the forward makes it one pass. Values are computed in float32 from the logits as given,
the same arithmetic as the torch ops (which cast first).

Triton is a dependency of torch's CUDA builds; on a CPU machine the kernels run under Triton's
interpreter (TRITON_INTERPRET=1), which is how the CPU tests check them against the torch ops.
"""
from __future__ import annotations

import functools

import torch

from grpo.model.triton_run import failure, runs_here

BLOCK = 2048   # vocabulary columns a program reads at once


available = runs_here   # whether the kernels can run on a device (CUDA, or the interpreter)


@functools.cache
def _compile():
    """The kernels, defined on first use: importing triton costs a second, and CPU runs need none."""
    import triton
    import triton.language as tl

    @triton.jit
    def logprob_rows(logits_ptr, row_stride, target_ptr, inv_t, lp_ptr, lse_ptr,
                     V: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        base = logits_ptr + row.to(tl.int64) * row_stride
        m = -float("inf")                      # running max of the scaled logits
        s = 0.0                                # running sum of exp(x - m)
        for start in range(0, V, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            inside = cols < V
            x = tl.load(base + cols, mask=inside, other=-float("inf")).to(tl.float32) * inv_t   # [BLOCK]
            new_m = tl.maximum(m, tl.max(x, 0))
            s = s * tl.exp(m - new_m) + tl.sum(tl.where(inside, tl.exp(x - new_m), 0.0), 0)
            m = new_m
        lse = m + tl.log(s)
        picked = tl.load(base + tl.load(target_ptr + row)).to(tl.float32) * inv_t
        tl.store(lp_ptr + row, picked - lse)
        tl.store(lse_ptr + row, lse)

    @triton.jit
    def logprob_rows_backward(logits_ptr, row_stride, target_ptr, inv_t, lse_ptr, grad_out_ptr, grad_ptr, grad_stride,
                              V: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        base = logits_ptr + row.to(tl.int64) * row_stride
        out = grad_ptr + row.to(tl.int64) * grad_stride
        g = tl.load(grad_out_ptr + row) * inv_t
        lse = tl.load(lse_ptr + row)
        target = tl.load(target_ptr + row)
        for start in range(0, V, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            inside = cols < V
            x = tl.load(base + cols, mask=inside, other=0.0).to(tl.float32) * inv_t
            d = g * (tl.where(cols == target, 1.0, 0.0) - tl.exp(x - lse))
            tl.store(out + cols, d.to(grad_ptr.dtype.element_ty), mask=inside)

    return (logprob_rows, logprob_rows_backward)


class _TokenLogprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, inv_t: float) -> torch.Tensor:
        if logits.stride(-1) != 1:
            logits = logits.contiguous()
        n, V = logits.shape
        lp = torch.empty(n, dtype=torch.float32, device=logits.device)
        lse = torch.empty(n, dtype=torch.float32, device=logits.device)
        if n:
            _compile()[0][(n,)](logits, logits.stride(0), targets, inv_t, lp, lse, V=V, BLOCK=BLOCK)
        ctx.save_for_backward(logits, targets, lse)
        ctx.inv_t = inv_t
        return lp

    @staticmethod
    def backward(ctx, grad_lp: torch.Tensor):
        logits, targets, lse = ctx.saved_tensors
        n, V = logits.shape
        grad = torch.empty_like(logits)
        if n:
            _compile()[1][(n,)](logits, logits.stride(0), targets, ctx.inv_t, lse, grad_lp.float().contiguous(),
                                grad, grad.stride(0), V=V, BLOCK=BLOCK)
        return grad, None, None


def token_logprob(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(logits / temperature)[targets]: [n] float32 from logits [n, V] (any float dtype, the
    vocabulary contiguous) and targets [n] (long); differentiable in logits, the gradient in their dtype."""
    return _TokenLogprob.apply(logits, targets.contiguous(), 1.0 / temperature)


def check(device: torch.device) -> str | None:
    """None if the kernels run on `device` and agree with the torch ops on a small chunk, values and
    gradients, else why not, in one line (the head then keeps the torch ops)."""
    try:
        gen = torch.Generator().manual_seed(0)
        x = (torch.randn(3, 3 * BLOCK + 5, generator=gen) * 4).to(device)
        targets = torch.tensor([0, 7, 3 * BLOCK + 4], device=device)
        weights = torch.tensor([1.0, -2.0, 0.5], device=device)
        for dtype in ((torch.bfloat16, torch.float32) if device.type == "cuda" else (torch.float32,)):
            mine, ref = x.to(dtype).clone().requires_grad_(), x.to(dtype).clone().requires_grad_()   # two leaves
            got = token_logprob(mine, targets, 0.7)
            (got * weights).sum().backward()
            z = ref.float() / 0.7
            want = z.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(z, -1)
            (want * weights).sum().backward()
            # the gradients in the logits' dtype: one rounding step apart at most, so relative to their largest
            scale = ref.grad.float().abs().max().item()
            err = max((got - want).abs().max().item(), (mine.grad.float() - ref.grad.float()).abs().max().item() / scale)
            if not err < 1e-2:
                return f"differs from torch's ops by {err:.3g} in {dtype}"
    except Exception as exc:   # noqa: BLE001 - any failure means: keep torch's ops
        return failure(exc)
    return None
