"""Which decoder a process uses: --generation-backend's rule, without torch, so the launcher can
tell whether a sampler will have rows in flight before any worker starts."""
from __future__ import annotations

import importlib.util

VLLM_MISSING = "--generation-backend vllm needs vLLM: pip install '.[vllm]'"


def vllm_installed() -> bool:
    """Whether vLLM can be imported here (without importing it: it starts its runtime)."""
    return importlib.util.find_spec("vllm") is not None


def backend_for(choice: str, device_type: str) -> str:
    """The decoder --generation-backend `choice` gives a process on `device_type` ('cuda' or 'cpu'):
    auto is the fast engine on CUDA and Hugging Face generate on CPU (why: grpo.generate.backend)."""
    if choice == "auto":
        return "fast" if device_type == "cuda" else "hf"
    return choice


# What `auto` rests on where CUDA leaves a choice: each engine's decode rate as a sampler runs it (vLLM
# with its engine core in a process of its own: --vllm-engine-process, its faster mode), one H200, bench/rollout.py's
# in-flight workload on GSM8K train prompts, both engines in one run, by model size: (parameters, our
# engine's tokens/s, vLLM's tokens/s). docs/benchmarks.md, "vLLM's engine core in a process of its
# own" (bf16, vLLM 0.25): Qwen2.5-Coder-0.5B, 96 prompts x 16, up to 512 tokens, 320 rows;
# Qwen2.5-7B's shapes with random weights, 32 prompts x 16, 256 tokens, 256 rows.
MEASURED_DECODE: tuple[tuple[int, float, float], ...] = ((494_032_768, 48_994.0, 22_131.0),
                                                         (7_615_616_512, 23_586.0, 13_575.0))


def auto_engine(params: int, vllm_installed: bool,
                measured: tuple[tuple[int, float, float], ...] = MEASURED_DECODE) -> tuple[str, str]:
    """--generation-backend auto on CUDA for a model of `params` parameters: the engine that decoded
    faster at the measured size nearest it (by ratio), among the installed ones; (its name, the one
    line that says why). 1.5e9 against sizes 0.5e9 and 7e9: 0.5e9 is nearer (3x against 4.7x)."""
    if params < 1:
        raise ValueError(f"auto_engine: a model has at least one parameter, got {params}")
    if not vllm_installed:
        return "fast", "--generation-backend auto: fast (vLLM is not installed, so nothing to weigh it against)"
    size, fast, vllm = min(measured, key=lambda m: max(m[0], params) / min(m[0], params))
    name = "vllm" if vllm > fast else "fast"
    return name, (f"--generation-backend auto: {name}: at {size / 1e9:.2f}B parameters, the measured size nearest "
                  f"this model's {params / 1e9:.2f}B, our engine decoded {fast / 1e3:.1f}k tokens/s and vLLM's "
                  f"{vllm / 1e3:.1f}k in one sampler on one H200 (docs/benchmarks.md)")
