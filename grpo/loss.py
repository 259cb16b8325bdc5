"""The GRPO objective as pure tensor functions: no I/O, no model, no distributed state.

Shapes: B sequences in this micro-batch, T generated-token positions (right-padded).
Everything is computed in float32 whatever the model's dtype, so bf16 rounding of
log-probs does not leak into the ratio.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable

import torch

from grpo.config import LossSection as _L   # the flags' defaults, kept in one place


def group_advantages(rewards: torch.Tensor, group_size: int, scale: bool = True,
                     eps: float = 1e-4) -> torch.Tensor:
    """Group-normalised advantages, computed once per batch (TRL's convention).

    rewards: [N] with N = groups * group_size, groups contiguous. A = r - mean(group),
    divided by (std(group) + eps) when `scale` (std is the unbiased one, as torch and TRL use).
    A group whose rewards are all equal gets exactly zero advantage: it carries no signal. That
    is decided by comparing the rewards themselves (`has_signal`'s rule), not by the arithmetic:
    in float32 the mean of eight rewards of 1.2 is not 1.2, and scaling by (0 + eps) turned the
    rounding into an advantage of +1.19e-3 for every member.
    """
    grouped = rewards.double().view(-1, group_size)                        # [N/G, G]
    centred = grouped - grouped.mean(dim=1, keepdim=True)                  # [N/G, G]
    if scale:
        std = grouped.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(centred[:, :1])
        centred = centred / (std + eps)
    flat = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)            # [N/G, 1] no signal
    return centred.masked_fill(flat, 0.0).float().reshape(-1)              # [N]


def has_signal(rewards) -> bool:
    """Whether a group's rewards differ. If they are all equal, group_advantages gives every
    member zero advantage and the group teaches nothing: --filter-zero-signal (DAPO's dynamic
    sampling) drops it, at the sampler before its log-prob passes and again at the learner."""
    return len(set(rewards)) > 1


@dataclass
class TokenLoss:
    loss: torch.Tensor       # [B, T] per-token loss (zero where mask is 0)
    kl: torch.Tensor         # [B, T] k3 estimate of KL(policy || reference)
    ratio: torch.Tensor      # [B, T] pi / pi_base (base: the proximal policy, or the behaviour one)
    clipped: torch.Tensor    # [B, T] bool: the clipped branch was taken (no gradient through it)
    is_weight: torch.Tensor  # [B, T] behaviour importance weight pi_prox / pi_behav before any cap (1 without one)
    is_limited: torch.Tensor  # [B, T] bool: that weight was capped (tis_cap) or the token masked (is_mask)
    entropy: torch.Tensor    # [B, T] the policy's entropy at each token (zero without an entropy bonus)


KL_ESTIMATORS = ("k1", "k2", "k3")


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from sampled tokens (Schulman's k1/k2/k3).

    With d = ref - logp:  k1 = -d (unbiased, can be negative),  k2 = d^2 / 2,
    k3 = exp(d) - d - 1 (unbiased and always >= 0; the GRPO paper's choice).
    """
    d = ref_logp - logp
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return 0.5 * d * d
    if estimator == "k3":
        return torch.exp(d) - d - 1.0
    raise ValueError(f"unknown kl_estimator {estimator!r}; choose one of {', '.join(KL_ESTIMATORS)}")


def grpo_token_loss(logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor,
                    advantages: torch.Tensor, mask: torch.Tensor, epsilon: float = 0.2,
                    epsilon_high: float | None = None, beta: float = 0.0, kl_estimator: str = "k3",
                    dual_clip: float | None = None, prox_logp: torch.Tensor | None = None,
                    tis_cap: float | None = None,
                    is_mask: tuple[float, float] | None = None,
                    entropy: torch.Tensor | None = None, entropy_coef: float = 0.0) -> TokenLoss:
    """Per-token clipped surrogate plus a KL penalty, less an entropy bonus.

    logp      [B, T] log pi_theta(token) under the learner's current weights (has grad)
    old_logp  [B, T] log pi_behav(token): the behaviour policy that sampled it (sent by the sampler)
    ref_logp  [B, T] log pi_ref(token) from the frozen reference model
    advantages [B]  one advantage per sequence, broadcast over its tokens
    mask      [B, T] 1 for generated tokens, 0 for padding

    Without prox_logp (PPO around the behaviour policy, TRL's GRPO):
      loss_t = -min(r_t A, clip(r_t, 1 - eps, 1 + eps_high) A) + beta * kl_t,  r_t = exp(logp_t - behav_t).
    dual_clip c (> 1): for A < 0 the surrogate is also bounded below by c * A (dual-clip PPO), so
      one token with a huge ratio cannot dominate a negative-advantage update.
    With prox_logp [B, T] (the learner's own log-probs before this batch's first update, no
    grad), the decoupled objective (AReaL; Hilton et al.'s "batch size-invariance for policy
    optimization"): the trust region is around the proximal policy, r_t = exp(logp_t - prox_t),
    and the surrogate is weighted by the behaviour importance weight w_t = exp(prox_t - behav_t),
    which corrects for the samples being a few versions old. Then one of:
      tis_cap C: w_t is truncated at C (truncated importance sampling);
      is_mask (lo, hi): tokens with w_t outside [lo, hi] leave the surrogate term (prime-rl's
        masked importance sampling; AReaL's cap is (0, cap)), the rest keep their w_t.
    The clip acts only when the learner makes more than one update per batch
    (--ppo-minibatches): before the first update r_t is exactly 1.
    entropy [B, T] (has grad) with entropy_coef c > 0: loss_t -= c * H_t, the entropy of the
    policy's whole distribution at token t (verl's entropy_coeff): it pushes against a policy that
    settles on one answer, at the price of a biased objective.
    """
    eps_high = epsilon if not epsilon_high else epsilon_high
    m = mask.bool()
    zero = torch.zeros((), dtype=torch.float32, device=logp.device)
    # Padding can hold anything: zero it before exp() so it can never produce inf * 0 = nan.
    logp = torch.where(m, logp.float(), zero)                               # [B, T]
    behav = torch.where(m, old_logp.float(), zero)                          # [B, T]
    ref = torch.where(m, ref_logp.float(), zero)                            # [B, T]
    adv = advantages.float().unsqueeze(1)                                  # [B, 1]
    if (tis_cap is not None or is_mask is not None) and prox_logp is None:
        raise ValueError("tis_cap and is_mask need prox_logp, the learner's log-probs before the update")
    if prox_logp is None:
        base = behav
        w_raw = torch.ones_like(logp)                                      # [B, T]
    else:
        base = torch.where(m, prox_logp.detach().float(), zero)            # [B, T]
        w_raw = torch.exp(base - behav)                                    # [B, T], no grad
    weight, limited = w_raw, torch.zeros_like(m)                           # [B, T]
    if tis_cap is not None:
        limited = w_raw > tis_cap
        weight = torch.clamp(w_raw, max=tis_cap)
    if is_mask is not None:
        lo, hi = is_mask
        limited = (w_raw < lo) | (w_raw > hi)
        weight = w_raw.masked_fill(limited, 0.0)

    ratio = torch.exp(logp - base)                                         # [B, T]
    unclipped = ratio * adv                                                # [B, T]
    clipped = torch.clamp(ratio, 1.0 - epsilon, 1.0 + eps_high) * adv      # [B, T]
    surrogate = torch.minimum(unclipped, clipped)                          # [B, T]
    if dual_clip is not None:
        floor = dual_clip * adv                                            # [B, 1]
        surrogate = torch.where(adv < 0, torch.maximum(surrogate, floor), surrogate)
    kl = kl_estimate(logp, ref, kl_estimator)                              # [B, T]
    loss = -surrogate * weight + beta * kl                                 # [B, T]
    ent = torch.zeros_like(logp)                                           # [B, T]
    if entropy is not None and entropy_coef:
        ent = torch.where(m, entropy.float(), zero)                        # [B, T]
        loss = loss - entropy_coef * ent
    mf = m.float()
    return TokenLoss(loss=loss * mf, kl=kl * mf, ratio=ratio * mf,
                     clipped=(clipped < unclipped) & m, is_weight=w_raw * mf, is_limited=limited & m,
                     entropy=ent.detach() * mf)


@dataclass(frozen=True)
class Norms:
    """The global counts a micro-batch's share of the loss is normalised by (never its own: the
    batch is split over ranks and micro-batches unevenly, and the shares must add up exactly)."""
    total_sequences: int       # sequences in the whole step, all ranks
    total_tokens: int          # generated tokens in the whole step, all ranks
    max_new_tokens: int
    num_micro_batches: int = 1  # ranks x accumulation steps of the step


# A loss variant: how a micro-batch's per-token losses [B, T] become its share of the step's loss.
# One function of this signature and one entry (@loss_variant) make a new --loss-type.
LossVariant = Callable[[torch.Tensor, torch.Tensor, Norms], torch.Tensor]
LOSS_VARIANTS: dict[str, LossVariant] = {}


def loss_variant(name: str) -> Callable[[LossVariant], LossVariant]:
    def register(fn: LossVariant) -> LossVariant:
        LOSS_VARIANTS[name] = fn
        return fn
    return register


@loss_variant("grpo")
def grpo_reduce(token_loss: torch.Tensor, mask: torch.Tensor, n: Norms) -> torch.Tensor:
    """sum_i (sum_t l_it / n_i) / total_sequences: the mean per sequence, then over sequences."""
    per_seq = token_loss.sum(dim=1) / mask.float().sum(dim=1).clamp(min=1.0)    # [B]
    return per_seq.sum() / n.total_sequences


@loss_variant("dapo")
def dapo_reduce(token_loss: torch.Tensor, mask: torch.Tensor, n: Norms) -> torch.Tensor:
    """sum_it l_it / total_tokens: the mean over every token of the step."""
    return token_loss.sum() / max(n.total_tokens, 1)


@loss_variant("dr_grpo")
def dr_grpo_reduce(token_loss: torch.Tensor, mask: torch.Tensor, n: Norms) -> torch.Tensor:
    """sum_it l_it / (total_sequences * max_new_tokens): a constant normaliser (Dr. GRPO)."""
    return token_loss.sum() / (n.total_sequences * n.max_new_tokens)


@loss_variant("bnpo")
def bnpo_reduce(token_loss: torch.Tensor, mask: torch.Tensor, n: Norms) -> torch.Tensor:
    """(sum_it l_it / tokens in this micro-batch) / num_micro_batches: TRL's bnpo, a token mean per
    local batch, then the mean over the ranks x accumulation steps of the step."""
    return token_loss.sum() / mask.float().sum().clamp(min=1.0) / n.num_micro_batches


LOSS_TYPES = tuple(LOSS_VARIANTS)


def reduce_loss(token_loss: torch.Tensor, mask: torch.Tensor, loss_type: str,
                total_sequences: int, total_tokens: int, max_new_tokens: int,
                num_micro_batches: int = 1) -> torch.Tensor:
    """This micro-batch's share of the global loss by the variant `loss_type` (LOSS_VARIANTS)."""
    if loss_type not in LOSS_VARIANTS:
        raise ValueError(f"unknown loss_type {loss_type!r}; choose one of {', '.join(LOSS_VARIANTS)}")
    return LOSS_VARIANTS[loss_type](token_loss, mask, Norms(total_sequences, total_tokens, max_new_tokens,
                                                            num_micro_batches))


@dataclass(frozen=True)
class LossConfig:
    """The objective's settings; each field is the learner's flag of the same name, with its default
    (grpo.config.LearnerConfig documents them). LossConfig.of(learner_config) takes a run's."""
    loss_type: str = _L.loss_type
    epsilon: float = _L.epsilon
    epsilon_high: float = _L.epsilon_high
    beta: float = _L.beta
    kl_estimator: str = _L.kl_estimator
    dual_clip: float = _L.dual_clip
    tis_cap: float = _L.tis_cap
    is_mask_low: float = _L.is_mask_low
    is_mask_high: float = _L.is_mask_high
    entropy_coef: float = _L.entropy_coef

    @classmethod
    def of(cls, cfg) -> "LossConfig":
        return cls(**{f.name: getattr(cfg.loss, f.name) for f in fields(cls)})

    def check(self) -> None:
        """Bad settings as one line naming the flag and the fix."""
        if self.loss_type not in LOSS_VARIANTS:
            raise ValueError(f"--loss-type {self.loss_type}: choose one of {', '.join(LOSS_VARIANTS)}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"--kl-estimator {self.kl_estimator}: choose one of {', '.join(KL_ESTIMATORS)}")
        if self.dual_clip and self.dual_clip <= 1.0:
            raise ValueError(f"--dual-clip {self.dual_clip}: must be > 1 (typically 3), or 0 to turn it off")
        if self.tis_cap < 0:
            raise ValueError(f"--tis-cap {self.tis_cap}: must be > 0 (typically 2), or 0 to turn it off")
        if self.is_mask_high and not 0 <= self.is_mask_low < 1 < self.is_mask_high:
            raise ValueError(f"--is-mask-low {self.is_mask_low} --is-mask-high {self.is_mask_high}: need "
                             f"0 <= low < 1 < high (prime-rl uses 0.125 and 8), or --is-mask-high 0 to turn it off")
        if self.is_mask_low and not self.is_mask_high:
            raise ValueError(f"--is-mask-low {self.is_mask_low} needs --is-mask-high (e.g. 8)")


def compute_loss(logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor, advantages: torch.Tensor,
                 mask: torch.Tensor, cfg: LossConfig, norms: Norms, prox_logp: torch.Tensor | None = None,
                 entropy: torch.Tensor | None = None) -> tuple[torch.Tensor, TokenLoss]:
    """(this micro-batch's share of the step's loss, its per-token figures): the per-token objective
    (grpo_token_loss, shapes there) by `cfg`, reduced by its variant. The importance weight is
    masked (is_mask) when --is-mask-high is set, else truncated at --tis-cap; both need prox_logp."""
    masked = bool(cfg.is_mask_high)
    tl = grpo_token_loss(logp, old_logp, ref_logp, advantages, mask, cfg.epsilon, cfg.epsilon_high, cfg.beta,
                         kl_estimator=cfg.kl_estimator, dual_clip=cfg.dual_clip or None, prox_logp=prox_logp,
                         tis_cap=None if masked else (cfg.tis_cap or None),
                         is_mask=(cfg.is_mask_low, cfg.is_mask_high) if masked else None,
                         entropy=entropy, entropy_coef=cfg.entropy_coef)
    return LOSS_VARIANTS[cfg.loss_type](tl.loss, mask, norms), tl
