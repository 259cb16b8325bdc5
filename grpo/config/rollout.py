"""The rollout section: how the samplers generate completions (groups, rounds, the decoder, behaviour log-probs)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from grpo.config.bounds import at_least, positive

GenerationBackend = Literal["auto", "fast", "hf", "vllm"]
OldLogprobs = Literal["auto", "sampling", "pass"]


@dataclass
class RolloutSection:
    """What both roles must agree on about a completion, and the decoder."""

    section = "rollout"

    num_generations: int = at_least(2, 8, "GRPO's advantage compares a prompt's completions with each other")
    """G: completions per prompt; a group is the unit of transfer."""
    max_new_tokens: int = at_least(1, 256)
    """Longest completion, in tokens."""
    temperature: float = positive(1.0, "sampling divides the logits by it")
    """Sampling temperature; the learner scores with it too."""
    generation_backend: GenerationBackend = "auto"
    """Rollout and evaluation decoder: 'fast' (CUDA-graph engine), 'hf' (generate), 'vllm' (pip install '.[vllm]'); 'auto': fast on CUDA."""
    liger_decode: bool = True
    """Fast backend on CUDA: Liger-Kernel's RMSNorm, SwiGLU and rotary kernels in every decode, where installed (off: Hugging Face's)."""


@dataclass
class SamplerRolloutSection:
    """How a sampler sizes and decodes its rounds."""

    section = "rollout"

    prompts_per_round: int = at_least(0, 0, "0 sizes each round")
    """Prompts generated together; weights swap between rounds (0: sized each round to fill one learner step)."""
    max_prompts_per_round: int = at_least(1, 64)
    """Round size cap under --prompts-per-round 0."""
    in_flight_rows: int = at_least(0, 0, "0 for fixed rounds")
    """Fast backend: rows decoding at once, each refilled as it ends (0: fixed rounds)."""
    swap_in_flight: bool = True
    """In-flight rows take new weights between decode steps."""
    old_logprobs: OldLogprobs = "auto"
    """Behaviour log-probs: 'sampling' (as drawn), 'pass' (a teacher-forced pass), 'auto' (sampling where exact: fp32 fast engine)."""
    logprob_batch_size: int = at_least(1, 64)
    """Sequences per old/reference log-prob pass."""
    max_rounds: int = at_least(0, 0, "0: until the learner says stop")
    """Rounds to run (0: until the learner's stop)."""
    filter_zero_signal: bool = False
    """Drop all-equal-reward groups (DAPO dynamic sampling), counted."""
    defer_zero_signal: bool = False
    """Skip, once, a prompt whose last group had no signal."""
    screen_generations: int = at_least(0, 0, "0: whole groups at once")
    """Generate a prompt's first K completions first, the rest of its group only if their rewards differ (0: off)."""
    cuda_graphs: bool = True
    """CUDA-graph the fast decode step (off: eager, to debug)."""
    compile_decode: bool = False
    """torch.compile decode steps; implies --compile-ring."""
    compile_ring: bool = False
    """--in-flight-rows: torch.compile only its decode step."""
    refill_behind: bool = True
    """Refill ended rows while the queued decode steps run."""
    fused_sampling: bool = True
    """Fast backend on CUDA: draw each token with one Triton kernel (off: torch's ops)."""
    fused_attention: bool = True
    """Fast backend on CUDA, half precision: the in-flight ring's decode attention as one Triton kernel (off: SDPA's)."""
    vllm_gpu_memory_utilization: float = 0.0
    """vLLM backend: its share of the GPU's memory (0: from the memory plan)."""
    vllm_tensor_parallel_size: int = at_least(1, 1)
    """vLLM backend: GPUs one sampler spreads over (tensor parallel: it takes that many of --sampling-gpus)."""
    vllm_engine_process: bool = False
    """vLLM backend: its engine core in a process of its own (vLLM's default), stepping while the sampler reads."""
    attend_chunk: int = at_least(0, 64, "0: the whole cache at every step")
    """Fast backend: a decode step attends to the filled cache in chunks of this many slots (0: the whole cache)."""
