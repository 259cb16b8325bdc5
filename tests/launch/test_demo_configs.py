"""`make demo`'s settings live in configs/demo_{gpu,cpu}.yaml: each parses for the launcher and both
workers, every key reaches each role that has it, and the Makefile runs those files. The README's
config example holds to the same rule."""
import re
from pathlib import Path

import pytest
import yaml

from grpo.config import LearnerConfig, SamplerConfig, flat
from grpo.flags import parse_config
from grpo.launch.plan import parse

ROOT = Path(__file__).resolve().parents[2]


def every_role_reads(path: Path) -> tuple:
    """The file parsed by the launcher and both workers, each key's value as each role that has it
    reads it, and every key read by some role."""
    data = yaml.safe_load(path.read_text())
    launch, to_s, to_l = parse(["--config", str(path)])
    learner = parse_config(LearnerConfig, ["--config", str(path)], "training_worker.py")
    sampler = parse_config(SamplerConfig, ["--config", str(path)], "sampling_worker.py")
    seen = set()
    for cfg in (launch, learner, sampler):
        fields = flat(cfg)
        for key, value in data.items():
            if key in fields:
                seen.add(key)
                got = fields[key]
                want = ",".join(map(str, value)) if isinstance(value, list) else value
                assert got == want, (path.name, type(cfg).__name__, key, got, want)
    assert seen == set(data)                     # no key that no role reads
    return launch, learner, sampler


@pytest.mark.parametrize("name", ["demo_gpu", "demo_cpu"])
def test_demo_config_reaches_every_role(name):
    launch, learner, sampler = every_role_reads(ROOT / "configs" / f"{name}.yaml")
    assert learner.loss.loss_type == "dapo" and learner.data.dataset == sampler.data.dataset
    if name == "demo_cpu":
        assert sampler.data.dataset == "rg:letter_counting" and sampler.run.model == "smollm2"
        assert (learner.run.device, learner.training.train_batch_size, learner.training.max_time_s,
                sampler.rollout.num_generations) == \
            ("cpu", 8, 60.0, 4)
    else:
        # the real workload: a short name fetched from the package index, GSM8K, the launcher's split of one GPU
        assert (sampler.run.model, sampler.data.dataset, launch.placement.gpus) == ("qwen2.5-coder-0.5b",
                                                                                    "openai/gsm8k", "0")
        assert (learner.training.train_batch_size, learner.training.max_time_s, sampler.rollout.num_generations,
                sampler.evaluation.eval_size) == \
            (128, 230.0, 16, 500)


def test_the_makefile_runs_the_demo_configs():
    make = (ROOT / "Makefile").read_text()
    assert "--config configs/demo_gpu.yaml" in make and "--config configs/demo_cpu.yaml" in make


def test_the_readmes_config_example_reaches_every_role(tmp_path):
    (block,) = re.findall(r"```yaml\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    (tmp_path / "example.yaml").write_text(block)
    launch, learner, sampler = every_role_reads(tmp_path / "example.yaml")
    assert launch.placement.gpus == "0,1,2,3" and learner.loss.loss_type == "dapo" and sampler.data.reward == "correctness,format=0.2"
