"""The learner's warm-up pass: made-up tokens through the model, forward and backward, while the
samplers generate round 0.

On CUDA a process's first forward and backward pay one-time costs: the kernels' modules load on
first use, cuBLAS makes its handles and workspaces and picks its algorithms, and the caching
allocator grows to a micro-batch's size. In a run those costs fell on the first optimizer step,
after a wait for round 0 in which the learner did nothing (docs/benchmarks.md, "First step"). The
warm-up pays them during that wait.

It leaves no trace in training: the gradient is taken with respect to a copy of the input
embeddings alone (torch.autograd.grad), so no parameter gets a .grad, no gradient hook fires
(DeepSpeed's ZeRO-2 reduction hangs on them) and the optimizer and its step count are untouched;
the random number generators are restored after it.
"""
from __future__ import annotations

import contextlib
import time

import torch

from grpo.config import assumed_row_tokens
from grpo.model.logprobs import token_logprobs


def warm_up_shape(micro_rows: int, max_prompt_tokens: int, max_new_tokens: int) -> tuple[int, int]:
    """(rows, length) of the warm-up batch: a full micro-batch of an assumed prompt plus the longest
    completion. The first batch's lengths are not known yet, and a shape near theirs is enough:
    handles, module loads and the allocator's blocks carry over."""
    return max(1, micro_rows), assumed_row_tokens(max_prompt_tokens, max_new_tokens)


def warm_up(module: torch.nn.Module, vocab_size: int, rows: int, length: int, device: torch.device,
            amp: contextlib.AbstractContextManager | None = None, temperature: float = 1.0,
            padding_free: bool = True) -> float:
    """One forward and backward pass on [rows, length] made-up tokens; returns the seconds it took
    (the device synchronised). Changes no parameter, gradient, optimizer state or RNG state."""
    t0 = time.perf_counter()
    ids = torch.randint(0, vocab_size, (rows, length), generator=torch.Generator().manual_seed(0)).to(device)
    mask = torch.ones_like(ids)
    start: list[torch.Tensor] = []

    def detach_embeddings(_mod, _inp, out):
        # The graph starts here: a leaf copy of the embeddings, the one input the gradient is for.
        leaf = out.detach().requires_grad_(True)
        start.append(leaf)
        return leaf

    handle = module.get_input_embeddings().register_forward_hook(detach_embeddings)
    devices = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices), (amp or contextlib.nullcontext()):
            logp = token_logprobs(module, ids, mask, temperature, padding_free=padding_free)   # [rows, length-1]
            torch.autograd.grad(logp.float().mean(), start)               # activations' gradients only
    finally:
        handle.remove()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0
