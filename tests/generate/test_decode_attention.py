"""The decode attention kernel: its CPU cases (decode_attention_cases.py) under Triton's interpreter in a
process of their own (TRITON_INTERPRET must be set before Triton is imported, and in this process it
would send every engine of the other tests through the interpreter); its split rule by hand; an
engine where the kernel cannot run keeps SDPA, with one warning."""
from __future__ import annotations

from pathlib import Path

import torch
from interpreted import run_cases
from ligerutil import tiny_llama

from grpo.generate.decode_attention import splits
from grpo.generate.engine import RolloutEngine

CASES = Path(__file__).with_name("decode_attention_cases.py")


def test_decode_attention_cases_pass_under_the_interpreter():
    run_cases(CASES, 10)


def test_splits_fill_the_device_four_times_over_within_the_blocks():
    # H200: 132 multiprocessors, 4 x 132 = 528 programs wanted
    assert splits(640, 12, 132) == 1          # 320 rows x 2 KV heads: enough already
    assert splits(528, 12, 132) == 1
    assert splits(527, 12, 132) == 2          # ceil(528 / 527)
    assert splits(8, 12, 132) == 12           # 66 wanted, but 12 blocks of slots
    assert splits(8, 100, 132) == 64          # 66 wanted, at most 64
    assert splits(1, 1, 132) == 1             # one block: nothing to split
    assert splits(0, 5, 4) == 5               # no programs counts as one


def test_a_kernel_that_cannot_run_leaves_sdpa_with_one_warning(monkeypatch, caplog):
    from grpo.generate import decode_attention

    def no_triton():
        raise RuntimeError("0 active drivers ([]). There should only be one.")
    monkeypatch.setattr(decode_attention, "available", lambda device: True)
    monkeypatch.setattr(decode_attention, "_compile", no_triton)
    eng = RolloutEngine(tiny_llama(), 2, 0, cuda_graphs=False, liger_layers=False)
    assert not eng.attention_kernel and eng.fallback is None
    assert caplog.text.count("the decode attention kernel cannot run here (RuntimeError: 0 active drivers") == 1
    assert len(eng.generate([[5, 6, 7]], 4, greedy=True).token_ids[0]) == 4


def test_off_where_not_asked_for_or_without_triton_on_the_device(monkeypatch):
    """A CPU without the interpreter: off, unchecked. fused_attention=False (--no-fused-attention):
    off even where it could run, and never checked."""
    from grpo.generate import decode_attention
    checked = []
    monkeypatch.setattr(decode_attention, "check", lambda *a: checked.append(a))
    assert not RolloutEngine(tiny_llama(), 2, 0, cuda_graphs=False, liger_layers=False).attention_kernel
    monkeypatch.setattr(decode_attention, "available", lambda device: True)
    assert not RolloutEngine(tiny_llama(), 2, 0, cuda_graphs=False, liger_layers=False,
                             fused_attention=False).attention_kernel
    assert checked == []
    on = RolloutEngine(tiny_llama(), 2, 0, cuda_graphs=False, liger_layers=False)
    assert on.attention_kernel and checked == [(torch.device("cpu"), 2, 2, 8, torch.float32)]   # 4 heads on 2, 32 / 4
