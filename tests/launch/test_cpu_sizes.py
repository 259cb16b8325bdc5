"""A CPU run at a CPU's size (grpo.launch.cpusize, grpo.launch.main.size_for_cpu): where the user sized
no step, the launcher takes G 4, two groups a step, 64 new tokens, --beta 0 and rounds of one step, says
so in one line, and every process gets them; a run the user sized (a flag or a --config key) is kept
whole; a CUDA run is never touched; and a CPU run whose settings will take long is warned about, by an
estimate worked by hand here. No process starts: these are the launcher's plan, as main() makes it."""
from __future__ import annotations

import pytest

from grpo.launch import cpusize
from grpo.launch import main as launch_main
from grpo.config import LearnerConfig, SamplerConfig
from grpo.flags import parse_config
from grpo.launch.plan import parse, place, specs
from grpo.launch.runplan import from_flags, with_placement

GSM8K = ["--dataset", "../shared/data/gsm8k"]


def planned(argv: list[str], cuda_count: int = 0):
    """(the learner's config, the sampler's, the sizing) as main() plans argv, each as its worker
    parses the argv the launcher writes for it."""
    cfg, to_s, to_l = parse(argv)
    rp, sizing = launch_main.size_for_cpu(from_flags(cfg, to_s, to_l), argv, cuda_count)
    launch_main.say_cpu_sizing(sizing, rp.launch.run.model)
    procs = specs(with_placement(rp, place(rp.launch, cuda_count)), 29500)
    learner = next(parse_config(LearnerConfig, s.argv[2:], "l") for s in procs if s.role == "learner")
    sampler = next(parse_config(SamplerConfig, s.argv[2:], "s") for s in procs if s.role == "sampler")
    return learner, sampler, sizing


def test_the_newcomers_cpu_run_is_sized_for_cpu(capsys):
    """The issue's command: at the GPU defaults its round 0 took 441 s on two cores; now every process
    gets the CPU sizes, and the line says each against its default."""
    learner, sampler, sizing = planned(["--device", "cpu", "--max-steps", "2", *GSM8K])
    for role in (learner, sampler):
        assert (role.rollout.num_generations, role.rollout.max_new_tokens) == (4, 64)
    assert (learner.training.train_batch_size, learner.loss.beta) == (8, 0.0)
    assert sampler.rollout.prompts_per_round == 2       # one step's 2 groups, one sampler
    assert capsys.readouterr().out == (
        "[launcher] on CPU: --num-generations 4 --train-batch-size 8 --max-new-tokens 64 --beta 0 "
        "--prompts-per-round 2, not the defaults 8, 16, 256, 0.04, 0, so that a step takes seconds on a few cores "
        "instead of minutes (2 groups of 4 a step, up to 64 new tokens each, no KL term, so no reference pass); "
        "give any of them to choose\n")
    assert cpusize.slow_warning(134_515_008, sizing) is None   # SmolLM2-135M: ~14 s a step, 2 steps


def test_two_samplers_share_a_step():
    _, sampler, _ = planned(["--device", "cpu", "--training-ranks", "2", "--num-samplers", "2", *GSM8K])
    assert sampler.rollout.prompts_per_round == 1       # 2 samplers x 1 group = a step of 2


def test_auto_without_a_gpu_is_a_cpu_run():
    learner, _, sizing = planned(GSM8K, cuda_count=0)
    assert sizing.chosen and learner.training.train_batch_size == 8


@pytest.mark.parametrize("given", [
    ["--num-generations", "8"], ["--train-batch-size", "16"], ["--max-new-tokens=256"],
])
def test_a_run_the_user_sized_is_kept_whole(given, capsys):
    """Any one step size given: none chosen (not G 4 beside the user's batch 16, nor --beta 0 behind
    their back), and the CPU line is not said."""
    learner, sampler, sizing = planned(["--device", "cpu", *GSM8K, *given])
    assert sizing.chosen == () and learner.loss.beta == 0.04 and sampler.rollout.prompts_per_round == 0
    assert learner.rollout.num_generations == 8 and "on CPU" not in capsys.readouterr().out


