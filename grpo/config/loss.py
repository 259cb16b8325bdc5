"""The loss section: the objective the learner minimises (grpo.loss acts on it)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

LossType = Literal["grpo", "dapo", "dr_grpo", "bnpo"]
KlEstimator = Literal["k1", "k2", "k3"]


@dataclass
class LossSection:
    """The objective, its clip, its penalties and which tokens it counts."""

    section = "loss"

    loss_type: LossType = "grpo"
    """'grpo' (mean per sequence, then over sequences), 'dapo' (mean over all tokens of the step), 'dr_grpo' (sum / (B * max_new_tokens)) or 'bnpo' (token mean per micro-batch)."""
    beta: float = 0.04
    """Weight of the k3 KL penalty to the reference model."""
    kl_estimator: KlEstimator = "k3"
    """Estimator of KL(policy || reference) per token: k1, k2 or k3."""
    epsilon: float = 0.2
    """PPO clip range: ratios are clipped to [1 - epsilon, 1 + epsilon_high]."""
    epsilon_high: float = 0.0
    """Upper clip (0: same as epsilon)."""
    dual_clip: float = 0.0
    """Dual-clip constant c > 1 bounding the loss of negative-advantage tokens at -c * A (0: off)."""
    tis_cap: float = 2.0
    """Off-policy correction (decoupled objective): the clip is around the learner's own log-probs before the step's first update, and each token is weighted by min(pi_learner / pi_behaviour, cap) (0: off, PPO's clip around the behaviour log-probs, as TRL does; why 2: docs/configuration.md)."""
    is_mask_low: float = 0.0
    """With --is-mask-high: tokens whose importance weight pi_learner / pi_behaviour is below this leave the loss (prime-rl's masked importance sampling)."""
    is_mask_high: float = 0.0
    """Off-policy correction (decoupled objective, like --tis-cap): tokens whose importance weight pi_learner / pi_behaviour is above this leave the loss, the rest keep their weight (0: off; AReaL's cap is --is-mask-high C alone). It replaces --tis-cap."""
    entropy_coef: float = 0.0
    """Entropy bonus: the loss less this times the mean entropy of the policy's whole distribution over the generated tokens (verl's entropy_coeff; 0: off). Against a policy that settles on one answer for every question; costs a softmax over the vocabulary per token in the learner's pass."""
    scale_rewards: bool = True
    """Divide group advantages by the group's reward std (off: Dr. GRPO)."""
    filter_zero_signal: bool = False
    """Drop groups whose rewards are all equal (zero advantage; DAPO dynamic sampling), counted as zero_signal."""
    mask_truncated: bool = False
    """Exclude completions cut at --max-new-tokens (no EOS) from the loss."""
