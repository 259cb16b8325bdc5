"""The fused log-prob kernels: their CPU cases (fused_logprobs_cases.py) under Triton's interpreter in a
process of their own (TRITON_INTERPRET must be set before Triton is imported, and in this process it
would send every other test's log-probs through the interpreter); where they cannot run, start_runtime
keeps torch's ops, with one warning when a check failed."""
from __future__ import annotations

from pathlib import Path

import torch
from interpreted import run_cases

from grpo.model import fused_logprobs, logprobs
from grpo.model.load import start_runtime

CASES = Path(__file__).with_name("fused_logprobs_cases.py")


def test_fused_logprobs_cases_pass_under_the_interpreter():
    run_cases(CASES, 9)


def test_torchs_ops_where_the_kernels_cannot_run(monkeypatch, caplog):
    cpu = torch.device("cpu")
    try:
        start_runtime(cpu, {}, fused_logprobs=True)      # a CPU without the interpreter: not available, no word
        assert not logprobs._fused_head and "fused log-prob" not in caplog.text

        def no_triton():
            raise RuntimeError("0 active drivers ([]). There should only be one.")
        monkeypatch.setattr(fused_logprobs, "available", lambda device: True)
        monkeypatch.setattr(fused_logprobs, "_compile", no_triton)
        start_runtime(cpu, {}, fused_logprobs=True)
        assert not logprobs._fused_head
        assert caplog.text.count("the fused log-prob kernels cannot run here (RuntimeError: 0 active drivers") == 1
    finally:
        logprobs.use_fused_head(False)
