"""bench/benchmark.py, bench/trl_grpo.py and bench/fetch_models.py: their rules by hand, the evaluator's
load on the tiny model, chunks that reassemble, and the committed result rebuilt from its run archives."""
import hashlib
import json
import re
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from benchload import load_bench

from grpo.learner.checkpoint import _save_hf, parse_save_schedule
from grpo.model.load import load_causal_lm, load_tokenizer
from grpo.model.zoo import resolve_model

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
rw = load_bench("benchmark")
fm = load_bench("fetch_models")


def test_the_standard_rows_and_how_the_recipe_groups_them():
    assert len(rw.STANDARD_ROWS) == len(set(rw.STANDARD_ROWS)) == 10
    assert {(r["model"], r["layout"], r["trainer"]) for r in map(rw.parse_row, rw.STANDARD_ROWS)} == {
        (m, "seed", t) for m in ("0.5b", "1.5b") for t in ("ours", "trl")} | {
        ("0.5b", "chosen", "ours"), ("1.5b", "chosen", "ours")} | {   # --gpus' split; TRL's is its seed row
        # one GPU: ours as --gpus 0 runs it, against the peer users pick there, TRL generating with vLLM
        (m, lay, t) for m in ("0.5b", "1.5b") for lay, t in (("1gpu-chosen", "ours"), ("1gpu", "trl-vllm"))}
    # a four-GPU row alone; one-GPU rows in a row side by side, four to a host, the order kept
    rows = ["0.5b:1gpu:ours:1", "0.5b:1gpu:trl:1", "1.5b:seed:ours:1", "a:1gpu:ours:1", "a:1gpu:ours:2",
            "a:1gpu:ours:3", "a:1gpu:ours:4", "a:1gpu:ours:5"]
    assert rw.recipe_groups(rows) == ["0.5b:1gpu:ours:1+0.5b:1gpu:trl:1", "1.5b:seed:ours:1",
                                      "a:1gpu:ours:1+a:1gpu:ours:2+a:1gpu:ours:3+a:1gpu:ours:4", "a:1gpu:ours:5"]
    assert rw.recipe_groups(rw.STANDARD_ROWS)[-1].count("+") == 3   # the four one-GPU rows fill one host
    assert rw.recipe_groups(["a:1gpu-chosen:ours:1", "a:1gpu:trl-vllm:1"]) == ["a:1gpu-chosen:ours:1+a:1gpu:trl-vllm:1"]
    assert rw.recipe_groups(rows[3:], host_gpus=2) == ["a:1gpu:ours:1+a:1gpu:ours:2", "a:1gpu:ours:3+a:1gpu:ours:4",
                                                       "a:1gpu:ours:5"]


def test_zero_signal_kinds_sum_the_samplers_results_and_stay_absent_before_they_were_counted(tmp_path):
    (tmp_path / "sampler0_result.json").write_text(json.dumps({"zero_signal_solved": 3.0, "zero_signal_unsolved": 40.0}))
    (tmp_path / "sampler1_result.json").write_text(json.dumps({"zero_signal_solved": 1.0, "zero_signal_unsolved": 2.0}))
    assert rw.zero_signal_kinds(tmp_path) == {"solved": 4, "unsolved": 42}
    old = tmp_path / "old"
    old.mkdir()
    (old / "sampler0_result.json").write_text(json.dumps({"dropped_zero_signal": 9.0}))
    assert rw.zero_signal_kinds(old) is None and rw.zero_signal_kinds(tmp_path / "none") is None


def test_screening_sums_the_samplers_results_and_the_share_of_completions_without_signal(tmp_path):
    """Two samplers of G=16: 10 + 2 prompts dropped at screens of 4 (48 completions) and 3 + 1
    zero-signal groups (64 completions) of 400 + 112 generated: 112 / 512 = 0.21875; and those 512
    over the groups the learner trained, where the caller gives that count."""
    (tmp_path / "sampler0_result.json").write_text(json.dumps(
        {"screened_out": 10.0, "screened_solved": 3.0, "screened_unsolved": 7.0, "screen_samples": 40.0,
         "dropped_zero_signal": 3.0, "samples": 400.0}))
    (tmp_path / "sampler1_result.json").write_text(json.dumps(
        {"screened_out": 2.0, "screened_solved": 0.0, "screened_unsolved": 2.0, "screen_samples": 8.0,
         "dropped_zero_signal": 1.0, "samples": 112.0}))
    assert rw.screening(tmp_path, 16) == {"prompts": 12, "solved": 3, "unsolved": 9, "completions": 48,
                                          "no_signal_completions": 0.2188, "completions_per_trained_group": None}
    # 512 completions generated for 20 groups trained: 25.6 a trained group
    assert rw.screening(tmp_path, 16, trained=20)["completions_per_trained_group"] == 25.6
    old = tmp_path / "old"
    old.mkdir()
    (old / "sampler0_result.json").write_text(json.dumps({"dropped_zero_signal": 9.0, "samples": 10.0}))
    assert rw.screening(old, 16) is None
    assert rw.group_size_of(["x", "--num-generations=16"]) == 16 == rw.group_size_of(["--num-generations", "16"])
    with pytest.raises(ValueError, match="no --num-generations"):
        rw.group_size_of(["--model", "m"])


