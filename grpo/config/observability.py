"""The observability section: logs, metrics, profiles."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ObservabilitySection:
    """Where each process logs, and what it records."""

    section = "observability"

    log_file: str = ""
    """Also write this process's log here (the launcher captures stderr instead)."""
    profile_steps: str = ""
    """Profile learner steps A-B (e.g. 20-21) and each sampler's making of its chunks A-B (a step's groups); empty: off."""


@dataclass
class LearnerObservabilitySection:
    """Where the learner's step metrics also go."""

    section = "observability"

    report_to: str = "tensorboard"
    """Where rank 0 also logs each step: 'tensorboard', 'wandb', both comma-separated, or 'none'."""
