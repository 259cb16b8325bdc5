"""bench/time_to_accuracy.py: its rules by hand, its evaluator on the tiny model, and the committed
result rebuilt from the committed run files."""
import json
from pathlib import Path

import pytest
import torch
from benchload import load_bench

from grpo.learner.checkpoint import _save_hf
from grpo.model import load_causal_lm, load_tokenizer, resolve_model

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
tta = load_bench("time_to_accuracy")


def test_wilson_interval_hand_worked():
    # 0/10: centre = (z^2/20)/(1 + z^2/10) = half, so [0, z^2/(10 + z^2)] = [0, 3.8416/13.8416]
    assert tta.wilson(0, 10) == [0.0, 0.2775]
    # 5/10: centre 0.5, half = 1.96 * sqrt(0.025 + 0.009604) / 1.38416 = 0.26341
    assert tta.wilson(5, 10) == [0.2366, 0.7634]
    assert tta.wilson(0, 0) == [0.0, 1.0]


POINTS = [{"seconds": 0.0, "accuracy": 0.15}, {"seconds": 40.0, "accuracy": 0.31},
          {"seconds": 70.0, "accuracy": 0.29}, {"seconds": 100.0, "accuracy": 0.30}]


def test_task_slug_is_a_plain_file_name():
    assert tta.task_slug("rg:letter_counting") == "letter_counting"
    assert tta.task_slug("rg:basic_arithmetic:min_terms=2,max_terms=2,max_digits=1") == \
        "basic_arithmetic_min_terms_2_max_terms_2_max_digits_1"


def test_seconds_to_and_accuracy_at_hand_worked():
    assert tta.seconds_to(POINTS, 0.30) == 40.0          # the first point at or above, not the last
    assert tta.seconds_to(POINTS, 0.305) == 40.0
    assert tta.seconds_to(POINTS, 0.32) is None
    assert tta.seconds_to(POINTS, 0.0) is None           # a zero baseline has no meaningful 2x
    assert tta.accuracy_at(POINTS, 69.9) == 0.31         # the newest weights saved by then
    assert tta.accuracy_at(POINTS, 600.0) == 0.30        # a run that ended before: its last
    assert tta.accuracy_at(POINTS[1:], 10.0) is None


def test_trl_runs_five_times_the_slower_seed_within_the_budget():
    assert tta.trl_seconds([100.0, 120.0], 1000.0) == (600.0, "5x ours")
    assert tta.trl_seconds([100.0, 250.0], 1000.0) == (1000.0, "budget")   # 1250 s would not fit
    assert tta.trl_seconds([100.0, None], 1000.0) == (1000.0, "budget")    # a seed never got there
    assert tta.trl_seconds([100.0], -5.0) == (0.0, "budget")


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
    tta.load_into(target, tmp_path / "v")
    assert [p.data_ptr() for p in target.parameters()] == ptrs          # the engine's graphs stay valid
    for (n, a), b in zip(target.named_parameters(), other.parameters()):
        assert torch.equal(a, b.to(torch.bfloat16)), n
    (tmp_path / "v" / "model.safetensors").rename(tmp_path / "gone")
    with pytest.raises(SystemExit, match="lacks"):
        tta.load_into(target, tmp_path / "v")


def test_score_puts_each_save_at_its_seconds_from_launch(tiny, tmp_path):
    """A saved version equal to the base weights scores exactly the base score (one decoder), at
    wall_time - launch_time; a second call scores nothing twice."""
    path, tok, model = tiny
    run = tmp_path / "ours_seed42"
    (run / "weights").mkdir(parents=True)
    (run / "launch.json").write_text(json.dumps({"system": "ours", "seed": 42, "launch_time": 1000.0,
                                                 "wall_s": 60.0, "exit_code": 0, "command": []}))
    _save_hf(model, tok, run / "weights" / "step_7")
    (run / "weights" / "step_7" / "weights.json").write_text(json.dumps({"step": 7, "wall_time": 1042.5}))
    argv = ["score", "--work-dir", str(tmp_path), "--model", "tiny-random", "--eval-size", "3", "--device", "cpu"]
    tta.main(argv)
    tta.main(argv)
    base = json.loads((tmp_path / "base_score.json").read_text())
    lines = [json.loads(x) for x in (run / "scores.jsonl").read_text().splitlines()]
    assert len(lines) == 1 and lines[0]["step"] == 7 and lines[0]["seconds"] == 42.5
    assert (lines[0]["accuracy"], lines[0]["correct"], lines[0]["n"]) == (base["accuracy"], base["correct"], 3)
    assert lines[0]["mean_completion_len"] == base["mean_completion_len"]