def test_rows_on_a_two_gpu_host_pair_the_one_gpu_rows_and_leave_out_the_four_gpu_ones(capsys):
    """What bench/benchmark.sh runs by default on a host of two GPUs (it passes the host's count)."""
    assert rw.main(["rows", "--host-gpus", "2"]) == 0
    out, err = capsys.readouterr()
    assert out.split() == ["0.5b:1gpu-chosen:ours:42+0.5b:1gpu:trl-vllm:42", "1.5b:1gpu-chosen:ours:42+1.5b:1gpu:trl-vllm:42"]
    assert err.startswith("benchmark: left out, as they need more than this host's 2 GPUs: 0.5b:seed:ours:42 ")
    assert "1.5b:chosen:ours:42" in err


def test_row_specs():
    assert rw.parse_row("0.5b:seed:ours:42") == {"model": "0.5b", "layout": "seed", "trainer": "ours", "seed": 42,
                                                   "name": "0.5b_seed_ours_s42"}
    assert rw.parse_row("tiny-random:1gpu:trl:1")["name"] == "tiny-random_1gpu_trl_s1"
    for bad in ("0.5b:seed:ours", "0.5b:two:ours:1", "0.5b:seed:verl:1", "0.5b:seed:ours:x"):
        with pytest.raises(SystemExit):
            rw.parse_row(bad)


POINTS = [{"seconds": 0.0, "step": 0, "accuracy": 0.264}, {"seconds": 31.0, "step": 9, "accuracy": 0.30},
          {"seconds": 62.0, "step": 20, "accuracy": 0.318}, {"seconds": 95.0, "step": 31, "accuracy": 0.364},
          {"seconds": 121.0, "step": 40, "accuracy": 0.35}]


def test_wilson_interval_hand_worked():
    # 0/10: centre = (z^2/20)/(1 + z^2/10) = half, so [0, z^2/(10 + z^2)] = [0, 3.8416/13.8416]
    assert rw.wilson(0, 10) == [0.0, 0.2775]
    # 5/10: centre 0.5, half = 1.96 * sqrt(0.025 + 0.009604) / 1.38416 = 0.26341
    assert rw.wilson(5, 10) == [0.2366, 0.7634]
    assert rw.wilson(0, 0) == [0.0, 1.0]


def test_seconds_to_and_accuracy_at_hand_worked():
    pts = [{"seconds": 0.0, "accuracy": 0.15}, {"seconds": 40.0, "accuracy": 0.31},
           {"seconds": 70.0, "accuracy": 0.29}, {"seconds": 100.0, "accuracy": 0.30}]
    assert rw.seconds_to(pts, 0.30) == 40.0          # the first point at or above, not the last
    assert rw.seconds_to(pts, 0.32) is None
    assert rw.seconds_to(pts, 0.0) is None           # a zero target means nothing
    assert rw.accuracy_at(pts, 69.9) == 0.31         # the newest weights saved by then
    assert rw.accuracy_at(pts, 600.0) == 0.30        # a run that ended before: its last
    assert rw.accuracy_at(pts[1:], 10.0) is None


def test_seconds_to_a_gain_counts_saves_only():
    assert rw.seconds_to_gain(POINTS, 0.264, 0.05) == 62.0     # 0.318 >= 0.314; 0.30 is not
    assert rw.seconds_to_gain(POINTS, 0.264, 0.10) == 95.0     # exactly +10 points counts
    assert rw.seconds_to_gain(POINTS, 0.264, 0.20) is None
    assert rw.seconds_to_gain(POINTS, 0.20, 0.0) == 31.0       # the base point at 0 s is no save


def test_accuracy_marks_stop_where_the_row_did():
    saves = POINTS[1:]
    assert rw.accuracy_marks(saves, 120.0) == {"60": 0.30, "120": 0.364, "240": None, "600": None}
    assert rw.accuracy_marks(saves, 600.0) == {"60": 0.30, "120": 0.364, "240": 0.35, "600": 0.35}
    assert rw.accuracy_marks([], 600.0) == {"60": None, "120": None, "240": None, "600": None}


def test_scoring_shares_keep_a_models_base_first():
    items = [("b", "r", "f1", 1, 1.0), ("a", "r", "f2", 2, 2.0), ("a", "", "", 0, 0.0), ("a", "r", "f3", 3, 3.0)]
    shares = rw.split_items(items, 2)
    assert shares == [[("a", "", "", 0, 0.0), ("a", "r", "f3", 3, 3.0)], [("a", "r", "f2", 2, 2.0), ("b", "r", "f1", 1, 1.0)]]
    assert rw.split_items(items[:1], 4) == [[items[0]]]


