"""vLLM's engine behind our stream (grpo.generate.vllm_engine) on a GPU, with vLLM 0.25 installed
(skipped without CUDA or without vLLM: `pip install '.[vllm]'`). The issue's criteria: new weights
swapped in between two of vLLM's steps keep every request in flight and all its tokens, and each
token's version and log-prob are those of the weights that drew it: a Hugging Face forward with a
kept cache, each position fed by the version in force when vLLM fed it (mixed_decode), within bf16
tolerance (the fast engine's bf16 criteria, tests/generate/test_rollout_gpu.py)."""
from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from grpo.generate.backend import hf_generate
from grpo.generate.vllm_engine import VllmEngine
from test_architectures import SwapAt, mixed_decode

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM: pip install '.[vllm]'")]
CUDA = torch.device("cuda", 0)
GSM8K = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k"
NEW = 16


@pytest.fixture(scope="module")
def setup():
    """SmolLM2 (bf16) as version 0, a perturbed copy as version 1, the sampler's policy (a copy of
    version 0 that the swap writes), GSM8K prompts, and vLLM's engine on the model's folder (CUDA
    graphs on: the swap must write the weights the captured graphs read)."""
    from grpo.data.prompts import build_prompt
    from grpo.data.sources import load_problems
    from grpo.model.load import load_causal_lm, load_tokenizer
    from grpo.model.zoo import resolve_model

    path = resolve_model("smollm2")
    tok = load_tokenizer(path)
    old = load_causal_lm(path, CUDA, torch.bfloat16).eval()
    new = copy.deepcopy(old)
    g = torch.Generator(device=CUDA).manual_seed(1)
    with torch.no_grad():   # a version far enough from 0 that the wrong version's log-probs are told apart
        for p in new.parameters():
            if p.dim() == 2:
                p.mul_(1 + 0.05 * torch.randn(p.shape, generator=g, device=CUDA, dtype=p.dtype))
    policy = copy.deepcopy(old)
    problems = load_problems(str(GSM8K), "test", limit=8)
    prompts = [tok(build_prompt(tok, p.question), add_special_tokens=False)["input_ids"] for p in problems]
    engine = VllmEngine.build(path, policy, [], torch.bfloat16, gpu_memory_utilization=0.3, seed=0, rows=8,
                              cuda_graphs=True, max_model_len=1024)
    yield dict(old=old, new=new, policy=policy, tok=tok, prompts=prompts, engine=engine, path=path)
    del engine


def _copy(dst, src):
    with torch.no_grad():
        for p, q in zip(dst.parameters(), src.parameters()):
            p.copy_(q)


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_swap_between_two_steps_keeps_every_request_and_each_tokens_version(setup, temperature):
    """3 prompts, G=2 on 4 rows, 16 tokens each (no EOS): prompts 0 and 1 take the rows at step 1;
    swap() writes version 1 into the policy at its 4th call (after step 4), and the engine copies it
    into vLLM's model before step 5, with 4 requests in flight. Each of their rows has all 16
    tokens, 0-3 of version 0 and 4-15 of version 1; prompt 2 starts after step 16: all version 1.
    Each log-prob is the version's that drew it, over keys and values each computed by the version
    in force when fed (mixed_decode), within bf16 tolerance, and closer to it than to version 0's
    alone."""
    s = setup
    engine, policy = s["engine"], s["policy"]
    _copy(policy, s["old"])
    engine.loaded = None   # the stream copies the policy (version 0) in first
    ps = s["prompts"][:3]
    swap = SwapAt(policy, s["new"], 4)
    src = iter(enumerate(ps))
    got = {g.key: g for g in engine.stream(lambda: next(src, None), 2, NEW, temperature=temperature, rows=4,
                                           swap=swap, version=0)}
    assert sorted(got) == [0, 1, 2] and swap.calls >= 4
    span, after = [0] * 4 + [1] * (NEW - 4), [1] * NEW
    for k, want in {0: span, 1: span, 2: after}.items():
        assert [v.tolist() for v in got[k].versions] == [want, want], k
    check_tokens_and_versions(s, got, ps, temperature)


