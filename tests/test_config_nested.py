"""Sections nested in code (cfg.rollout.in_flight_rows), flat for users: flags, YAML keys (or a
section's mapping) and the run folder's config JSON."""
import pytest

from grpo.config import LaunchConfig, LearnerConfig, SamplerConfig, flat, flat_fields, from_flat
from grpo.flags import parse_config


def test_flat_and_from_flat_invert_each_other():
    for cls in (SamplerConfig, LearnerConfig, LaunchConfig):
        cfg = cls()
        assert from_flat(cls, flat(cfg)) == cfg
        assert list(flat(cfg)) == list(flat_fields(cls))
    cfg = from_flat(SamplerConfig, in_flight_rows=8, seed=3)
    assert (cfg.rollout.in_flight_rows, cfg.run.seed) == (8, 3)
    with pytest.raises(TypeError, match="no field 'beta'"):
        from_flat(SamplerConfig, beta=0.1)   # the learner's, not the sampler's


def test_a_config_file_takes_flat_keys_or_a_sections_mapping(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text("rollout: {in_flight_rows: 16, num-generations: 4}\nseed: 7\ninstances: 1\n"
                    "weight_sync: tcp\nloss:\n  beta: 0.5\n")
    s = parse_config(SamplerConfig, ["--config", str(path)], "prog")
    assert (s.rollout.in_flight_rows, s.rollout.num_generations, s.run.seed) == (16, 4, 7)
    assert s.weight_sync.weight_sync == "tcp"
    assert parse_config(LearnerConfig, ["--config", str(path)], "prog").loss.beta == 0.5
    path.write_text("rollout: {beta: 0.5}\n")
    with pytest.raises(SystemExit):
        parse_config(SamplerConfig, ["--config", str(path)], "prog")
    assert "rollout: no key 'beta' in this section" in capsys.readouterr().err