def test_rates_by_hand():
    metrics = [{"step": 1, "step_time_s": 30.0, "train_s": 1.0, "time_s": 30.0},
               {"step": 2, "step_time_s": 3.0, "train_s": 0.6, "time_s": 33.0},
               {"step": 3, "step_time_s": 4.0, "train_s": 0.6, "time_s": 37.0},
               {"step": 4, "step_time_s": 5.0, "train_s": 0.6, "time_s": 42.0}]
    summary = {"elapsed_s": 50.0, "samplers": {"0": {"stats": {"tokens": 40000.0}}, "1": {"stats": {"tokens": 10000.0}}}}
    # steps 2-4: median 4 s; 1.8 s training of 12 s; 50,000 tokens / 50 s / 4 GPUs
    assert rw.ours_rates(metrics, summary, 4) == {"median_step_s": 4.0, "learner_busy_share": 0.15,
                                                  "gen_tokens_per_s_per_gpu": 250.0}
    steps = [{"time_s": 20.0, "tokens": 1000.0}, {"time_s": 32.0, "tokens": 3000.0}, {"time_s": 46.0, "tokens": 4000.0}]
    # gaps 12 and 14 (the first step's 20 s includes the start); 8,000 tokens / 46 s / 2 GPUs
    assert rw.trl_rates(steps, 2) == {"median_step_s": 13.0, "learner_busy_share": None,
                                      "gen_tokens_per_s_per_gpu": 87.0}


def test_peak_share_and_decode_step_by_hand():
    steps = [{"step": 1, "bf16_peak_share": 0.01}, {"step": 2, "bf16_peak_share": 0.12},
             {"step": 3}, {"step": 4, "bf16_peak_share": 0.10}, {"step": 5, "bf16_peak_share": 0.14}]
    assert rw.peak_share_median(steps) == 0.12        # the first step's 0.01 left out; step 3 logged none
    assert rw.peak_share_median([{"step": 1}]) is None
    lines = ["02:24:13 sampler0 INFO round 0 (v0): 16 completions, 3519 tokens in 6.58 s (535 tok/s)",
             "02:26:00 sampler0 INFO stream: 9,000 decode steps, 9.20 ms each on the device (80 s, 70% of 110 s)",
             "02:29:24 sampler0 INFO stream: 28,656 decode steps, 8.61 ms each on the device (247 s, 76% of 324 s)"]
    assert rw.stream_step_ms(lines) == 8.61 and rw.stream_step_ms(lines[:1]) is None


def test_steps_per_second_from_launch_by_hand():
    # 10 steps: the first ends 20 s after launch, at 5 s of the trainer's clock; the last at 95 s
    assert rw.rate_from_launch(10, 20.0, 5.0, 95.0) == round(10 / 110, 4)
    # one step: its own time from launch
    assert rw.rate_from_launch(1, 30.0, 12.0, 12.0) == round(1 / 30, 4)
    assert rw.rate_from_launch(0, 20.0, 5.0, 95.0) is None and rw.rate_from_launch(3, None, 5.0, 9.0) is None


def test_figures_of_a_run_cut_short_by_hand(tmp_path, capsys):
    """A run whose machine was taken back: no summary.json, a half-written last line; its figures
    come from metrics.jsonl, the samplers' logs and eval.jsonl."""
    run = tmp_path / "1.5b_chosen_ours_s42"
    run.mkdir()
    books = {"received": 30, "trained": 24, "dropped": {"stale": 3, "sampler_zero_signal": 10}, "queued": 3,
             "sent": 40, "balanced": True}
    steps = [{"step": 1, "step_time_s": 20.0, "train_s": 1.0, "time_s": 20.0},
             {"step": 2, "step_time_s": 2.0, "train_s": 1.0, "time_s": 22.0},
             {"step": 3, "step_time_s": 4.0, "train_s": 1.0, "time_s": 26.0},
             {"step": 4, "step_time_s": 6.0, "train_s": 1.5, "time_s": 32.0,
              "sampler_busy_share": {"0": 0.9}, "groups": books}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in steps) + '{"step": 5, "step_ti')
    (run / "sampler0.log").write_text(
        "12:00:01 sampler0 INFO round 1 (v0): 16 completions, 6000 tokens in 0.5 s (12000 tok/s) ...\n"
        "12:00:02 sampler0 INFO now running policy version 1\n"
        "12:00:03 sampler0 INFO round 1 (v1): 48 completions, 9000 tokens in 1.0 s (9000 tok/s) ...\n")
    (run / "eval.jsonl").write_text(json.dumps({"version": 0, "by": "sampler0", "accuracy": 0.5, "seconds": 7.7}) + "\n")
    rw.main(["figures", "--work-dir", str(tmp_path)])
    got = json.loads(capsys.readouterr().out)
    # the half line (a snapshot taken mid-append) passed over; 4 steps over 32 s; steps 2-4: median 4 s, 3.5 s training of 12 s; 3 stale of 40 sent and of
    # 27 judged (24 trained + 3); 15,000 tokens in 1.5 s of generating
    assert got == {"run": run.name, "steps": 4, "last_step_s": 32.0, "steps_per_s": 0.125, "median_step_s": 4.0,
                   "learner_busy_share": 0.292, "sampler_busy_share": {"0": 0.9}, "groups": books,
                   "stale_of_sent": 0.075, "stale_of_judged": 0.1111, "zero_signal_of_sent": 0.25,
                   "decode": {"sampler0": {"tokens": 15000, "seconds": 1.5, "tokens_per_s": 10000}},
                   "baseline_accuracy": 0.5, "learner_final": None, "ended": False}
    with pytest.raises(SystemExit, match="no run under"):
        rw.main(["figures", "--work-dir", str(tmp_path / "none")])


