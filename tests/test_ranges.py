"""Numeric options with a range declare it beside their field (grpo.config.bounds); the flag parser
and --config files refuse a value outside it in one line with exit code 2, the launcher before any
process starts, and every default lies inside its own range."""
import subprocess
import sys
from pathlib import Path

import pytest

from grpo import config
from grpo.config.bounds import Bounds, bounds_of
from grpo.flags import ConfigFileError, load_config_file, parse_config

ROOT = Path(__file__).resolve().parents[1]


def test_bounds_worked_by_hand():
    b = Bounds(least=2)
    assert b.problem(2) is None and b.problem(1) == "1 must be at least 2"
    assert Bounds(above=0, why="why").problem(0.0) == "0.0 must be above 0 (why)"
    assert Bounds(above=0).problem(1e-9) is None
    closed = Bounds(least=0, most=1)
    assert [closed.problem(v) for v in (0.0, 1.0)] == [None, None]
    assert closed.problem(1.5) == "1.5 must be at most 1"
    half_open = Bounds(least=0, below=1)
    assert half_open.problem(0.999) is None and half_open.problem(1.0) == "1.0 must be below 1"
    assert Bounds(least=-1).problem(-2) == "-2 must be at least -1"
    assert [b.describe() for b in (Bounds(least=2), Bounds(above=0), Bounds(least=1, most=65535), half_open)] == \
        ["at least 2", "above 0", "1 to 65535", "at least 0 and below 1"]


def test_help_says_each_range_beside_the_default(capsys):
    from grpo.flags import build_parser

    text = " ".join(build_parser(config.LearnerConfig, "prog").format_help().split())
    assert "(at least 0; default: 2)" in text            # --max-staleness
    assert "(1 to 65535; default: 5555)" in text         # --data-port


@pytest.mark.parametrize("cls", [config.SamplerConfig, config.LearnerConfig, config.LaunchConfig])
def test_every_default_lies_in_its_own_range(cls):
    checked = 0
    for _, f in config.flat_fields(cls).values():
        if b := bounds_of(f):
            assert b.problem(f.default) is None, f.name
            checked += 1
    assert checked >= 10


@pytest.mark.parametrize("cls,flag,edge,outside,says", [
    (config.SamplerConfig, "--num-generations", "2", "1", "must be at least 2"),
    (config.SamplerConfig, "--temperature", "0.01", "0", "must be above 0"),
    (config.SamplerConfig, "--in-flight-rows", "0", "-5", "must be at least 0"),
    (config.LearnerConfig, "--max-staleness", "0", "-1", "must be at least 0"),
    (config.LearnerConfig, "--micro-batch-tokens", "-1", "-2", "must be at least -1"),
    (config.LearnerConfig, "--lora-dropout", "0.5", "1", "must be below 1"),
    (config.LearnerConfig, "--eval-batch-size", "1", "0", "must be at least 1"),
    (config.LaunchConfig, "--training-ranks", "1", "0", "must be at least 1"),
])
def test_a_value_outside_its_range_is_refused_at_parse_time(cls, flag, edge, outside, says, capsys):
    cfg = parse_config(cls, [flag, edge], "prog")
    value = config.flat(cfg)[flag[2:].replace("-", "_")]
    assert value == type(value)(edge)
    with pytest.raises(SystemExit) as e:
        parse_config(cls, [flag, outside], "prog")
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"prog: error: argument {flag}: ") and says in err[0]


def test_a_value_that_is_not_a_number_still_reads_as_argparse_says_it(capsys):
    with pytest.raises(SystemExit):
        parse_config(config.SamplerConfig, ["--num-generations", "eight"], "prog")
    assert "argument --num-generations: invalid int value: 'eight'" in capsys.readouterr().err


def test_a_config_file_is_held_to_the_ranges(tmp_path):
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("num_generations: 2\nmax_staleness: 0\n")
    bad.write_text("num_generations: 4\nmax-staleness: -1\n")
    assert load_config_file(str(good), config.LearnerConfig) == {"num_generations": 2, "max_staleness": 0}
    with pytest.raises(ConfigFileError, match=r"bad.yaml: max_staleness: -1 must be at least 0 \(0 trains only"):
        load_config_file(str(bad), config.LearnerConfig)
    # a key of another role is held to its range too: one file configures the whole run
    with pytest.raises(ConfigFileError, match="max_staleness: -1 must be at least 0"):
        load_config_file(str(bad), config.SamplerConfig)


def test_the_launcher_refuses_a_worker_flag_out_of_range_before_anything_starts(tmp_path):
    # --max-staleness is the learner's own flag (the launcher passes it through); before this
    # check, -1 started both workers and the run waited for groups no budget let a sampler send.
    run_dir = tmp_path / "run"
    r = subprocess.run([sys.executable, "run_distributed.py", "--device", "cpu", "--model", "tiny-random",
                        "--dataset", "rg:basic_arithmetic", "--run-dir", str(run_dir), "--max-staleness", "-1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "run_distributed.py: error: argument --max-staleness: -1 must be at least 0 "
        "(0 trains only groups of the newest version) (see --help)"]
    assert not run_dir.exists() and "[launcher]" not in r.stdout
