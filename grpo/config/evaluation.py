"""The evaluation section: greedy pass@1 on held-out problems during a run, and python -m grpo.evaluate's options."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from grpo.config.bounds import at_least
from grpo.config.constants import DEFAULT_DATASET, DEFAULT_MODEL
from grpo.config.run import Device

# python -m grpo.evaluate decodes with our engine, Hugging Face generate or vLLM's engine (an optional extra)
EvalBackend = Literal["auto", "fast", "hf", "vllm"]


@dataclass
class EvaluationSection:
    """When a run evaluates, and on what."""

    section = "evaluation"

    eval_every: int = at_least(0, 0, "0: no evaluation")
    """Sampler 0 evaluates at version 0 and whenever its version reaches a multiple of N; the learner evaluates its final weights (0: no evaluation)."""
    eval_size: int = 500
    """Problems in the fixed evaluation subset: the first N of the test split."""
    eval_dataset: str = ""
    """Data set to evaluate on (default: --dataset; a data file's held-out 10% of rows, which training leaves out)."""
    eval_batch_size: int = at_least(1, 256)
    """Sequences decoded together during evaluation."""


@dataclass
class EvalConfig:
    """python -m grpo.evaluate: greedy pass@1 of a model on the first N test problems."""

    model: str = DEFAULT_MODEL
    """'smollm2', a Hugging Face folder, a run's checkpoint (runs/<id>/checkpoints/step_N, its hf/) or LoRA adapter (lora_adapter/), a hub id or a .gguf file."""
    base_model: str = ""
    """A LoRA adapter's base model (default: the one its run's config_learner.json names, else the adapter's base_model_name_or_path)."""
    dataset: str = DEFAULT_DATASET
    """'openai/gsm8k', a folder with test.jsonl (e.g. ../shared/data/gsm8k), a data file (its held-out 10%), or rg:<task>."""
    eval_size: int = 500
    """Evaluate on the first N problems of the test split (0: all)."""
    eval_batch_size: int = 256
    """Sequences decoded together."""
    max_new_tokens: int = 256
    """Longest completion, in tokens."""
    device: Device = "auto"
    """'auto', 'cuda' or 'cpu'."""
    gpu_id: int = -1
    """CUDA device index (-1: 0)."""
    out: str = ""
    """Also write the result as JSON to this file."""
    generation_backend: EvalBackend = "auto"
    """Greedy decoding with 'fast' (our engine), 'hf' (Hugging Face generate), 'vllm' (pip install '.[vllm]', CUDA) or 'auto' (fast on CUDA, hf on CPU): the training run's decoder."""