def test_save_flags_follow_the_schedule_and_a_bad_one_stops_at_once(capsys):
    assert rw.ours_save_flags("30") == ["--save-weights-every-s", "30"]           # constant: every learner has it
    assert rw.ours_save_flags("30x4,60") == ["--save-weights-every-s", "30", "--save-weights-schedule", "30x4,60"]
    with pytest.raises(SystemExit) as e:
        rw.main(["run", "--row", "0.5b:seed:ours:42", "--save-schedule", "30x4"])
    assert e.value.code == 2 and "--save-schedule" in capsys.readouterr().err


def _args(**kw):
    base = {"device": "cpu", "dataset": "data/gsm8k", "eval_size": 8, "seconds": 30.0, "save_schedule": "30x4,60",
            "ours_flags": "", "trl_micro_batch": 16}
    return SimpleNamespace(**{**base, **kw})


def test_ours_command_reaches_both_roles_and_a_typo_stops_the_script(capsys, monkeypatch, tmp_path):
    """ours' command through the launcher's parse and plan (nothing starts), for the seed layout on a
    GPU host: one sampler on GPU 0, three learner ranks on 1-3, the shared settings in both roles,
    --ours-flags last and winning; a flag the launcher does not know stops the script first: before
    the rows' models are looked up (a machine without the 0.5B GGUF gets the typo, not "fetch the
    model") and before any row, a TRL row listed first included."""
    from grpo.config import LearnerConfig, SamplerConfig, flat
    from grpo.flags import parse_config
    from grpo.launch.plan import parse, plan

    row = rw.parse_row("0.5b:seed:ours:7")
    args = _args(device="auto", ours_flags="--max-staleness 0")
    cmd = rw.ours_command(args, {**row, "model": "tiny-random"}, Path("/r/x"))
    assert cmd[-2:] == ["--max-staleness", "0"] and cmd[cmd.index("--run-dir") + 1] == "/r/x"
    rw.check_ours(cmd)
    launch, to_s, to_l = parse(cmd[2:])
    specs = {p.name: p for p in plan(launch, 4, to_s, to_l, 29500)}
    assert set(specs) == {"sampler0", "learner0", "learner1", "learner2"}
    sampler = parse_config(SamplerConfig, specs["sampler0"].argv[2:], "s")   # [python, script, flags...]
    learner = parse_config(LearnerConfig, specs["learner0"].argv[2:], "l")
    for k in ("num_generations", "max_new_tokens", "temperature"):
        assert flat(sampler)[k] == rw.SHARED[k], k
    for k in ("train_batch_size", "max_new_tokens", "learning_rate", "beta", "loss_type"):
        assert flat(learner)[k] == rw.SHARED[k], k
    assert sampler.rollout.filter_zero_signal and learner.loss.filter_zero_signal and sampler.data.reward == "correctness"
    assert (learner.run.seed, learner.training.max_staleness, learner.checkpoints.save_weights_schedule) == (7, 0,
                                                                                                             "30x4,60")
    capsys.readouterr()

    def too_soon(*a, **kw):
        pytest.fail(f"reached before --ours-flags was checked: {a}")
    for name in ("model_path", "prepare", "record_device", "launch"):
        monkeypatch.setattr(rw, name, too_soon)
    with pytest.raises(SystemExit, match="refuses ours' command"):
        rw.main(["all", "--rows", "0.5b:seed:trl:7 0.5b:seed:ours:7", "--ours-flags=--max-stalenes 0",
                 "--work-dir", str(tmp_path)])
    assert "unknown flag --max-stalenes" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_ours_vllm_is_ours_with_the_vllm_engine_in_the_sampler():
    """ours-vllm: ours' command with --generation-backend vllm (after ours' fast), which reaches the
    sampler; --ours-flags
    still come last (and win); its row is summarised as ours' (books, rates) under its own name."""
    from grpo.config import SamplerConfig
    from grpo.flags import parse_config
    from grpo.launch.plan import parse, plan

    row = rw.parse_row("0.5b:1gpu-chosen:ours-vllm:3")
    assert (row["trainer"], row["name"]) == ("ours-vllm", "0.5b_1gpu-chosen_ours-vllm_s3")
    cmd = rw.ours_command(_args(device="auto", ours_flags="--seed 5"), {**row, "model": "tiny-random"}, Path("/r/x"))
    assert cmd[-4:] == ["--generation-backend", "vllm", "--seed", "5"]
    launch, to_s, to_l = parse(cmd[2:])
    specs = {p.name: p for p in plan(launch, 1, to_s, to_l, 29500)}
    sampler = parse_config(SamplerConfig, specs["sampler0"].argv[2:], "s")
    assert sampler.rollout.generation_backend == "vllm"
    plain = rw.ours_command(_args(device="auto"), {**rw.parse_row("0.5b:1gpu-chosen:ours:3"), "model": "m"}, Path("/r"))
    assert plain[plain.index("--generation-backend") + 1] == "fast" and plain.count("--generation-backend") == 1


