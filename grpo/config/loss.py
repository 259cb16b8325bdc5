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
    """Reduction: 'grpo' (mean per sequence), 'dapo' (token mean of the step), 'dr_grpo' (sum / (B x max tokens)), 'bnpo' (per micro-batch)."""
    beta: float = 0.04
    """Weight of the k3 KL penalty to the reference model."""
    kl_estimator: KlEstimator = "k3"
    """Estimator of KL(policy || reference) per token."""
    epsilon: float = 0.2
    """Clip the ratio to [1 - epsilon, 1 + epsilon_high] (PPO)."""
    epsilon_high: float = 0.0
    """Upper clip (0: same as epsilon)."""
    dual_clip: float = 0.0
    """Dual-clip c > 1: bound loss at -c*A when A < 0 (0: off)."""
    tis_cap: float = 2.0
    """Off-policy correction: clip around the learner's pre-update policy, weight tokens by min(pi_learner / pi_behaviour, cap) (0: off)."""
    is_mask_low: float = 0.0
    """With --is-mask-high: mask tokens weighted below this."""
    is_mask_high: float = 0.0
    """Instead of --tis-cap: tokens whose weight pi_learner / pi_behaviour is above this leave the loss (0: off)."""
    entropy_coef: float = 0.0
    """Entropy bonus weight over generated tokens (0: off)."""
    scale_rewards: bool = True
    """Divide advantages by their group's std (off: Dr. GRPO)."""
    filter_zero_signal: bool = False
    """Drop groups whose rewards are all equal (zero advantage; DAPO dynamic sampling), counted as zero_signal."""
    mask_truncated: bool = False
    """Leave truncated completions (no EOS) out of the loss."""
