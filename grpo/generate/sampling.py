"""One sampling step, shared by the fixed-batch and in-flight paths (RolloutEngine.generate and
.stream), all on the device with no host sync, so that it can be captured in a CUDA graph:

* temperature: logits / T (`inv_t` = 1 / T, a device scalar the graph reads);
* the draw: greedy is argmax; otherwise Gumbel-max, argmax of logits/T - log E with E ~ Exp(1),
  an exact draw from softmax(logits/T) without `multinomial` (which syncs);
* the drawn token's log-prob under that distribution (one log-sum-exp over the row);
* finished rows emit padding with log-prob 0, and a row ends at any of its EOS ids.
"""
from __future__ import annotations

import torch


def sample_step(logits: torch.Tensor, inv_t: torch.Tensor | float, greedy: bool, generator: torch.Generator | None,
                done: torch.Tensor, pad_id: int, eos: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(token, its log-prob, ended) per row, from `logits` [n, V] (any float dtype; computed in float32).

    done [n] bool: rows already ended, which get `pad_id` and log-prob 0. eos [k] long: the ids that
    end a row (k may be 0). ended = done, or the token is one of `eos`."""
    scaled = logits.float() * inv_t                                                   # [n, V]
    if greedy:
        nxt = scaled.argmax(-1)
    else:
        noise = torch.empty_like(scaled).exponential_(generator=generator)           # E ~ Exp(1)
        nxt = (scaled - noise.log()).argmax(-1)                                       # Gumbel-max draw
    lp = scaled.gather(-1, nxt.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(scaled, -1)
    nxt = torch.where(done, pad_id, nxt)
    lp = torch.where(done, 0.0, lp)
    ended = done | (nxt.unsqueeze(-1) == eos).any(-1)   # isin without its sort/sync paths
    return nxt, lp, ended


def new_generator(device: torch.device) -> torch.Generator:
    """The engine's own generator for sampling noise, seeded from torch's global RNG (a CPU draw),
    so torch.manual_seed still makes runs repeatable."""
    gen = torch.Generator(device=device)
    gen.manual_seed(int(torch.randint(0, 2**62, (1,)).item()))
    return gen