def test_the_gguf_files_are_looked_up_in_order(tmp_path, monkeypatch):
    """0.5b / 1.5b: the file in $GRPO_GGUF_DIR, else fetch_models' receive folder, else $GRPO_CACHE/gguf;
    any other MODEL is --model's value as given. The receive folder is the test's (not /tmp/gguf)."""
    name = rw.MODELS[rw.SHORT["0.5b"]]["file"]
    mine, received, cache = tmp_path / "mine", tmp_path / "received", tmp_path / "cache"
    monkeypatch.setattr(rw.fetch, "RECEIVE_DIR", received)
    monkeypatch.setenv("GRPO_GGUF_DIR", str(mine))
    monkeypatch.setenv("GRPO_CACHE", str(cache))
    assert rw.model_path("tiny-random") == "tiny-random"
    with pytest.raises(SystemExit, match=re.escape(f"{name} is in none of {mine}, {received}, {cache / 'gguf'}")):
        rw.model_path("0.5b")
    for d in (cache / "gguf", received, mine):   # each folder, once it holds the file, wins over the later ones
        d.mkdir(parents=True)
        with open(d / name, "wb") as fh:   # sparse, of the model's size: what the lookup checks
            fh.truncate(rw.MODELS[rw.SHORT["0.5b"]]["bytes"])
        assert rw.model_path("0.5b") == str(d / name)


def test_a_row_is_not_launched_into_a_folder_that_holds_one(tmp_path, monkeypatch):
    import subprocess

    ran = []
    monkeypatch.setattr(subprocess, "call", lambda cmd, **kw: ran.append(cmd) or 0)
    monkeypatch.setattr(rw.time, "time", lambda: 1000.0)
    rec = rw.launch(["x", "--launch-time", "{launch}"], tmp_path / "r", "trl", {"seed": 1})
    assert ran == [["x", "--launch-time", "1000.000"]] and rec["launch_time"] == 1000.0
    assert json.loads((tmp_path / "r" / "launch.json").read_text())["command"] == ran[0]
    with pytest.raises(SystemExit, match="already holds a run"):
        rw.launch(["x"], tmp_path / "r", "trl", {})
    assert len(ran) == 1


def test_first_step_from_the_stage_marks_else_the_summary(tmp_path):
    """Launched at 1000.0 (Unix): learner0's first_step mark at 1030.5 is 30.5 s from launch; a mark
    of an earlier launch (before 1000) is not this run's; summary.json's first_step_s last. TRL: only
    steps.json's Unix stamps give the time from launch."""
    run = tmp_path / "run"
    (run / "stages").mkdir(parents=True)
    assert rw.first_step_ours(run, 1000.0) == (None, None)
    stage = run / "stages" / "learner0.json"
    stage.write_text(json.dumps({"stage": "first_step", "time": 1030.5, "pid": 7}))
    assert rw.first_step_ours(run, 1000.0) == (30.5, "stages/learner0.json")
    stage.write_text(json.dumps({"stage": "stopping", "time": 1300.0, "pid": 8, "history": [
        {"stage": "first_step", "time": 900.0, "pid": 6}, {"stage": "first_step", "time": 1041.25, "pid": 8}]}))
    (run / "summary.json").write_text(json.dumps({"first_step_s": 37.0}))
    assert rw.first_step_ours(run, 1000.0) == (41.25, "stages/learner0.json")
    stage.unlink()
    assert rw.first_step_ours(run, 1000.0) == (37.0, "summary.json first_step_s (from the first process's start)")
    assert rw.first_step_trl({"steps": [{"step": 1, "time_s": 5.0}]}, 1000.0) == (None, None)
    assert rw.first_step_trl({"steps": [{"step": 1, "time_s": 5.0, "wall_time": 1100.5}]}, 1000.0) == \
        (100.5, "steps.json")


def test_a_failed_trl_run_gets_its_steps_and_error_from_its_log(tmp_path):
    """TRL died before writing steps.json (a NaN gradient, then a sampling assert): its books come
    from the dicts the Trainer printed, and the error from the log's last line of one."""
    run = tmp_path / "trl"
    run.mkdir()
    (run / "command.log").write_text(
        "Loading weights: 100%\n"
        "{'loss': '0.1', 'grad_norm': '0.5', 'reward': '0.25', 'frac_reward_zero_std': '0.5', 'entropy': '2'}\n"
        "{'loss': '0', 'grad_norm': 'nan', 'reward': '0.5', 'frac_reward_zero_std': '0.25', 'entropy': '1'}\n"
        "Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n"
        "torch.AcceleratorError: CUDA error: device-side assert triggered\n"
        "Search for `cudaErrorAssert' in the CUDA docs.\n")
    books = rw.trl_books(run, {"exit_code": 1})
    assert books["steps"] == 2 and books["completions_trained"] == 2 * rw.SHARED["train_batch_size"]
    assert books["zero_signal_fraction"] == 0.375                      # (0.5 + 0.25) / 2
    assert books["nonfinite_grad_steps"] == [2]
    assert books["error"] == "AcceleratorError: CUDA error: device-side assert triggered"
    assert books["books_from"].startswith("command.log")
    assert rw.last_error("all fine\n") is None


