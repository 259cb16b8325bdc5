"""bench/first_step.py: stage marks as seconds from a launch, by hand, and the command it launches
(the benchmark's, stopped after 3 steps), parsed as the launcher parses it."""
import argparse
from pathlib import Path

from benchload import load_bench

fs = load_bench("first_step")


def test_stage_offsets_from_the_launch():
    launch = 1000.0
    stages = {"learner0": [{"stage": "started", "time": 1001.25}, {"stage": "first_step", "time": 1012.5},
                           # a mark from an earlier launch in the same folder is left out
                           {"stage": "first_step", "time": 990.0}],
              "sampler0": [{"stage": "model_loaded", "time": 1007.333}, {"stage": "started", "time": 1001.0},
                           # a stage marked twice keeps its first mark
                           {"stage": "first_group", "time": 1011.0}, {"stage": "first_group", "time": 1020.0}]}
    assert fs.stage_offsets(stages, launch) == {
        "learner0": {"started": 1.25, "first_step": 12.5},
        "sampler0": {"started": 1.0, "model_loaded": 7.33, "first_group": 11.0}}
    assert fs.stage_offsets({}, launch) == {}


def test_the_command_is_the_benchmarks_stopped_after_three_steps(tmp_path):
    a = argparse.Namespace(model="smollm2", task="rg:basic_arithmetic", seed=7, ours_flags="--tis-cap 3")
    cmd = fs.command(a, tmp_path / "run")
    ns = argparse.Namespace(model="smollm2", task="rg:basic_arithmetic", ours_seconds=600.0,
                            save_schedule=fs.tta.SAVE_SCHEDULE, ours_flags="--tis-cap 3")
    assert cmd[:-2] == fs.tta.ours_command(ns, 7, tmp_path / "run") and cmd[-2:] == ["--max-steps", "3"]
    from grpo.launch.plan import parse

    assert parse(cmd[2:])[0].max_steps == 3   # the launcher takes the last --max-steps (the benchmark's is 100000)
    fs.tta.check_ours(cmd)
    assert Path(cmd[1]).name == "run_distributed.py" and "--tis-cap" in cmd and str(tmp_path / "run") in cmd
