"""Which decoder a process uses: --generation-backend's rule, without torch, so the launcher can
tell whether a sampler will have rows in flight before any worker starts."""
from __future__ import annotations


def backend_for(choice: str, device_type: str) -> str:
    """The decoder --generation-backend `choice` gives a process on `device_type` ('cuda' or 'cpu'):
    auto is the fast engine on CUDA and Hugging Face generate on CPU (why: grpo.generate.backend)."""
    if choice == "auto":
        return "fast" if device_type == "cuda" else "hf"
    return choice