def test_rows_schedule_is_the_rows_own():
    assert rw.rows_schedule([{"save_schedule": "60x2,120"}, {"save_schedule": "60x2,120"}]) == "60x2,120"
    assert rw.rows_schedule([{"save_schedule": "60"}, {"save_schedule": "30x4,60"}, {}]) == ["30x4,60", "60"]
    assert rw.rows_schedule([{}]) == rw.SAVE_SCHEDULE


@pytest.fixture(scope="module")
def tiny():
    path = resolve_model("tiny-random")
    return path, load_tokenizer(path), load_causal_lm(path, torch.device("cpu"), torch.float32)


def test_load_into_copies_every_parameter_in_place(tiny, tmp_path):
    path, tok, model = tiny
    other = load_causal_lm(path, torch.device("cpu"), torch.float32)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.5)
    _save_hf(other, tok, tmp_path / "v")
    target = load_causal_lm(path, torch.device("cpu"), torch.bfloat16)
    ptrs = [p.data_ptr() for p in target.parameters()]
    rw.load_into(target, tmp_path / "v")
    assert [p.data_ptr() for p in target.parameters()] == ptrs          # the engine's graphs stay valid
    for (n, a), b in zip(target.named_parameters(), other.parameters()):
        assert torch.equal(a, b.to(torch.bfloat16)), n
    (tmp_path / "v" / "model.safetensors").rename(tmp_path / "gone")
    with pytest.raises(SystemExit, match="lacks"):
        rw.load_into(target, tmp_path / "v")


def test_trl_clock_stamps_each_step_with_the_unix_time(monkeypatch):
    """bench/trl_grpo.py's Clock (CPU): each step's record carries its end on the Unix clock (the
    runner's first step from launch); the run stops once `seconds` from the launch have passed."""
    tg = load_bench("trl_grpo")
    clock = tg.Clock(seconds=60.0, batch=128, cuda=False, launch_time=1000.0)
    clock.on_train_begin(None, None, None)
    control = SimpleNamespace(should_training_stop=False)
    for step, now in ((1, 1042.5), (2, 1061.0)):
        monkeypatch.setattr(tg.time, "time", lambda now=now: now)
        clock.on_step_end(None, SimpleNamespace(global_step=step), control)
        assert control.should_training_stop is (now - 1000.0 >= 60.0)
    assert [(s["step"], s["wall_time"], s["completions"]) for s in clock.steps] == [(1, 1042.5, 128), (2, 1061.0, 128)]
    assert rw.first_step_trl({"steps": clock.steps}, 1000.0) == (42.5, "steps.json")


def test_trl_saves_on_the_schedule_without_catching_up(tiny, tmp_path, monkeypatch):
    """bench/trl_grpo.py's callback on '10x2,30' from t0 = 1000: marks at 1010, 1020, 1050, 1080; a step
    ending at 1026 (past 1020) saves once, and the next mark is 1050; the run's last step (1079.5,
    between marks) saves too."""
    tg = load_bench("trl_grpo")
    path, tok, model = tiny
    saves = tg.TimedSaves(parse_save_schedule("10x2,30"), tmp_path / "weights", 1000.0, tok)
    stop = SimpleNamespace(should_training_stop=False)
    for step, now in enumerate([1005.0, 1010.0, 1019.0, 1026.0, 1049.0, 1050.0, 1079.0], start=1):
        monkeypatch.setattr(tg.time, "time", lambda now=now: now)
        saves.on_step_end(None, SimpleNamespace(is_world_process_zero=True, global_step=step), stop, model=model)
    monkeypatch.setattr(tg.time, "time", lambda: 1079.5)
    saves.on_step_end(None, SimpleNamespace(is_world_process_zero=True, global_step=8),
                      SimpleNamespace(should_training_stop=True), model=model)
    saved = sorted(json.loads(p.read_text())["step"] for p in (tmp_path / "weights").glob("step_*/weights.json"))
    assert saved == [2, 4, 6, 8]
    assert [r["seconds"] for r in saves.saver.saved] == [10.0, 26.0, 50.0, 79.5]
    assert tg.parse(["--dataset", "x", "--out", "o", "--save-every-s", "30"]).schedule == [(30.0, None)]
    assert tg.parse(["--dataset", "x", "--out", "o", "--save-schedule", "15x8,30"]).schedule == \
        [(15.0, 8), (30.0, None)]
    assert tg.parse(["--dataset", "x", "--out", "o"]).schedule is None


