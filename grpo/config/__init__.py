"""Typed configuration: every default lives here, in sections (grpo.config.sections).

Each section is a module of dataclasses (grpo/config/rollout.py, loss.py, ...); a role's config is
composed of the sections it reads, by inheritance, so a field is read as `cfg.name` wherever it is
declared. A choice among a fixed set is a Literal declared beside its field, in its section; a
numeric range is declared there too (grpo.config.bounds: ``at_least(2, 8)``).
Command-line flags are derived from the dataclass fields (``--field-name``) by grpo.flags, and
the help text of each flag is the docstring written under the field, as in cleanrl's ``Args``;
--help groups them by section.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from grpo.config.allocator import (ALLOC_DEFAULT, ALLOC_ENV, ALLOC_ENVS, allocator_conf, expandable_segments,
                                   use_allocator_default)
from grpo.config.checkpoints import CheckpointSection
from grpo.config.constants import DATA_PORT, DEFAULT_DATASET, DEFAULT_MODEL, MASTER_PORT, ROW_BUCKETS, SYNC_PORT
from grpo.config.data import DataSection, FormatStyle, LearnerDataSection, SamplerDataSection
from grpo.config.evaluation import EvalConfig, EvaluationSection
from grpo.config.faults import FaultsSection, LearnerFaultsSection, OnFull, SamplerFaultsSection
from grpo.config.launch import InstancesSection, NodesSection, PlacementSection, SupervisionSection
from grpo.config.loss import KlEstimator, LossSection, LossType
from grpo.config.observability import LearnerObservabilitySection, ObservabilitySection
from grpo.config.rollout import GenerationBackend, OldLogprobs, RolloutSection, SamplerRolloutSection
from grpo.config.run import Device, LearnerRunSection, RunSection, SamplerRunSection
from grpo.config.sections import SECTIONS, field_sections
from grpo.config.training import (ASSUMED_PROMPT_TOKENS, DEEPSPEED, PRECISIONS, LaunchTrainingSection, Precision,
                                  TrainingSection, assumed_row_tokens, micro_token_budget, resolve_precision)
from grpo.config.weight_sync import (LearnerWeightSyncSection, SamplerWeightSyncSection, WeightSync,
                                     WeightSyncSection)

# A dataclass collects its fields from its bases last to first: each role lists its sections in
# the reverse of the order its fields (and to_flags's flags) come in.


@dataclass
class CommonConfig(ObservabilitySection, EvaluationSection, FaultsSection, WeightSyncSection, DataSection,
                   RolloutSection, RunSection):
    """Options every process shares."""


@dataclass
class SamplerConfig(SamplerFaultsSection, SamplerWeightSyncSection, SamplerRolloutSection, SamplerDataSection,
                    SamplerRunSection, CommonConfig):
    """The sampler: generates, scores, computes behaviour and reference log-probs, sends groups."""


@dataclass
class LearnerConfig(CheckpointSection, LearnerFaultsSection, LearnerObservabilitySection, LearnerWeightSyncSection,
                    LearnerDataSection, LossSection, TrainingSection, LearnerRunSection, CommonConfig):
    """The learner: a DeepSpeed ZeRO-2 group (or one plain PyTorch process) that trains on groups."""


@dataclass
class LaunchConfig(NodesSection, InstancesSection, SupervisionSection, LaunchTrainingSection, PlacementSection,
                   CommonConfig):
    """run_distributed.py: starts the learner group and the samplers, supervises them."""

    extra: list[str] = field(default_factory=list)
    """(internal) flags passed through to every worker."""


# What `from grpo.config import X` offers: the sections' names re-exported, and the role configs.
# Written out (not computed from dir()) so that a linter sees the re-exports as meant.
__all__ = [
    "ALLOC_DEFAULT", "ALLOC_ENV", "ALLOC_ENVS", "ASSUMED_PROMPT_TOKENS", "CheckpointSection", "CommonConfig",
    "DATA_PORT", "DEEPSPEED", "DEFAULT_DATASET", "DEFAULT_MODEL", "DataSection", "Device", "EvalConfig",
    "EvaluationSection", "FaultsSection", "FormatStyle", "GenerationBackend", "InstancesSection", "KlEstimator",
    "LaunchConfig", "LaunchTrainingSection", "LearnerConfig", "LearnerDataSection", "LearnerFaultsSection",
    "LearnerObservabilitySection", "LearnerRunSection", "LearnerWeightSyncSection", "LossSection", "LossType",
    "MASTER_PORT", "NodesSection", "ObservabilitySection", "OldLogprobs", "OnFull", "PRECISIONS",
    "PlacementSection", "Precision", "ROW_BUCKETS", "RolloutSection", "RunSection", "SECTIONS", "SYNC_PORT",
    "SamplerConfig", "SamplerDataSection", "SamplerFaultsSection", "SamplerRolloutSection", "SamplerRunSection",
    "SamplerWeightSyncSection", "SupervisionSection", "TrainingSection", "WeightSync", "WeightSyncSection",
    "allocator_conf", "assumed_row_tokens", "expandable_segments", "field_sections", "micro_token_budget",
    "resolve_precision", "use_allocator_default",
]
