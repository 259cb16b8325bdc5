"""The data and rewards section: the problems, how completions are scored, the curriculum."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from grpo.config.bounds import at_least, positive
from grpo.config.constants import DEFAULT_DATASET

FormatStyle = Literal["auto", "gsm8k", "think"]


@dataclass
class DataSection:
    """The data set both roles read."""

    section = "data and rewards"

    dataset: str = DEFAULT_DATASET
    """'openai/gsm8k', a data file, a folder of train.jsonl/test.jsonl, or rg:<task> (settings, mixtures: docs/data-and-rewards.md)."""
    curriculum: bool = False
    """Adaptive curriculum over rg: tasks: levels follow recent success rates."""
    curriculum_window: int = at_least(1, 20)
    """Groups per task at its level that the success rate counts."""


@dataclass
class SamplerDataSection:
    """How a sampler reads problems and scores completions."""

    section = "data and rewards"

    dataset_limit: int = at_least(0, 0, "0: all")
    """Use only the first N problems (0: all)."""
    reward: str = "correctness"
    """Reward(s), comma-separated, each optionally NAME=WEIGHT: correctness, format, overlong, code, or module:function."""
    reward_weights: str = ""
    """Comma-separated weights of the --reward entries (1 each)."""
    format_style: FormatStyle = "auto"
    """Answer form the format reward wants (auto: by data)."""
    overlong_buffer: int = at_least(0, 64)
    """Overlong reward (DAPO): a linear penalty to -1 over the last this many tokens before --max-new-tokens."""
    code_timeout_s: float = positive(5.0)
    """Code reward: time limit per test run, seconds."""
    code_memory_mb: int = at_least(1, 1024)
    """Code reward: test memory limit, MiB."""
    code_workers: int = at_least(1, 4)
    """Code reward: test processes at the same time."""
    dataset_transform: str = ""
    """module:function: fn(row) -> row dict, or None to drop it."""


@dataclass
class LearnerDataSection:
    """When the learner moves a task's curriculum level."""

    section = "data and rewards"

    curriculum_low: float = 0.1
    """--curriculum lowers a level when success is below this."""
    curriculum_high: float = 0.7
    """--curriculum raises a level when success is above this."""