@pytest.mark.parametrize("result", sorted(p.name for p in RESULTS.glob("real_workload_*.json")))
def test_the_committed_result_is_what_its_run_archives_say(tmp_path, result):
    """Each bench/results/real_workload_<device>.json (the tables of the README and docs/benchmarks.md):
    every row's every field as `summarise` computes it from that device's committed run archives,
    real_workload/<device>_<commit>.tgz (no weights in them; the scores are)."""
    committed = json.loads((RESULTS / result).read_text())
    device = result[len("real_workload_"):-len(".json")]
    archives = sorted((RESULTS / "real_workload").glob(f"{device}_*.tgz"))
    assert archives, f"no run archive for {result}"
    out = tmp_path / "out"
    for archive in archives:
        work = tmp_path / archive.stem
        with tarfile.open(archive) as t:
            t.extractall(work, filter="data")
        work = next(p.parent for p in work.rglob("device.json"))
        rw.main(["summarise", "--work-dir", str(work), "--results-dir", str(out), "--device-name", committed["device"]])
    rebuilt = json.loads((out / result).read_text())
    # summarise's own key: a labelled run of a row is kept beside the unlabelled one
    key = lambda r: (r["model"], r["layout"], r["trainer"], r["seed"], r.get("label") or "")   # noqa: E731
    assert sorted(map(key, rebuilt["rows"])) == sorted(map(key, committed["rows"])) and committed["rows"]
    mine = {key(r): r for r in rebuilt["rows"]}
    for row in committed["rows"]:
        assert mine[key(row)] == row, key(row)
    layouts = {r["layout"] for r in committed["rows"]}
    assert rebuilt["settings"] == json.loads(json.dumps({"shared": rw.SHARED, "ours_only": rw.OURS_ONLY,
                                                         "layouts": {k: rw.LAYOUTS[k] for k in sorted(layouts)},
                                                         "save_schedule": rw.rows_schedule(committed["rows"]),
                                                         "marks_s": rw.MARKS_S})) == committed["settings"]


def test_the_chosen_layout_result_is_what_its_run_archive_says(tmp_path):
    """bench/results/chosen_4x_NVIDIA_H200_600s.json: its rows as `summarise` and its figures as
    `figures` compute them from the committed archive (the 1.5B run in it was cut short: no
    launch.json or summary.json, so it has figures and no row)."""
    committed = json.loads((RESULTS / "chosen_4x_NVIDIA_H200_600s.json").read_text())
    with tarfile.open(RESULTS / "real_workload" / "chosen_4x_NVIDIA_H200_600s_2bc9c28.tgz") as t:
        t.extractall(tmp_path / "w", filter="data")
    rw.main(["summarise", "--work-dir", str(tmp_path / "w"), "--results-dir", str(tmp_path / "out"),
             "--device-name", committed["device"]])
    assert json.loads((tmp_path / "out" / "real_workload_4x_NVIDIA_H200.json").read_text())["rows"] == committed["rows"]
    figures = {run: rw.run_figures(tmp_path / "w" / run) for run in committed["figures_from_run_files"]}
    assert figures == committed["figures_from_run_files"]
    assert [r["steps"] for r in figures.values()] == [602, 313] and not figures["1.5b_chosen_ours_s42"]["ended"]


def test_pack_makes_the_archive_a_committed_row_is_rebuilt_from(tmp_path):
    """`pack` over a lane's runs (plan M's 0.5B archive unpacked, a saved policy added the way a run on the
    device leaves one): one archive a run, named by device, commit, label and run, holding the runs'
    files less the weights, the extra file at the top; summarising it gives the committed row again."""
    committed = json.loads((RESULTS / "real_workload_2x_NVIDIA_H200.json").read_text())
    source = RESULTS / "real_workload" / "2x_NVIDIA_H200_9d0b76c-plan-m-0.5b.tgz"
    with tarfile.open(source) as t:
        t.extractall(tmp_path / "lane", filter="data")
        original = sorted(m.name for m in t.getmembers() if m.isfile() and m.name.startswith("./runs/"))
    runs = tmp_path / "lane" / "runs"
    saved = runs / "0.5b_1gpu-chosen_ours_s42" / "weights" / "step_30"
    saved.mkdir(parents=True)
    (saved / "model.safetensors").write_bytes(b"w" * 64)
    out = tmp_path / "results"
    rw.main(["pack", "--work-dir", str(runs), "--results-dir", str(out), "--device-name", committed["device"],
             "--extra", str(tmp_path / "lane" / "plan_m.sh")])
    made = sorted((out / "real_workload").iterdir())
    assert [p.name for p in made] == ["2x_NVIDIA_H200_9d0b76c-plan-m-0.5b_1gpu-chosen_ours_s42.tgz"]
    with tarfile.open(made[0]) as t:
        names = sorted(m.name for m in t.getmembers() if m.isfile())
        t.extractall(tmp_path / "again", filter="data")
    assert names == sorted(original + ["./plan_m.sh"]) and not any("weights" in n for n in names)
    rw.main(["summarise", "--work-dir", str(tmp_path / "again" / "runs"), "--results-dir", str(tmp_path / "sum"),
             "--device-name", committed["device"]])
    (row,) = json.loads((tmp_path / "sum" / "real_workload_2x_NVIDIA_H200.json").read_text())["rows"]
    assert row == next(r for r in committed["rows"] if r.get("label") == "plan-m" and r["model"] == "0.5b"
                       and r["trainer"] == "ours")
    with pytest.raises(SystemExit, match="pack: no file .*absent.sh"):
        rw.main(["pack", "--work-dir", str(runs), "--results-dir", str(out), "--extra", str(tmp_path / "absent.sh")])


