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
    """'openai/gsm8k', a folder with train.jsonl/test.jsonl, or reasoning-gym tasks: rg:<task>, rg:<task>:<key>=<value>,... (the task's own settings), rg:<task>@<weight>+<task>... (a weighted mixture); see docs/data-and-rewards.md. The learner reads it for --curriculum and its evaluation."""
    curriculum: bool = False
    """Adaptive curriculum over the rg: tasks of --dataset (reasoning-gym's curriculum classes): each task starts at level 0; the learner raises its level when the samplers' success rate over its last --curriculum-window groups is above --curriculum-high, lowers it below --curriculum-low, and tells the samplers."""
    curriculum_window: int = at_least(1, 20)
    """Groups per task (at its current level, before any zero-signal filter) that the success rate is counted over."""


@dataclass
class SamplerDataSection:
    """How a sampler reads problems and scores completions."""

    section = "data and rewards"

    dataset_limit: int = at_least(0, 0, "0: all")
    """Use only the first N problems (0: all)."""
    reward: str = "correctness"
    """Reward function(s), comma-separated, each optionally NAME=WEIGHT: built-ins correctness, format, overlong, code, or module:function with TRL's signature fn(prompts, completions, **columns) -> list[float]."""
    reward_weights: str = ""
    """Comma-separated weights, one per --reward entry (instead of NAME=WEIGHT; default 1 each)."""
    format_style: FormatStyle = "auto"
    """Answer form the format reward wants: 'gsm8k' (a final '#### <number>' line), 'think' ('<think>...</think>' then the answer), or 'auto' (gsm8k for question/answer and rg: data, think otherwise)."""
    overlong_buffer: int = at_least(0, 64)
    """The overlong reward (DAPO): completions longer than max_new_tokens minus this many tokens get a linear penalty down to -1."""
    code_timeout_s: float = positive(5.0)
    """The code reward: wall-time limit per completion's test run, in seconds."""
    code_memory_mb: int = at_least(1, 1024)
    """The code reward: address-space limit of the test process, in MiB."""
    code_workers: int = at_least(1, 4)
    """The code reward: test processes run at the same time."""
    dataset_transform: str = ""
    """module:function applied to every raw dataset row: fn(row: dict) -> dict (question/answer, prompt, instruction/response or input/output columns) or None to drop the row."""


@dataclass
class LearnerDataSection:
    """When the learner moves a task's curriculum level."""

    section = "data and rewards"

    curriculum_low: float = 0.1
    """--curriculum: lower a task's level when its success rate is below this."""
    curriculum_high: float = 0.7
    """--curriculum: raise a task's level when its success rate is above this."""
