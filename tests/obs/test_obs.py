"""Issue 7 observability and --config: YAML configs, TensorBoard tracking, progress, GPU stats, report."""
import importlib.util
import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from builders import make_completion, make_group

from grpo.config import LearnerConfig, SamplerConfig, flat, from_flat
from grpo.flags import parse_config
from grpo.launch.plan import parse, plan
from grpo.obs.gpu import GpuMonitor, format_gpu, release_cached
from grpo.obs.progress import Progress
from grpo.obs.report import main as report_main
from grpo.obs.tracking import Tracker, flatten, parse_report_to
from grpo.stats import group_stats

ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- --config
def _yaml(tmp_path, text):
    p = tmp_path / "run.yaml"
    p.write_text(text)
    return p


def test_config_file_sets_options_and_flags_override(tmp_path):
    cfg_file = _yaml(tmp_path, "learning-rate: 2e-6\nbeta: 0.1\nno_deepspeed: true\nlora_target_modules: [q_proj, v_proj]\n"
                               "max_steps: 7\ndataset: rg:gsm_symbolic\n")
    cfg = parse_config(LearnerConfig, ["--config", str(cfg_file), "--beta", "0.3"], "t")
    assert cfg.training.learning_rate == 2e-6            # YAML 1.1 reads 2e-6 as a string; taken as the flag would
    assert cfg.loss.beta == 0.3                       # the command line wins
    assert cfg.training.no_deepspeed is True and cfg.training.max_steps == 7
    assert cfg.training.lora_target_modules == "q_proj,v_proj"
    assert cfg.run.config == str(cfg_file.resolve())
    s = parse_config(SamplerConfig, ["--config", str(cfg_file)], "t")
    assert s.data.dataset == "rg:gsm_symbolic"   # one file for every role; each takes its own keys
    assert "beta" not in flat(s)


