"""The run section: which model on which device, where the run directory is, the learner's address and ports."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from grpo.config.bounds import at_least, bounded
from grpo.config.constants import DATA_PORT, DEFAULT_MODEL, SYNC_PORT

Device = Literal["auto", "cuda", "cpu"]


@dataclass
class RunSection:
    """Every process's model, device, addresses and run directory."""

    section = "run"

    model: str = DEFAULT_MODEL
    """'smollm2' (the embedded SmolLM2-135M-Instruct), 'tiny-random' (a 2-layer random model for tests), 'random:qwen2.5-0.5b', '-1.5b', '-3b' or '-7b' (random weights of that Qwen2.5's shapes), any Hugging Face causal LM id or folder, or a .gguf file of an architecture transformers can de-quantise (converted once into the model cache, GRPO_CACHE or ~/.cache/grpo)."""
    device: Device = "auto"
    """'auto' (CUDA when present, else CPU), 'cuda' or 'cpu' (gloo)."""
    host: str = "127.0.0.1"
    """Address of the learner: samplers connect to it, learner rank 0 binds it."""
    data_port: int = bounded(DATA_PORT, least=1, most=65535)
    """Port of the data channel (learner PULL, samplers PUSH)."""
    sync_port: int = bounded(SYNC_PORT, least=1, most=65535)
    """Port of the weight channel (learner ROUTER, samplers DEALER)."""
    run_dir: str = ""
    """Run directory (default runs/<run_id>/, made when empty)."""
    seed: int = 42
    """Random seed (random, numpy, torch)."""
    config: str = ""
    """YAML file of options (keys are these field names, dashes or underscores); flags given on the command line override it."""
    cudnn_attention: bool = False
    """CUDA: let attention use cuDNN's kernels, which torch prefers on Hopper; off, it uses FlashAttention or the memory-efficient kernels, since cuDNN builds a graph for each new input shape and a step's shapes change every step (host time, docs/benchmarks.md)."""


@dataclass
class SamplerRunSection:
    """Which sampler this process is, on which GPU."""

    section = "run"

    gpu_id: int = -1
    """CUDA device index for this sampler (-1: device 0 when CUDA is used)."""
    sampler_id: int = at_least(0, 0)
    """This sampler's index; with --num-samplers it picks a disjoint shard of the prompts."""
    num_samplers: int = at_least(1, 1)
    """How many samplers share the data set (prompts are sharded i % num_samplers)."""


@dataclass
class LearnerRunSection:
    """Which GPU this learner rank uses."""

    section = "run"

    gpu_id: int = -1
    """CUDA device index for this rank (-1: LOCAL_RANK, or 0)."""
