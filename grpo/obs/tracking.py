"""Experiment tracking: each learner step record also goes to TensorBoard and/or Weights & Biases.

metrics.jsonl stays the source of truth; this module only mirrors it. TensorBoard event
files are written into the run directory itself (``tensorboard --logdir runs/``), with
tags grouped by section (``reward/``, ``train/``, ``completions/``, ``time/``, ``perf/``,
``groups/``, ``samplers/``, ``gpu/``). wandb is optional and imported only when asked for.
"""
from __future__ import annotations

import logging
import math
from pathlib import Path

log = logging.getLogger(__name__)

BACKENDS = ("tensorboard", "wandb", "none")

# Top-level record keys -> TensorBoard section; keys not listed go to "misc/".
SECTIONS = {
    "reward_mean": "reward", "reward_std": "reward", "accuracy": "reward",
    "loss": "train", "kl": "train", "clip_frac": "train", "ratio_mean": "train", "grad_norm": "train",
    "entropy": "train", "policy_entropy": "train", "tokens": "train", "sequences": "train", "policy_version": "train",
    "completion_len_mean": "completions", "completion_len_min": "completions",
    "completion_len_max": "completions", "truncated_frac": "completions",
    "staleness_mean": "time", "staleness_max": "time",
    "step_time_s": "time", "data_wait_s": "time", "train_s": "time", "sync_publish_s": "time", "time_s": "time",
    "samples_per_s": "perf", "tokens_per_s": "perf", "sync_bytes_served": "perf", "data_bytes_received": "perf",
}
# Nested records -> the tag prefix of their leaves (e.g. groups/dropped/stale, samplers/version/0).
NESTED = {"groups": "groups", "sampler_versions": "samplers/version", "gpu": "gpu",
          "reward_components": "reward/component"}
SKIP = {"step", "final"}


def parse_report_to(text: str) -> list[str]:
    """--report-to to a list of backends; a typo is a ValueError naming the choices."""
    items = [t.strip().lower() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in BACKENDS]
    if bad:
        raise ValueError(f"--report-to {text}: unknown {', '.join(bad)}; choose from tensorboard, wandb, none "
                         "(comma-separated)")
    return [] if not items or "none" in items else items


def flatten(record: dict) -> dict[str, float]:
    """Numeric leaves of a step record as 'section/key[/subkey...]' -> float (bools and None left out)."""
    out: dict[str, float] = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}/{k}", v)
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[prefix] = float(value)

    for key, value in record.items():
        if key in SKIP:
            continue
        walk(NESTED[key] if key in NESTED else f"{SECTIONS.get(key, 'misc')}/{key}", value)
    return out


class Tracker:
    """Mirrors step records to the chosen backends; a no-op with none."""

    def __init__(self, run_dir: Path, report_to: str, config: dict | None = None):
        self.backends = parse_report_to(report_to)
        self._tb = None
        self._wandb = None
        if "tensorboard" in self.backends:
            from torch.utils.tensorboard import SummaryWriter  # here: torch's TensorBoard writer only with --report-to tensorboard

            self._tb = SummaryWriter(log_dir=str(run_dir), flush_secs=10)
        if "wandb" in self.backends:
            try:
                import wandb  # here: wandb is optional (the except below)
            except ImportError:
                log.warning("--report-to wandb: the wandb package is not installed (pip install wandb); "
                            "not logging to wandb")
            else:
                self._wandb = wandb.init(project="grpo", name=run_dir.name, dir=str(run_dir), config=config or {})

    def log(self, record: dict, step: int) -> None:
        scalars = flatten(record)
        if self._tb is not None:
            for tag, value in scalars.items():
                self._tb.add_scalar(tag, value, global_step=step)
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