def test_the_committed_result_is_what_its_run_files_say(tmp_path):
    committed = json.loads((RESULTS / "time_to_accuracy_NVIDIA_H200.json").read_text())
    for name in committed["tasks"]:
        work = RESULTS / "time_to_accuracy" / tta.task_slug(name)
        out = tta.main(["summarise", "--work-dir", str(work), "--results-dir", str(tmp_path)])
        assert out == 0
        again = json.loads((tmp_path / "time_to_accuracy_NVIDIA_H200.json").read_text())
        assert again["tasks"][name] == committed["tasks"][name]
    lc = committed["tasks"]["rg:letter_counting"]
    assert lc["baseline_accuracy"] >= 0.1 and lc["baseline_ci95"][0] < lc["baseline_accuracy"] < lc["baseline_ci95"][1]
    assert lc["systems"]["trl"]["runs"][0]["trl_version"] == "1.16.0"
    assert len(committed["tasks"]) >= 2                                # the issue asks for two tasks
    for task in committed["tasks"].values():
        assert task["baseline_accuracy"] >= 0.1
        assert [r["seed"] for r in task["systems"]["ours"]["runs"]] == [1, 42]   # two seeds, the slower counts
        times = [r["seconds_to_2x_baseline"] for r in task["systems"]["ours"]["runs"]]
        assert task["systems"]["ours"]["seconds_to_2x_baseline"] == (None if None in times else max(times))


def test_a_failed_trl_run_gets_its_steps_and_error_from_its_log(tmp_path):
    """TRL died before writing steps.json (as on the H200, a NaN gradient then a sampling assert):
    its books come from the dicts the Trainer printed, and the error from the log's last line of one."""
    run = tmp_path / "trl"
    run.mkdir()
    (run / "command.log").write_text(
        "Loading weights: 100%\n"
        "{'loss': '0.1', 'grad_norm': '0.5', 'reward': '0.25', 'frac_reward_zero_std': '0.5', 'entropy': '2'}\n"
        "{'loss': '0', 'grad_norm': 'nan', 'reward': '0.5', 'frac_reward_zero_std': '0.25', 'entropy': '1'}\n"
        "Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n"
        "torch.AcceleratorError: CUDA error: device-side assert triggered\n"
        "Search for `cudaErrorAssert' in the CUDA docs.\n")
    books = tta.trl_books(run, {"exit_code": 1})
    assert books["steps"] == 2 and books["completions_trained"] == 2 * tta.SHARED["train_batch_size"]
    assert books["zero_signal_fraction"] == 0.375                      # (0.5 + 0.25) / 2
    assert books["nonfinite_grad_steps"] == [2]
    assert books["error"] == "AcceleratorError: CUDA error: device-side assert triggered"
    assert books["books_from"].startswith("command.log")
    assert tta.last_error("all fine\n") is None


def test_a_labelled_rerun_keeps_the_first_run_of_the_task(tmp_path):
    """--label (kept in the run's device.json): the rerun gets 'TASK (LABEL)' and its own PNG; the
    task's first entry stays as it was."""
    import shutil

    committed = RESULTS / "time_to_accuracy_NVIDIA_H200.json"
    shutil.copy(committed, tmp_path / committed.name)
    work = tmp_path / "rerun"
    shutil.copytree(RESULTS / "time_to_accuracy" / "letter_counting", work)
    meta = json.loads((work / "device.json").read_text())
    (work / "device.json").write_text(json.dumps({**meta, "label": "after rollouts"}))
    assert tta.main(["summarise", "--work-dir", str(work), "--results-dir", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / committed.name).read_text())
    before = json.loads(committed.read_text())["tasks"]
    assert set(doc["tasks"]) == set(before) | {"rg:letter_counting (after rollouts)"}
    assert doc["tasks"]["rg:letter_counting"] == before["rg:letter_counting"]
    rerun = doc["tasks"]["rg:letter_counting (after rollouts)"]
    assert rerun["label"] == "after rollouts" and rerun["task"] == "rg:letter_counting"
    assert (tmp_path / "time_to_accuracy_NVIDIA_H200_letter_counting_after_rollouts.png").is_file()
    assert tta.task_slug("rg:letter_counting (after rollouts)") == "letter_counting_after_rollouts"