def check_tokens_and_versions(s, got: dict, ps: list, temperature: float) -> None:
    """Every row has all its tokens; each log-prob is the version's that drew it, over keys and values
    each computed by the version in force when fed (mixed_decode), within bf16 tolerance, and closer
    to it than to version 0's alone."""
    for k, g in got.items():
        assert all(len(r) == NEW for r in g.token_ids) and g.finished == [False, False], k
        assert (g.min_version, g.max_version) == (min(map(np.min, g.versions)), max(map(np.max, g.versions)))
    models = {0: s["old"], 1: s["new"]}
    diffs, wrong = [], []
    for k, g in got.items():
        for row, lp, vs in zip(g.token_ids, g.logprobs, g.versions):
            ref, picks = mixed_decode(models, ps[k], row, vs.tolist(), temperature or 1.0)
            diffs.append(np.abs(lp - ref))
            if vs.max() == 1:
                alone, _ = mixed_decode(models, ps[k], row, [0] * len(row), temperature or 1.0)
                wrong.append(np.abs(lp - alone)[vs == 1])
    diffs = np.concatenate(diffs)
    assert np.median(diffs) < 0.05 and np.quantile(diffs, 0.99) < 0.3, (np.median(diffs), diffs.max())
    assert np.mean(np.concatenate(wrong)) > np.mean(diffs), "the log-probs do not tell version 1 from version 0"


def test_with_its_engine_core_in_a_process_of_its_own_each_token_has_the_version_that_drew_it(setup):
    """--vllm-engine-process: the same stream with vLLM's engine core stepping in its own process, the
    weights loaded there by our worker extension from plain CUDA IPC handles. The engine may have run
    steps ahead when the load reaches it, so the split is not fixed: the rows in flight start with at
    least their 4 tokens read before the swap at version 0 and end at version 1, prompt 2 is all
    version 1, and each token's log-prob is that of the version its step's stamp says."""
    s = setup
    policy = copy.deepcopy(s["old"])
    engine = VllmEngine.build(s["path"], policy, [], torch.bfloat16, gpu_memory_utilization=0.3, seed=0, rows=8,
                              cuda_graphs=True, max_model_len=1024, engine_process=True)
    swap = SwapAt(policy, s["new"], 4)
    ps = s["prompts"][:3]
    src = iter(enumerate(ps))
    try:
        got = {g.key: g for g in engine.stream(lambda: next(src, None), 2, NEW, temperature=1.0, rows=4,
                                               swap=swap, version=0)}
    finally:
        engine.close()
    assert sorted(got) == [0, 1, 2]
    for k in (0, 1):
        for vs in got[k].versions:
            v = vs.tolist()
            assert v[:4] == [0] * 4 and v[-1] == 1 and v == sorted(v), (k, v)
    assert all(vs.tolist() == [1] * NEW for vs in got[2].versions)
    check_tokens_and_versions(s, got, ps, 1.0)


def test_greedy_batch_agrees_with_generate_and_keeps_the_eos(setup):
    """A greedy batch (what sampler 0's evaluation decodes): ends at our EOS ids, kept; in bf16 the
    tokens agree with Hugging Face generate's up to near-ties (vLLM's kernels sum in other orders)."""
    from grpo.model.load import eos_ids

    s = setup
    engine, policy = s["engine"], s["policy"]
    _copy(policy, s["old"])
    engine.loaded, engine.eos = None, eos_ids(s["tok"], s["old"])
    try:
        out = engine.generate(s["prompts"], 64, greedy=True)
    finally:
        engine.eos = []
    ref, ref_fin = hf_generate(s["old"], s["prompts"], 64, 1.0, True, eos_id=eos_ids(s["tok"], s["old"]),
                               pad_id=s["tok"].pad_token_id)
    for row, fin in zip(out.token_ids, out.finished):
        assert fin == (row[-1] in eos_ids(s["tok"], s["old"])) and len(row) <= 64
    first = [a[:8] == b[:8] for a, b in zip(out.token_ids, ref)]
    assert np.mean(first) >= 0.75, (out.token_ids, ref)
    assert all(np.all(lp <= 0) for lp in out.logprobs)