def test_a_config_key_counts_as_given(tmp_path):
    (tmp_path / "run.yaml").write_text("device: cpu\nmax-new-tokens: 32\n")   # dashes, as files may spell keys
    learner, _, sizing = planned(["--config", str(tmp_path / "run.yaml"), *GSM8K])
    assert sizing.chosen == () and learner.rollout.max_new_tokens == 32


def test_beta_and_rounds_given_are_kept():
    learner, sampler, sizing = planned(["--device", "cpu", *GSM8K, "--beta", "0.04", "--prompts-per-round", "3"])
    assert learner.loss.beta == 0.04 and sampler.rollout.prompts_per_round == 3
    assert learner.training.train_batch_size == 8 and sizing.beta == 0.04


def test_a_refused_cpu_launch_says_its_mistake_alone(capsys):
    """The sizing is said once the run is sure to start, not before a one-line refusal."""
    assert launch_main.main(["--device", "cpu", "--reward", "correctnes", *GSM8K]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("run_distributed.py: error: --reward: unknown reward 'correctnes'")


def test_a_cuda_run_is_left_alone(capsys):
    learner, _, sizing = planned(["--device", "cuda", "--sampling-gpus", "0", "--training-gpus", "1"], cuda_count=2)
    assert sizing is None and learner.rollout.num_generations == 8 and "on CPU" not in capsys.readouterr().out


def test_the_estimate_worked_by_hand():
    """params x completions x tokens / CPU_PARAM_TOKENS_PER_S a step, 1.25 x with a reference pass,
    plus CPU_START_S; a --max-time-s caps the training at one step past it."""
    sized = cpusize.CpuSizing((), 4, 8, 64, 0.0, 10, 0.0)
    step, total = cpusize.estimate_s(100_000_000, sized)
    assert step == pytest.approx(1e8 * 8 * 64 / 5e9) and total == pytest.approx(25 + 10 * step)
    gpu_defaults = cpusize.CpuSizing((), 8, 16, 256, 0.04, 2, 0.0)
    step, total = cpusize.estimate_s(134_515_008, gpu_defaults)
    assert step == pytest.approx(134_515_008 * 16 * 256 * 1.25 / 5e9)    # ~138 s: the 441 s round
    assert total == pytest.approx(25 + 2 * step)                         # made 4 steps' groups
    timed = cpusize.CpuSizing((), 4, 16, 48, 0.0, 100_000, 60.0)         # the CPU demo: 60 s of training
    step, total = cpusize.estimate_s(134_515_008, timed)
    assert total == pytest.approx(25 + 60 + step)


def test_the_warning_names_the_cost_and_the_ways_out():
    line = cpusize.slow_warning(134_515_008, cpusize.CpuSizing((), 8, 16, 256, 0.04, 2, 0.0))
    assert line == ("on CPU these settings take long: about 138 s a step (16 completions of up to 256 tokens, "
                    "135M parameters, a reference pass (--beta > 0)), so about 5 min to its last step on two cores; "
                    "a smaller --max-steps, --train-batch-size or --max-new-tokens, --beta 0 or --model tiny-random "
                    "finishes sooner")
    # the default 100 steps at CPU sizes: 25 s + 100 x 13.8 s
    assert "about 23 min" in cpusize.slow_warning(134_515_008, cpusize.CpuSizing((), 4, 8, 64, 0.0, 100, 0.0))
    assert cpusize.slow_warning(None, cpusize.CpuSizing((), 8, 16, 256, 0.04, 100, 0.0)) is None   # size unknown


def test_a_sized_run_that_will_take_long_is_warned_about(capsys):
    """The user's own sizes are kept, with no CPU line, and what they cost is the warning the
    supervisor says once the run is sure to start (grpo.launch.supervisor.run's `warnings`)."""
    argv = ["--device", "cpu", "--num-generations", "8", "--max-steps", "20", *GSM8K]
    cfg, to_s, to_l = parse(argv)
    rp, sizing = launch_main.size_for_cpu(from_flags(cfg, to_s, to_l), argv, 0)
    warning = launch_main.say_cpu_sizing(sizing, rp.launch.run.model)
    out, err = capsys.readouterr()
    assert out == "" and err == ""
    assert warning.startswith("on CPU these settings take long: about 138 s a step (16 completions of up to 256 "
                              "tokens, 135M parameters, a reference pass")
    assert "about 46 min to its last step" in warning
