"""bench/learning_run.py's RUN_FLAGS (the settings the next GPU learning run uses) parse through
run_distributed.py's launcher and reach the sampler and learner as intended: a typo there
would only show on the GPU machine, after its setup time."""
from pathlib import Path

import pytest
from benchload import load_bench

from grpo.config import LearnerConfig, SamplerConfig
from grpo.flags import parse_config
from grpo.launch.plan import parse, plan
from grpo.learner.setup import check_loss_options

GSM8K_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k"
RUN_TRANSFORM = "bench/gsm8k_curriculum.py:at_most_2_steps"


def run_flags() -> list[str]:
    return load_bench("learning_run").RUN_FLAGS


def test_next_learning_run_settings_reach_both_roles():
    launch, to_s, to_l = parse(run_flags() + ["--dataset", "data/gsm8k"])
    specs = {p.name: p for p in plan(launch, 2, to_s, to_l, 29500)}
    assert set(specs) == {"learner0", "sampler0", "sampler1"}
    # Sampler 0 on GPU 0, the learner on GPU 1, and a second sampler beside it on GPU 1 (the
    # learner waits for signal most of the time). Each sampler also sees the learner's GPU, for ipc.
    assert [specs[n].env["CUDA_VISIBLE_DEVICES"] for n in ("sampler0", "sampler1", "learner0")] == ["0,1", "1", "1"]
    sampler = parse_config(SamplerConfig, specs["sampler0"].argv[2:], "s")   # [python, script, flags...]
    second = parse_config(SamplerConfig, specs["sampler1"].argv[2:], "s")
    learner = parse_config(LearnerConfig, specs["learner0"].argv[2:], "l")
    # Both roles must agree on the length: the sampler generates up to it, the learner's
    # masking and normalisers use it.
    assert sampler.max_new_tokens == second.max_new_tokens == learner.max_new_tokens == 512
    check_loss_options(learner)   # what the learner checks first on the GPU machine
    assert (learner.loss_type, learner.mask_truncated, learner.learning_rate, learner.beta) == ("dapo", False, 5e-5, 0.0)
    assert learner.max_staleness == 8 and learner.filter_zero_signal
    assert (sampler.num_generations, sampler.prompts_per_round, sampler.reward) == (16, 128, "correctness")
    # The two samplers take disjoint halves of the same (curriculum-filtered) train problems.
    assert (sampler.sampler_id, second.sampler_id, sampler.num_samplers, second.num_samplers) == (0, 1, 2, 2)
    assert sampler.dataset_transform == second.dataset_transform == "bench/gsm8k_curriculum.py:at_most_2_steps"
    # Zero-signal groups are dropped at the source (before their log-prob passes) and, should
    # any still arrive, at the learner.
    assert sampler.filter_zero_signal and second.filter_zero_signal
    assert learner.train_batch_size == 128 and sampler.generation_backend == learner.generation_backend == "fast"


def test_curriculum_keeps_train_problems_by_solution_steps(tmp_path):
    """The run's --dataset-transform, loaded as the sampler loads it, on a hand-made file: the
    step count is the reference solution's lines before '####'."""
    import json

    from grpo.data.sources import load_problems

    solutions = {"one": "A<<1+1=2>>2\n#### 2", "two": "A\nB\n#### 3", "three": "A\nB\n\nC\n#### 4"}
    rows = [{"question": q, "answer": a} for q, a in solutions.items()]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    mod = load_bench("gsm8k_curriculum")
    assert [mod.solution_steps(a) for a in solutions.values()] == [1, 2, 3]   # the blank line is no step
    kept = load_problems(str(tmp_path), "train", transform=RUN_TRANSFORM)
    assert [p.question for p in kept] == ["one", "two"]
    assert [p.question for p in load_problems(str(tmp_path), "train",
                                              transform="bench/gsm8k_curriculum.py:at_most_3_steps")] == list(solutions)


def test_curriculum_on_gsm8k_train_and_not_on_the_test_subset():
    """1,961 of GSM8K's 7,473 train problems have two-step solutions; the evaluation subset is
    the first 500 test problems whatever the run's transform (it is never applied to them)."""
    from grpo.data.sources import load_problems
    from grpo.evaluate import eval_problems

    if not (GSM8K_DIR / "train.jsonl").is_file():
        pytest.skip(f"{GSM8K_DIR} is missing")
    assert len(load_problems(str(GSM8K_DIR), "train", transform=RUN_TRANSFORM)) == 1961
    assert len(eval_problems(str(GSM8K_DIR), 500)) == 500


def test_summary_reads_the_sampler_rounds_of_both_log_formats(tmp_path):
    """The plot's all-completion train reward comes from sampler 0's round lines: the format
    of learning run 3 (no timing split) and the current one (split, zero-signal count)."""
    log = tmp_path / "sampler0.log"
    log.write_text(
        "04:42:20 sampler0 INFO sampler 0/1 on cuda:0: 7473 prompts in its shard\n"
        "04:42:34 sampler0 INFO round 0 (v0): 512 completions, 104637 tokens in 2.37 s (44196 tok/s), "
        "reward mean 0.020 | gpu 0% 13.2/150.8 GB\n"
        "07:27:28 sampler0 INFO round 1 (v3): 2048 completions, 673473 tokens in 15.45 s (43580 tok/s); "
        "log-probs 1.02 s, rewards 2.42 s; reward mean 0.011, 111 of 128 groups zero-signal | gpu 83%\n")
    assert load_bench("learning_run")._sampler_rounds(log) == [
        {"round": 0, "version": 0, "completions": 512, "reward_mean": 0.020},
        {"round": 1, "version": 3, "completions": 2048, "reward_mean": 0.011}]


def test_summary_reproduces_the_committed_run_7_result(tmp_path):
    """`learning_run.py summarise` on run 7's committed raw files (a copy: it writes a PNG into
    the run directory) gives the committed JSON's numbers, and marks the evaluations of that run
    as decoder-unknown (they predate the field)."""
    import json
    import shutil

    committed = Path(__file__).resolve().parents[2] / "bench" / "results" / "learning_run_7"
    run = tmp_path / "run7"
    shutil.copytree(committed, run)
    doc = load_bench("learning_run").summarise(run, "2x NVIDIA H200", tmp_path / "out")
    old = json.loads((committed / "learning_2x_NVIDIA_H200.json").read_text())
    assert (doc["steps"], doc["baseline_accuracy"], doc["final_accuracy"], doc["final_eval_version"]) == \
        (118, 0.024, 0.018, 118)
    assert [e["decoder"] for e in doc["evals"]] == [None] * 4
    for e in doc["evals"]:
        e.pop("decoder")
    assert doc == old
    assert (run / "learning.png").stat().st_size > 10_000