def test_chunks_reassemble_to_the_checked_file(tmp_path, monkeypatch):
    data = bytes(range(256)) * 4099                   # 1,049,344 bytes: 1 MiB and a bit
    spec = {"package": "x", "parts": 1, "version": "0", "file": "m.gguf", "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest()}
    monkeypatch.setitem(fm.MODELS, "m", spec)
    monkeypatch.setattr(fm, "RECEIVE_DIR", tmp_path / "recv")
    (tmp_path / "m.gguf").write_bytes(data)
    folders = fm.chunks("m", tmp_path / "m.gguf", tmp_path / "out", chunk_mib=0.4, first_mib=0.25)
    sizes = [(f / f"m.gguf.{i:02d}").stat().st_size for i, f in enumerate(folders)]
    assert sizes == [262144, 419430, 367770]            # 0.25 MiB, 0.4 MiB, the rest
    assert json.loads((folders[1] / "MANIFEST.json").read_text())["chunks"] == 3
    assert fm.receive(folders[2]) is None and fm.receive(folders[0]) is None   # any order
    whole = fm.receive(folders[1])
    assert whole.read_bytes() == data and not list((tmp_path / "recv" / "parts").iterdir())
    (tmp_path / "bad.gguf").write_bytes(data[:-1] + b"x")
    assert "sha256" in fm.check_file(tmp_path / "bad.gguf", spec)


def test_any_file_splits_and_reassembles_with_its_own_checksum(tmp_path, monkeypatch):
    data = bytes(range(256)) * 2000                   # 512,000 bytes
    monkeypatch.setattr(fm, "RECEIVE_DIR", tmp_path / "recv")
    (tmp_path / "w.tar").write_bytes(data)
    folders = fm.split(tmp_path / "w.tar", tmp_path / "out", chunk_mib=0.2)
    assert [f.name for f in folders] == ["c00", "c01", "c02"]     # 209,715 + 209,715 + 92,570
    manifest = json.loads((folders[0] / "MANIFEST.json").read_text())
    assert manifest["bytes"] == 512000 and manifest["sha256"] == hashlib.sha256(data).hexdigest()
    assert fm.receive(folders[1]) is None and fm.receive(folders[2]) is None
    assert fm.receive(folders[0]).read_bytes() == data
    (folders[0] / "w.tar.00").write_bytes(b"x" + data[1:209715])  # a chunk spoilt on the way
    for f in folders:
        fm.receive(f) if f is not folders[-1] else None
    with pytest.raises(SystemExit, match="sha256"):
        fm.receive(folders[-1])
    # the spoilt assembly never took the file's name: a plan waiting for it sees the good one or none
    assert (tmp_path / "recv" / "w.tar").read_bytes() == data


def test_a_trl_vllm_row_is_trls_command_with_vllm_colocate_and_nothing_else_changed():
    """trl-vllm differs from trl by --use-vllm alone: same model, prompts, G, batch, tokens, loss."""
    tg = load_bench("trl_grpo")
    args = _args(device="auto")
    trl = rw.trl_command(args, {**rw.parse_row("tiny-random:2gpu:trl:3")}, Path("/r/a"))
    vllm = rw.trl_command(args, {**rw.parse_row("tiny-random:2gpu:trl-vllm:3")}, Path("/r/a"))
    assert vllm == trl + ["--use-vllm"]
    assert trl[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    # after [python, -m, torch.distributed.run, ..., trl_grpo.py], with the launch time as `launch` puts it
    parsed, plain = (tg.parse([c.replace("{launch}", "1000.0") for c in cmd[6:]]) for cmd in (vllm, trl))
    assert parsed.use_vllm and parsed.vllm_gpu_memory_utilization == 0.3 and not plain.use_vllm
    assert rw.parse_row("0.5b:1gpu:trl-vllm:42")["name"] == "0.5b_1gpu_trl-vllm_s42"


def test_the_trl_vllm_probe_figures_are_trl_rates_of_its_own_steps():
    """bench/results/trl_vllm_probe_0.5b_NVIDIA_H200.json: its summary is the benchmark's TRL rule
    (trl_rates) applied to the per-step records trl_grpo.py wrote, rounded as the file rounds."""
    doc = json.loads((Path(rw.ROOT) / "bench" / "results" / "trl_vllm_probe_0.5b_NVIDIA_H200.json").read_text())
    rates = rw.trl_rates(doc["per_step"], 1)
    assert round(rates["median_step_s"], 2) == doc["median_step_s"]
    assert round(rates["gen_tokens_per_s_per_gpu"]) == doc["completion_tokens_per_s_training"]
    assert doc["steps"] == len(doc["per_step"]) and doc["training_s"] == round(doc["per_step"][-1]["time_s"], 1)
    assert doc["config"]["use_vllm"] and "--use-vllm" in doc["command"] and doc["commit"] and doc["seed"] == 42


def test_a_rows_gpus_count_within_the_scripts_own_cuda_visible_devices():
    """--first-gpu 1 is the host's GPU 1, or entry 1 of a CUDA_VISIBLE_DEVICES the script was given
    (the launcher counts the same way, so `--gpus 0` in the row's command lands there)."""
    assert rw.row_gpus(1, 1, None) == "1" and rw.row_gpus(0, 2, "") == "0,1"
    assert rw.row_gpus(1, 1, "4,6") == "6" and rw.row_gpus(0, 2, "3,5,7") == "3,5"
