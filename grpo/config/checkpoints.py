"""The checkpoints section: what the learner saves, how many it keeps, and resuming (grpo/learner/checkpoint.py)."""
from __future__ import annotations

from dataclasses import dataclass

from grpo.config.bounds import at_least


@dataclass
class CheckpointSection:
    """Saving, keeping and resuming the learner's state."""

    section = "checkpoints"

    save_every: int = at_least(0, 1000, "0: only at the end")
    """Save a checkpoint every N steps and at the end (0: only at the end)."""
    save_weights_every_s: float = 0.0
    """Save the policy weights alone every S seconds (0: off)."""
    save_weights_schedule: str = ""
    """With --save-weights-every-s S: periods 'PxN,...,P' (P seconds N times, ..., then every P), e.g. '15x8,30' (empty: every S)."""
    keep_checkpoints: int = at_least(0, 3, "0: keep all")
    """Newest checkpoints to keep (0: all)."""
    resume: str = ""
    """'latest' (under --run-dir), a step_N folder, or a run dir."""
