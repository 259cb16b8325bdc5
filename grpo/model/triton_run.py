"""Where this project's Triton kernels run (fused sampling, decode attention, fused log-probs), and the
one line a failed start-up check says before its caller keeps torch's ops.

Triton is a dependency of torch's CUDA builds; on a CPU machine a kernel runs under Triton's
interpreter (TRITON_INTERPRET=1, set before Triton is imported), which is how the CPU tests check
each kernel against the torch ops it replaces."""
from __future__ import annotations

import importlib.util
import os

import torch


def runs_here(device: torch.device) -> bool:
    """Triton is installed, and the device is CUDA (or Triton's interpreter is on, for CPU tests)."""
    if importlib.util.find_spec("triton") is None:
        return False
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def failure(exc: BaseException) -> str:
    """A kernel's failure in one line of at most 200 characters: its type and its message's first line."""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
