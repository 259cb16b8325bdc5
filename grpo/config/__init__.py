"""Typed configuration: every default lives here, in sections (grpo.config.sections).

Each section is a module of dataclasses (grpo/config/rollout.py, loss.py, ...); a role's config is
made of the sections it reads, one object each, so a field is read as `cfg.section.name`
(``cfg.rollout.in_flight_rows``; the attribute per section: grpo.config.sections.ATTRS). A choice
among a fixed set is a Literal declared beside its field, in its section; a numeric range is declared there too (grpo.config.bounds: ``at_least(2, 8)``).
Command-line flags are derived from the dataclass fields (``--field-name``) by grpo.flags, and
the help text of each flag is the docstring written under the field, as in cleanrl's ``Args``;
--help groups them by section; flags, YAML keys and a run's config JSON stay flat (sections.flat).
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
from grpo.config.sections import ATTRS, SECTIONS, field_sections, flat, flat_fields, from_flat
from grpo.config.training import (ASSUMED_PROMPT_TOKENS, DEEPSPEED, PRECISIONS, LaunchTrainingSection, Precision,
                                  TrainingSection, assumed_row_tokens, micro_token_budget, resolve_precision)
from grpo.config.weight_sync import (LearnerWeightSyncSection, SamplerWeightSyncSection, WeightSync,
                                     WeightSyncSection)

# A role's section that merges the part every role shares with the role's own: a dataclass collects
# its fields from its bases last to first, so the shared fields come first, as --help lists them.


@dataclass
class SamplerRun(SamplerRunSection, RunSection):
    """The sampler's run section."""


@dataclass
class SamplerRollout(SamplerRolloutSection, RolloutSection):
    """The sampler's rollout section."""


@dataclass
class SamplerData(SamplerDataSection, DataSection):
    """The sampler's data and rewards section."""


@dataclass
class SamplerWeightSync(SamplerWeightSyncSection, WeightSyncSection):
    """The sampler's weight sync section."""


@dataclass
class SamplerFaults(SamplerFaultsSection, FaultsSection):
    """The sampler's faults and security section."""


@dataclass
class LearnerRun(LearnerRunSection, RunSection):
    """The learner's run section."""


@dataclass
class LearnerData(LearnerDataSection, DataSection):
    """The learner's data and rewards section."""


@dataclass
class LearnerWeightSync(LearnerWeightSyncSection, WeightSyncSection):
    """The learner's weight sync section."""


@dataclass
class LearnerFaults(LearnerFaultsSection, FaultsSection):
    """The learner's faults and security section."""


@dataclass
class LearnerObservability(LearnerObservabilitySection, ObservabilitySection):
    """The learner's observability section."""


def _part(kind: type):
    return field(default_factory=kind)


# Each role holds one object per section, in SECTIONS's order; the attribute is sections.ATTRS's.
@dataclass
class CommonConfig:
    """Options every process shares."""

    run: RunSection = _part(RunSection)
    rollout: RolloutSection = _part(RolloutSection)
    data: DataSection = _part(DataSection)
    weight_sync: WeightSyncSection = _part(WeightSyncSection)
    faults: FaultsSection = _part(FaultsSection)
    evaluation: EvaluationSection = _part(EvaluationSection)
    observability: ObservabilitySection = _part(ObservabilitySection)


@dataclass
class SamplerConfig:
    """The sampler: generates, scores, computes behaviour and reference log-probs, sends groups."""

    run: SamplerRun = _part(SamplerRun)
    rollout: SamplerRollout = _part(SamplerRollout)
    data: SamplerData = _part(SamplerData)
    weight_sync: SamplerWeightSync = _part(SamplerWeightSync)
    faults: SamplerFaults = _part(SamplerFaults)
    evaluation: EvaluationSection = _part(EvaluationSection)
    observability: ObservabilitySection = _part(ObservabilitySection)


@dataclass
class LearnerConfig:
    """The learner: a DeepSpeed ZeRO-2 group (or one plain PyTorch process) that trains on groups."""

    run: LearnerRun = _part(LearnerRun)
    rollout: RolloutSection = _part(RolloutSection)
    data: LearnerData = _part(LearnerData)
    loss: LossSection = _part(LossSection)
    training: TrainingSection = _part(TrainingSection)
    weight_sync: LearnerWeightSync = _part(LearnerWeightSync)
    faults: LearnerFaults = _part(LearnerFaults)
    checkpoints: CheckpointSection = _part(CheckpointSection)
    evaluation: EvaluationSection = _part(EvaluationSection)
    observability: LearnerObservability = _part(LearnerObservability)


@dataclass
class LaunchConfig:
    """run_distributed.py: starts the learner group and the samplers, supervises them."""

    run: RunSection = _part(RunSection)
    rollout: RolloutSection = _part(RolloutSection)
    data: DataSection = _part(DataSection)
    training: LaunchTrainingSection = _part(LaunchTrainingSection)
    weight_sync: WeightSyncSection = _part(WeightSyncSection)
    faults: FaultsSection = _part(FaultsSection)
    evaluation: EvaluationSection = _part(EvaluationSection)
    observability: ObservabilitySection = _part(ObservabilitySection)
    placement: PlacementSection = _part(PlacementSection)
    supervision: SupervisionSection = _part(SupervisionSection)
    instances: InstancesSection = _part(InstancesSection)
    nodes: NodesSection = _part(NodesSection)
    extra: list[str] = field(default_factory=list)
    """(internal) flags passed through to every worker."""


# What `from grpo.config import X` offers: the sections' names re-exported, and the role configs.
# Written out (not computed from dir()) so that a linter sees the re-exports as meant.
__all__ = [
    "ALLOC_DEFAULT", "ALLOC_ENV", "ALLOC_ENVS", "ASSUMED_PROMPT_TOKENS", "ATTRS", "CheckpointSection", "CommonConfig",
    "DATA_PORT", "DEEPSPEED", "DEFAULT_DATASET", "DEFAULT_MODEL", "DataSection", "Device", "EvalConfig",
    "EvaluationSection", "FaultsSection", "FormatStyle", "GenerationBackend", "InstancesSection", "KlEstimator",
    "LaunchConfig", "LaunchTrainingSection", "LearnerConfig", "LearnerDataSection", "LearnerFaultsSection",
    "LearnerObservabilitySection", "LearnerRunSection", "LearnerWeightSyncSection", "LossSection", "LossType",
    "MASTER_PORT", "NodesSection", "ObservabilitySection", "OldLogprobs", "OnFull", "PRECISIONS",
    "PlacementSection", "Precision", "ROW_BUCKETS", "RolloutSection", "RunSection", "SECTIONS", "SYNC_PORT",
    "SamplerConfig", "SamplerDataSection", "SamplerFaultsSection", "SamplerRolloutSection", "SamplerRunSection",
    "SamplerWeightSyncSection", "SupervisionSection", "TrainingSection", "WeightSync", "WeightSyncSection",
    "allocator_conf", "assumed_row_tokens", "expandable_segments", "field_sections", "flat", "flat_fields",
    "from_flat", "micro_token_budget", "resolve_precision", "use_allocator_default",
    "LearnerData", "LearnerFaults", "LearnerObservability", "LearnerRun", "LearnerWeightSync", "SamplerData",
    "SamplerFaults", "SamplerRollout", "SamplerRun", "SamplerWeightSync",
]