@pytest.mark.parametrize("text,expect", [
    ("learning_rat: 1e-5\n", "unknown key 'learning_rat'; did you mean learning_rate?"),
    ("beta: abc\n", "beta: expected float, got 'abc'"),
    ("- 1\n- 2\n", "expected a mapping"),
])
def test_config_file_mistakes_are_one_line_exit_2(tmp_path, text, expect):
    cfg_file = _yaml(tmp_path, text)
    r = subprocess.run([sys.executable, "training_worker.py", "--config", str(cfg_file)], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and expect in lines[0], r.stderr


def test_launcher_passes_the_config_file_to_every_child(tmp_path):
    cfg_file = _yaml(tmp_path, "device: cpu\ntraining_ranks: 2\nmax_steps: 5\nlora_r: 4\nprompts_per_round: 3\n"
                               "model: tiny-random\n")
    cfg, to_s, to_l = parse(["--config", str(cfg_file), "--beta", "0.5"])
    assert (cfg.placement.training_ranks, cfg.training.max_steps, cfg.run.model) == (2, 5, "tiny-random")
    specs = plan(cfg, 0, to_s, to_l, master_port=29999)
    assert [s.name for s in specs] == ["learner0", "learner1", "sampler0"]
    learner = parse_config(LearnerConfig, specs[0].argv[2:], "t")
    sampler = parse_config(SamplerConfig, specs[2].argv[2:], "t")
    assert (learner.training.lora_r, learner.training.max_steps, learner.loss.beta, learner.run.model) == (4, 5, 0.5,
                                                                                                           "tiny-random")
    assert (sampler.rollout.prompts_per_round, sampler.run.model, sampler.run.device) == (3, "tiny-random", "cpu")
    assert learner.run.config == sampler.run.config == str(cfg_file.resolve())


# --------------------------------------------------------------------------- tracking
RECORD = {"step": 3, "loss": 0.5, "kl": 0.01, "reward_mean": 0.25, "accuracy": 0.125, "samples_per_s": 2.0,
          "groups": {"received": 4, "trained": 2, "dropped": {"stale": 1}, "queued": 1, "sent": 4},
          "sampler_versions": {"0": 2, "1": 1}, "reward_components": {"has_answer": 0.5},
          "grad_norm": float("nan"), "sync_publish_s": 0.2, "weird": 1, "final": False, "flag": True}


def test_flatten_tags():
    assert flatten(RECORD) == {
        "train/loss": 0.5, "train/kl": 0.01, "reward/reward_mean": 0.25, "reward/accuracy": 0.125,
        "perf/samples_per_s": 2.0, "groups/received": 4.0, "groups/trained": 2.0, "groups/dropped/stale": 1.0,
        "groups/queued": 1.0, "groups/sent": 4.0, "samplers/version/0": 2.0, "samplers/version/1": 1.0,
        "reward/component/has_answer": 0.5, "time/sync_publish_s": 0.2, "misc/weird": 1.0}


def test_tensorboard_event_files_hold_the_values(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tr = Tracker(tmp_path, "tensorboard")
    tr.log(RECORD, step=3)
    tr.log({**RECORD, "loss": 0.25}, step=4)
    tr.close()
    assert list(tmp_path.glob("events.out.tfevents.*"))
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    loss = acc.Scalars("train/loss")
    assert [(e.step, e.value) for e in loss] == [(3, 0.5), (4, 0.25)]
    assert acc.Scalars("samplers/version/1")[0].value == 1.0
    assert "train/grad_norm" not in acc.Tags()["scalars"]   # NaN is left out, not plotted as 0


def test_report_to_choices(caplog):
    assert parse_report_to("none") == [] and parse_report_to("tensorboard, wandb") == ["tensorboard", "wandb"]
    with pytest.raises(ValueError, match="unknown tb; choose from tensorboard, wandb, none"):
        parse_report_to("tb")


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb installed here")
def test_wandb_asked_for_but_missing_is_one_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        tr = Tracker(tmp_path, "wandb")
        tr.log(RECORD, 1)
        tr.close()
    warns = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warns) == 1 and "pip install wandb" in warns[0]
    assert not list(tmp_path.glob("events.out.tfevents.*"))


def _completion(n, lp, finished, info):
    return make_completion(np.arange(n), old_log_probs=lp, reward_info=info, is_finished=finished)


def test_step_extras_hand_worked():
    g1 = make_group([
        _completion(2, [-1.0, -2.0], True, {"correct": 1.0, "has_answer": 1.0, "format": 0.5}),
        _completion(1, [-3.0], False, {"correct": 0.0, "has_answer": 0.0})], group_id="a", policy_version=3)
    g2 = make_group([
        _completion(3, [-0.5, -0.5, -1.0], True, {"has_answer": 1.0, "format": 1.5})], group_id="b", policy_version=1)
    out = group_stats([g1, g2], version=4)
    assert out["reward_components"] == {"format": 1.0, "has_answer": 2 / 3}   # 'correct' is accuracy already
    assert out["entropy"] == pytest.approx(8.0 / 6)                         # (1+2+3+0.5+0.5+1) / 6 tokens
    assert (out["completion_len_min"], out["completion_len_max"]) == (1, 3)
    assert out["truncated_frac"] == pytest.approx(1 / 3)
    assert out["staleness_max"] == 2                                          # 4 - 1 - 1


# --------------------------------------------------------------------------- progress, GPU stats
def test_progress_lines_without_a_terminal(caplog, monkeypatch):
    monkeypatch.delenv("GRPO_PROGRESS", raising=False)
    with caplog.at_level(logging.INFO, logger="grpo.obs.progress"):
        with Progress("steps", total=4, unit="step", every_s=0, stream=io.StringIO()) as p:
            p.update(1, loss=0.5)
            p.update(1)
            p.update(2)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3                       # two periodic lines, then one "done" (not 4/4 twice)
    assert lines[0].startswith("steps: 1/4 (25%), ") and lines[0].endswith("| loss 0.5")
    assert lines[1].startswith("steps: 2/4 (50%)") and "eta" in lines[1]
    assert lines[2].startswith("steps: done 4/4 (100%)") and "eta" not in lines[2]


def test_progress_bar_on_request(caplog, monkeypatch):
    monkeypatch.setenv("GRPO_PROGRESS", "bar")
    out = io.StringIO()
    with caplog.at_level(logging.INFO, logger="grpo.obs.progress"):
        with Progress("rounds", total=3, unit="round", stream=out) as p:
            p.update(3)
    assert "rounds: 100%" in out.getvalue() and "3/3" in out.getvalue()
    assert not caplog.records


def test_gpu_stats_are_silent_on_cpu():
    mon = GpuMonitor(torch.device("cpu"))
    assert mon.sample() == {} and format_gpu({}) == ""
    assert format_gpu({"mem_alloc_gb": 1.0, "mem_peak_gb": 2.0, "util_pct": 50.0, "dev_mem_used_gb": 3.0,
                       "dev_mem_total_gb": 80.0}) == " | gpu 50% 3.0/80.0 GB (alloc 1.00, peak 2.00 GB)"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_stats_on_cuda():
    dev = torch.device("cuda", 0)
    x = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    s = GpuMonitor(dev).sample()
    assert s["mem_alloc_gb"] >= 0.25 and s["mem_peak_gb"] >= 0.25
    assert s["mem_reserved_peak_gb"] >= s["mem_peak_gb"]       # the allocator holds at least what it hands out
    if importlib.util.find_spec("pynvml"):
        assert 0 <= s["util_pct"] <= 100 and s["proc_mem_gb"] >= 0.25
    del x


def test_release_cached_is_nothing_off_cuda():
    assert release_cached(torch.device("cpu")) == (0.0, 0.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_release_cached_hands_back_freed_blocks_and_keeps_live_ones():
    dev = torch.device("cuda", 0)
    torch.cuda.empty_cache()
    base = torch.cuda.memory_reserved(dev) / 2**30
    live = torch.empty(256 << 20, dtype=torch.uint8, device=dev)      # 0.25 GiB kept
    gone = torch.empty(512 << 20, dtype=torch.uint8, device=dev)      # 0.5 GiB freed, still cached
    del gone
    held, kept = release_cached(dev)
    assert held >= base + 0.75 - 1e-6 and abs((held - kept) - 0.5) < 0.05
    assert kept >= base + 0.25 - 1e-6 and live.numel() == 256 << 20


# --------------------------------------------------------------------------- report
def _fake_run(run_dir: Path, n=5):
    run_dir.mkdir()
    with open(run_dir / "metrics.jsonl", "w") as fh:
        for i in range(1, n + 1):
            fh.write(json.dumps({"step": i, "loss": 0.1 * i, "reward_mean": 0.2 * i, "accuracy": 0.1 * i,
                                 "kl": 0.001 * i, "samples_per_s": 2.0 + i, "sequences": 16, "step_time_s": 2.0,
                                 "sync_publish_s": 0.05, "time_s": 2.0 * i, "train_s": 1.0, "data_wait_s": 0.5,
                                 "groups": {"sent": 2 * i, "trained": 2 * i, "dropped": {}, "queued": 0}}) + "\n")
        fh.write(json.dumps({"final": True, "steps": n, "elapsed_s": 10.5,
                             "groups": {"sent": 12, "trained": 10, "dropped": {"stale": 2}, "queued": 0,
                                        "balanced": True}}) + "\n")


def test_report_makes_png_and_summary(tmp_path):
    run_dir = tmp_path / "run1"
    _fake_run(run_dir)
    assert report_main([str(run_dir)]) == 0
    png = (run_dir / "report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    md = (run_dir / "report.md").read_text()
    assert "**5 steps** in 10.5 s" in md
    assert "| reward | 0.2 | 1 |" in md                      # first vs last step (k = 1 for 5 steps)
    assert "sent 12 = trained 10 + dropped 2 {'stale': 2} + queued 0 -> balanced" in md
    assert "weight publish 0.0500 s" in md


def test_report_on_a_missing_run_dir_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "grpo.obs.report", str(tmp_path / "nope")], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"grpo.obs.report: error: {tmp_path / 'nope'}: no such run directory; "
                                             "pass runs/<run_id> (see ls runs/)"]
    (tmp_path / "empty").mkdir()
    assert report_main([str(tmp_path / "empty")]) == 2


# --------------------------------------------------------------------------- startup stages
def test_stage_files_keep_every_mark_and_the_launcher_reads_the_furthest(tmp_path):
    from grpo.obs.stages import history, mark, overdue, read

    # Marks out of order, as a sampler made them before it waited for the learner's first answer
    # to send its first round ('connected' after 'first_group'): the furthest stage counts.
    for stage, t in (("started", 100.0), ("model_loaded", 110.0), ("first_group", 130.0), ("connected", 131.0)):
        mark(tmp_path, "sampler0", stage, now=t)
    pid = os.getpid()
    assert history(tmp_path) == {"sampler0": [{"stage": s, "time": t, "pid": pid} for s, t in
                                              (("started", 100.0), ("model_loaded", 110.0), ("first_group", 130.0),
                                               ("connected", 131.0))]}
    top = json.loads((tmp_path / "stages" / "sampler0.json").read_text())
    assert (top["stage"], top["time"], top["pid"]) == ("connected", 131.0, pid)   # the newest mark, as before
    assert read(tmp_path) == {"sampler0": ("first_group", 130.0)}
    assert overdue({"sampler0": 99.0}, read(tmp_path), now=1e6, bound_s=60, noted={}) == []   # past its last stage
    # A restarted learner: only its new process's marks say where it is (not the old first_step).
    old = [{"stage": s, "time": t, "pid": 1} for s, t in (("started", 10.0), ("first_step", 40.0))]
    (tmp_path / "stages" / "learner0.json").write_text(json.dumps({**old[-1], "history": old}))
    mark(tmp_path, "learner0", "started", now=200.0)
    mark(tmp_path, "learner0", "bound", now=201.0)
    assert read(tmp_path)["learner0"] == ("bound", 201.0)
    assert [e["stage"] for e in history(tmp_path)["learner0"]] == ["started", "first_step", "started", "bound"]
    # A stage file from before histories ({"stage", "time", "pid"} only) reads as its one mark.
    (tmp_path / "stages" / "sampler1.json").write_text(json.dumps({"stage": "connected", "time": 5.0, "pid": 9}))
    assert read(tmp_path)["sampler1"] == ("connected", 5.0)
    assert history(tmp_path)["sampler1"] == [{"stage": "connected", "time": 5.0, "pid": 9}]


def test_first_step_s_counts_from_the_earliest_start_of_this_launch():
    from grpo.obs.stages import first_step_s

    def marks(pid, *stages):
        return [{"stage": s, "time": t, "pid": pid} for s, t in stages]

    # An earlier launch (pids 1-4) left its marks; this launch is pids 5-7, learner0 is pid 5.
    hist = {"learner0": marks(1, ("started", 10.0), ("first_step", 40.0)) + marks(5, ("started", 100.0),
                                                                                   ("bound", 101.0), ("first_step", 130.0)),
            "learner1": marks(2, ("started", 12.0)) + marks(6, ("started", 99.5), ("engine_ready", 110.0)),
            "sampler0": marks(3, ("started", 15.0), ("first_group", 30.0)) + marks(7, ("started", 103.0)),
            "sampler1": marks(4, ("started", 20.0))}   # not in this launch: it marked nothing since
    assert first_step_s(hist, 5) == 130.0 - 99.5     # learner1 started half a second before learner0
    assert first_step_s(hist) == 130.0 - 99.5        # learner0's newest process by default
    assert first_step_s(hist, 1) == 40.0 - 10.0      # the earlier launch's own figure
    hist["learner0"] = hist["learner0"][:-1]         # no first step yet in this launch
    assert first_step_s(hist, 5) is None


def test_run_files_record_command_and_commit(tmp_path, monkeypatch):
    """provenance(): this process's command line and the code's commit ($GRPO_GIT_COMMIT first, as
    the launcher passes it on); save_config writes both beside the options."""
    import sys

    from grpo.config import LearnerConfig
    from grpo.obs import rundir

    rundir.code_commit.cache_clear()
    monkeypatch.setenv(rundir.COMMIT_ENV, "abc123")
    monkeypatch.setattr(sys, "argv", ["training_worker.py", "--seed", "7"])
    try:
        assert rundir.provenance() == {"command": f"{sys.executable} training_worker.py --seed 7",
                                       "commit": "abc123"}
        cfg = from_flat(LearnerConfig, seed=7, learning_rate=3e-6)
        rundir.save_config(tmp_path, "learner", cfg)
        saved = json.loads((tmp_path / "config_learner.json").read_text())
        assert (saved["command"], saved["commit"], saved["seed"]) == (rundir.provenance()["command"], "abc123", 7)
        assert saved["learning_rate"] == 3e-6
    finally:
        rundir.code_commit.cache_clear()
    assert rundir.git_head(tmp_path) == (None, None)   # no .git: nothing to say
