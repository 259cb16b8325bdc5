"""Every option that takes one of a fixed set declares the set beside its field (a Literal in
grpo.config); the parser offers exactly it, a YAML file is held to it, and the modules that act
on a choice know the same set."""
import typing

import pytest

from grpo import config
from grpo.flags import ConfigFileError, _coerce, parse_config


def test_the_modules_know_the_same_choices_as_the_fields():
    from grpo.generate.backend import BACKENDS, OLD_LOGPROBS
    from grpo.loss import KL_ESTIMATORS, LOSS_VARIANTS
    from grpo.sampler.heartbeat import ON_FULL
    from grpo.weights.methods import METHODS

    args = typing.get_args
    assert tuple(LOSS_VARIANTS) == args(config.LossType)   # the registry, in its order
    assert tuple(KL_ESTIMATORS) == args(config.KlEstimator)
    assert tuple(BACKENDS) == args(config.GenerationBackend)
    assert tuple(OLD_LOGPROBS) == args(config.OldLogprobs)
    assert tuple(ON_FULL) == args(config.OnFull)
    assert set(METHODS) == set(args(config.WeightSync))
    assert config.PRECISIONS == args(config.Precision)


@pytest.mark.parametrize("cls,flag,good,bad", [
    (config.LearnerConfig, "--loss-type", "dr_grpo", "ppo"),
    (config.LearnerConfig, "--precision", "fp32", "half"),
    (config.SamplerConfig, "--on-full", "drop", "spill"),
    (config.SamplerConfig, "--weight-sync", "tcp", "rdma"),
])
def test_a_choice_is_taken_or_refused_at_parse_time(cls, flag, good, bad, capsys):
    cfg = parse_config(cls, [flag, good], "prog")
    assert config.flat(cfg)[flag[2:].replace("-", "_")] == good
    with pytest.raises(SystemExit) as e:
        parse_config(cls, [flag, bad], "prog")
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"invalid choice: '{bad}'" in err[0] and flag in err[0]


def test_a_config_file_is_held_to_the_choices():
    assert _coerce("loss_type", "bnpo", config.LossType, "run.yaml") == "bnpo"
    with pytest.raises(ConfigFileError, match="run.yaml: loss_type: 'ppo' is not one of grpo, dapo, dr_grpo, bnpo"):
        _coerce("loss_type", "ppo", config.LossType, "run.yaml")
