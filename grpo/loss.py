"""The GRPO objective as pure tensor functions: no I/O, no model, no distributed state.

Shapes: B sequences in this micro-batch, T generated-token positions (right-padded).
Everything is computed in float32 whatever the model's dtype, so bf16 rounding of
log-probs does not leak into the ratio.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

LOSS_TYPES = ("grpo", "dapo", "dr_grpo")


def group_advantages(rewards: torch.Tensor, group_size: int, scale: bool = True,
                     eps: float = 1e-4) -> torch.Tensor:
    """Group-normalised advantages, computed once per batch (TRL's convention).

    rewards: [N] with N = groups * group_size, groups contiguous. A = r - mean(group),
    divided by (std(group) + eps) when `scale` (std is the unbiased one, as torch and TRL use).
    A group whose rewards are all equal gets zero advantage: it carries no signal.
    """
    grouped = rewards.float().view(-1, group_size)                         # [N/G, G]
    centred = grouped - grouped.mean(dim=1, keepdim=True)                  # [N/G, G]
    if scale:
        std = grouped.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(centred[:, :1])
        centred = centred / (std + eps)
    return centred.reshape(-1)                                             # [N]


@dataclass
class TokenLoss:
    loss: torch.Tensor     # [B, T] per-token loss (zero where mask is 0)
    kl: torch.Tensor       # [B, T] k3 estimate of KL(policy || reference)
    ratio: torch.Tensor    # [B, T] pi / pi_old
    clipped: torch.Tensor  # [B, T] bool: the clipped branch was taken (no gradient through it)


def grpo_token_loss(logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor,
                    advantages: torch.Tensor, mask: torch.Tensor, epsilon: float = 0.2,
                    epsilon_high: float | None = None, beta: float = 0.0) -> TokenLoss:
    """Per-token clipped surrogate plus k3 KL.

    logp      [B, T] log pi_theta(token) under the learner's current weights (has grad)
    old_logp  [B, T] log pi_old(token): the behaviour policy that sampled it (sent by the sampler)
    ref_logp  [B, T] log pi_ref(token) from the frozen reference model
    advantages [B]  one advantage per sequence, broadcast over its tokens
    mask      [B, T] 1 for generated tokens, 0 for padding

    loss_t = -min(r_t A, clip(r_t, 1 - eps, 1 + eps_high) A) + beta * k3_t,
    r_t = exp(logp_t - old_logp_t),  k3_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1.
    """
    eps_high = epsilon if not epsilon_high else epsilon_high
    m = mask.bool()
    zero = torch.zeros((), dtype=torch.float32, device=logp.device)
    # Padding can hold anything: zero it before exp() so it can never produce inf * 0 = nan.
    logp = torch.where(m, logp.float(), zero)                               # [B, T]
    old = torch.where(m, old_logp.float(), zero)                            # [B, T]
    ref = torch.where(m, ref_logp.float(), zero)                            # [B, T]
    adv = advantages.float().unsqueeze(1)                                  # [B, 1]

    ratio = torch.exp(logp - old)                                          # [B, T]
    unclipped = ratio * adv                                                # [B, T]
    clipped = torch.clamp(ratio, 1.0 - epsilon, 1.0 + eps_high) * adv      # [B, T]
    surrogate = torch.minimum(unclipped, clipped)                          # [B, T]
    delta = ref - logp                                                     # [B, T]
    kl = torch.exp(delta) - delta - 1.0                                    # [B, T]
    loss = -surrogate + beta * kl                                          # [B, T]
    mf = m.float()
    return TokenLoss(loss=loss * mf, kl=kl * mf, ratio=ratio * mf,
                     clipped=(clipped < unclipped) & m)


def reduce_loss(token_loss: torch.Tensor, mask: torch.Tensor, loss_type: str,
                total_sequences: int, total_tokens: int, max_new_tokens: int) -> torch.Tensor:
    """This micro-batch's share of the global loss, so that shares add up exactly.

    The global batch is split over ranks and micro-batches with uneven sizes, so every
    normaliser is a *global* count passed in by the caller, never this slice's own:
      grpo    : sum_i (sum_t l_it / n_i) / total_sequences    (mean per sequence, then over sequences)
      dapo    : sum_it l_it / total_tokens                     (mean over every token of the batch)
      dr_grpo : sum_it l_it / (total_sequences * max_new_tokens)  (constant normaliser)
    """
    mf = mask.float()                                                      # [B, T]
    if loss_type == "grpo":
        per_seq = token_loss.sum(dim=1) / mf.sum(dim=1).clamp(min=1.0)     # [B]
        return per_seq.sum() / total_sequences
    if loss_type == "dapo":
        return token_loss.sum() / max(total_tokens, 1)
    if loss_type == "dr_grpo":
        return token_loss.sum() / (total_sequences * max_new_tokens)
    raise ValueError(f"unknown loss_type {loss_type!r}; choose one of {', '.join(LOSS_TYPES)}")
