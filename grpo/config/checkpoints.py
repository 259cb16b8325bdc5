"""The checkpoints section: what the learner saves, how many it keeps, and resuming (grpo/learner/checkpoint.py)."""
from __future__ import annotations

from dataclasses import dataclass

from grpo.config.bounds import at_least


@dataclass
class CheckpointSection:
    """Saving, keeping and resuming the learner's state."""

    section = "checkpoints"

    save_every: int = at_least(0, 1000, "0: only at the end")
    """Save a checkpoint (DeepSpeed or PyTorch state, Hugging Face policy, RNG, step) every N steps and at the end (0: only at the end)."""
    save_weights_every_s: float = 0.0
    """Also save the policy's Hugging Face weights alone (no optimizer state) to <run_dir>/weights/step_N/ every this many seconds of wall time since the learner started, and after the last step (0: off); bench/benchmark.py scores every one."""
    save_weights_schedule: str = ""
    """With --save-weights-every-s: save on a schedule of periods instead, 'PxN,...,P' (every P seconds N times, ..., then every P to the end), e.g. '15x8,30': every 15 s for the first 2 minutes, then every 30 s. Empty: every --save-weights-every-s seconds."""
    keep_checkpoints: int = at_least(0, 3, "0: keep all")
    """Keep only the newest K checkpoints under <run_dir>/checkpoints (0: keep all)."""
    resume: str = ""
    """Resume from a checkpoint: 'latest' (newest under --run-dir), a checkpoints/step_N folder, or a run directory."""
