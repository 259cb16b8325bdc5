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
    """'smollm2', 'tiny-random', 'random:qwen2.5-0.5b' (or -1.5b, -3b, -7b), a Hugging Face causal LM id or folder, or a .gguf file."""
    device: Device = "auto"
    """'auto' (CUDA when present, else CPU), 'cuda' or 'cpu' (gloo)."""
    host: str = "127.0.0.1"
    """The learner's address: samplers connect to it, rank 0 binds it."""
    data_port: int = bounded(DATA_PORT, least=1, most=65535)
    """Data channel port (learner PULL, samplers PUSH)."""
    sync_port: int = bounded(SYNC_PORT, least=1, most=65535)
    """Weights channel port (learner ROUTER, samplers DEALER)."""
    run_dir: str = ""
    """Run directory (empty: runs/<run_id>/)."""
    seed: int = 42
    """Random seed (random, numpy, torch)."""
    config: str = ""
    """YAML file of options (field names as keys); flags on the command line win."""
    cudnn_attention: bool = False
    """CUDA: allow cuDNN's attention kernels (why off: docs/configuration.md)."""
    fused_logprobs: bool = True
    """CUDA: each log-prob chunk's log-softmax and its gradient as Triton kernels over the logits (off: torch's float32 ops)."""


@dataclass
class SamplerRunSection:
    """Which sampler this process is, on which GPU."""

    section = "run"

    gpu_id: int = -1
    """CUDA device of this sampler (-1: device 0 when CUDA is used)."""
    sampler_id: int = at_least(0, 0)
    """This sampler's index; with --num-samplers it picks a disjoint shard of the prompts."""
    num_samplers: int = at_least(1, 1)
    """Samplers sharing the data set (prompts are sharded i % num_samplers)."""


@dataclass
class LearnerRunSection:
    """Which GPU this learner rank uses."""

    section = "run"

    gpu_id: int = -1
    """CUDA device of this rank (-1: LOCAL_RANK, or 0)."""
