"""reasoning-gym tasks: each task's own settings (checked against its config class), weighted
mixtures, the YAML form, and the curriculum's rule, by hand."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import reasoning_gym
from builders import make_group

from grpo.config import SamplerConfig
from grpo.data.rewards import correctness_reward
from grpo.data.sources import DatasetUnavailable, load_problems
from grpo.data.tasks import (Curriculum, SuccessWindow, TaskSpec, TaskSpecError, check, format_spec, from_yaml,
                             next_level, parse_spec)
from grpo.flags import parse_config
from grpo.stats import group_stats

ARITH = "rg:basic_arithmetic:min_terms=2,max_terms=2,max_digits=1,operators=[+,-],allow_parentheses=false"


def test_parse_and_format_round_trip():
    specs = parse_spec("letter_counting@2+basic_arithmetic:min_terms=2,max_terms=3,operators=[+,-]")
    assert specs == [TaskSpec("letter_counting", 2.0, {}),
                     TaskSpec("basic_arithmetic", 1.0, {"min_terms": 2, "max_terms": 3, "operators": ["+", "-"]})]
    assert format_spec(specs) == "rg:letter_counting@2+basic_arithmetic:min_terms=2,max_terms=3,operators=[+,-]"
    assert parse_spec(format_spec(specs)[3:]) == specs
    for bad, why in (("", "name is missing"), ("a@x", "weight must be a number"), ("a@0", "must be > 0"),
                     ("a:min_terms", "is not key=value"), ("a+a", "named twice")):
        with pytest.raises(TaskSpecError, match=why):
            parse_spec(bad)


def test_settings_are_checked_against_the_task_config_class():
    with pytest.raises(TaskSpecError) as e:
        check(parse_spec("basic_arithmetic:min_term=2"))
    msg = str(e.value)
    assert "\n" not in msg and "unknown setting 'min_term'" in msg and "did you mean min_terms?" in msg
    assert "max_digits" in msg                                     # the valid keys are listed
    with pytest.raises(TaskSpecError, match="set by the run"):
        check(parse_spec("basic_arithmetic:seed=3"))
    with pytest.raises(TaskSpecError, match="max_terms must be >= min_terms"):
        check(parse_spec("basic_arithmetic:min_terms=3,max_terms=2"))   # the class's own validate()
    with pytest.raises(TaskSpecError, match="no such task.*letter_counting"):
        check(parse_spec("leter_counting"))
    with pytest.raises(DatasetUnavailable, match="unknown setting 'x'"):
        load_problems("rg:basic_arithmetic:x=1", limit=2)


def test_task_settings_reach_the_problems():
    problems = load_problems(ARITH, limit=40, seed=0)
    for p in problems:
        assert re.fullmatch(r"Calculate -?\d{1,2} [+-] -?\d{1,2}\.", p.question), p.question   # 1 digit: up to 10
        assert p.columns["rg_task"] == "basic_arithmetic"
    # a task without settings is the very dataset reasoning_gym.create_dataset makes
    plain = [p.question for p in load_problems("rg:leg_counting", limit=5, seed=7)]
    assert plain == [d["question"] for d in reasoning_gym.create_dataset("leg_counting", size=5, seed=7)]


def test_a_weighted_mixture_draws_both_and_scores_each_with_its_task():
    problems = load_problems("rg:letter_counting@3+basic_arithmetic:max_terms=2", limit=400, seed=1)
    tasks = [p.columns["rg_task"] for p in problems]
    assert set(tasks) == {"letter_counting", "basic_arithmetic"}
    assert 2.2 < tasks.count("letter_counting") / tasks.count("basic_arithmetic") < 4.0   # 3:1 drawn
    sample = problems[:20]
    right = [f"#### {p.answer}" for p in sample]
    cols = {"rg_task": [p.columns["rg_task"] for p in sample], "rg_entry": [p.columns["rg_entry"] for p in sample]}
    assert correctness_reward([""] * 20, right, [p.answer for p in sample], **cols) == [1.0] * 20
    assert load_problems("rg:letter_counting@3+basic_arithmetic:max_terms=2", limit=50, seed=1) == problems[:50]


def test_the_same_in_a_config_file(tmp_path):
    block = {"rg": [{"name": "letter_counting", "weight": 2},
                    {"name": "basic_arithmetic", "config": {"min_terms": 2, "max_terms": 2}}]}
    assert from_yaml(block, "x") == "rg:letter_counting@2+basic_arithmetic:min_terms=2,max_terms=2"
    path = tmp_path / "run.yaml"
    path.write_text("dataset:\n  rg:\n    - {name: letter_counting, weight: 2}\n"
                    "    - {name: basic_arithmetic, config: {min_terms: 2, max_terms: 2}}\n")
    cfg = parse_config(SamplerConfig, ["--config", str(path)], "sampling_worker.py")
    assert cfg.data.dataset == "rg:letter_counting@2+basic_arithmetic:min_terms=2,max_terms=2"
    with pytest.raises(TaskSpecError, match=r"dataset.rg\[0\] must be"):
        from_yaml({"rg": [{"task": "letter_counting"}]}, "x")


def test_next_level_by_hand():
    assert next_level(0, rate=0.9, groups=19, top=4) == 0      # not a full window yet
    assert next_level(0, rate=0.71, groups=20, top=4) == 1     # above 0.7: up
    assert next_level(4, rate=0.95, groups=20, top=4) == 4     # already at the top
    assert next_level(2, rate=0.7, groups=20, top=4) == 2      # between: stay (0.7 is not above)
    assert next_level(2, rate=0.09, groups=25, top=4) == 1     # below 0.1: down
    assert next_level(0, rate=0.0, groups=20, top=4) == 0      # not below 0


def test_success_window_counts_the_last_groups_at_one_level():
    w = SuccessWindow(window=3)
    w.set_level("a", 0)
    for correct in (4, 0, 8, 8):                                # G = 8; the first falls out
        w.add("a", correct, 8)
    assert w.stats() == {"curriculum/a/level": 0.0, "curriculum/a/groups": 3.0, "curriculum/a/rate": 16 / 24}
    w.set_level("a", 1)                                         # a new level starts a new count
    assert w.stats()["curriculum/a/groups"] == 0.0


def test_curriculum_pools_the_samplers_at_the_current_level():
    c = Curriculum("rg:basic_arithmetic+letter_counting", low=0.1, high=0.7, window=20)
    assert c.levels == {"basic_arithmetic": 0, "letter_counting": 0} and c.top["basic_arithmetic"] == 4
    s0 = {"curriculum/basic_arithmetic/level": 0.0, "curriculum/basic_arithmetic/groups": 10.0,
          "curriculum/basic_arithmetic/rate": 0.9, "curriculum/letter_counting/level": 0.0,
          "curriculum/letter_counting/groups": 20.0, "curriculum/letter_counting/rate": 0.4}
    s1 = {"curriculum/basic_arithmetic/level": 0.0, "curriculum/basic_arithmetic/groups": 10.0,
          "curriculum/basic_arithmetic/rate": 0.6}
    assert c.update([s0], step=3) == []                         # 10 groups of basic_arithmetic: wait
    [change] = c.update([s0, s1], step=4)                       # 20 groups at (0.9 + 0.6) / 2 = 0.75
    assert change == {"step": 4, "task": "basic_arithmetic", "from": 0, "to": 1, "rate": 0.75, "groups": 20}
    assert c.update([s0, s1], step=5) == []                     # reports of level 0 no longer count
    assert c.levels == {"basic_arithmetic": 1, "letter_counting": 0}
    with pytest.raises(TaskSpecError, match="needs reasoning-gym tasks"):
        Curriculum("openai/gsm8k", 0.1, 0.7, 20)
    with pytest.raises(TaskSpecError, match="must be below"):
        Curriculum("rg:basic_arithmetic", 0.7, 0.1, 20)


def test_accuracy_per_task_in_the_step_record():
    a = make_group([[1], [2]], rewards=[1.0, 0.0], meta={"answer": "1", "task": "a"})
    b = make_group([[1], [2]], meta={"answer": "1", "task": "b"})
    a.completions[0].reward_info = {"correct": 1.0}
    out = group_stats([a, b], version=1)
    assert (out["accuracy/a"], out["accuracy/b"], out["accuracy"]) == (0.5, 0.0, 0.25)


def _launch(*args, timeout=600):
    import os
    import subprocess
    import sys
    from pathlib import Path

    from netutil import free_ports

    root = Path(__file__).resolve().parents[2]
    ports = [f"--{k}-port={p}" for k, p in zip(("data", "sync"), free_ports(2))]   # the defaults may be taken here
    return subprocess.run([sys.executable, str(root / "run_distributed.py"), "--device", "cpu", *ports, *args],
                          cwd=root,
                          capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1"))


def test_the_launcher_names_a_bad_setting_in_one_line_and_stops_what_it_started(tmp_path):
    """The rg: check runs beside the workers' start-up (reasoning-gym's import is the launcher's
    slowest): a bad setting still ends the run with one line and exit 2, and every process it
    started is gone."""
    r = _launch("--dataset", "rg:basic_arithmetic:max_term=2", "--run-dir", str(tmp_path / "run"), timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        "run_distributed.py: error: rg:basic_arithmetic: unknown setting 'max_term'; did you mean max_terms? its "
        "settings: min_terms, max_terms, min_digits, max_digits, operators, allow_parentheses, allow_negation, "
        "format_style, whitespace"]
    assert not (tmp_path / "run").exists()   # refused: no run folder left behind
    # every process it started (learner and sampler, told the run folder) is gone or a zombie
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().decode(errors="replace")
            state = (proc / "stat").read_text().split(")")[-1].split()[0]
        except OSError:
            continue
        assert state == "Z" or str(tmp_path / "run") not in cmd, cmd.replace("\0", " ")


@pytest.mark.slow
def test_a_cpu_run_moves_the_curriculum_and_tells_the_samplers(tmp_path):
    """With thresholds any rate passes (high -1), each full window of 2 groups raises the level."""
    import json

    from netutil import free_ports

    data, sync = free_ports(2)
    run_dir = tmp_path / "run"
    r = _launch("--model", "tiny-random", "--no-deepspeed", "--dataset", ARITH, "--curriculum",
                "--curriculum-window", "2", "--curriculum-high", "-1", "--curriculum-low", "-2",
                "--num-generations", "2", "--prompts-per-round", "2", "--train-batch-size", "4",
                "--max-new-tokens", "8", "--max-steps", "4", "--report-to", "none",
                "--data-port", str(data), "--sync-port", str(sync), "--run-dir", str(run_dir))
    assert r.returncode == 0, r.stderr[-3000:]
    steps = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    levels = [s["curriculum/basic_arithmetic"] for s in steps if not s.get("final")]
    assert levels == sorted(levels) and levels[-1] >= 1, levels          # it only rises here
    changes = json.loads((run_dir / "summary.json").read_text())["curriculum"]["changes"]
    assert [(c["from"], c["to"]) for c in changes] == [(i, i + 1) for i in range(len(changes))]
    assert all(c["groups"] >= 2 for c in changes)
    learner_log = (run_dir / "learner0.log").read_text()
    assert f"curriculum: basic_arithmetic level 0 -> 1 after step {changes[0]['step']}" in learner_log
    assert "curriculum: basic_arithmetic 0 -> 1 (prompts regenerated at the new levels)" in \
        (run_dir / "sampler0.log").read_text()
    assert steps[-1]["groups"]["balanced"]
