"""The architecture matrix of test_architectures.py on a GPU, with CUDA graphs (skipped without
CUDA): the same tiny random float32 models, on cuda:0. Greedy tokens equal Hugging Face generate's
on the same GPU, sampled log-probs equal a teacher-forced pass, one engine serves rounds of
different widths and batch sizes (graphs captured per row bucket and attention length, then
replayed), in fixed batches and in flight.

float32 because token identity is the test: the engine's attention and Hugging Face's sum in
different orders, and in bf16 near-ties flip (tests/generate/test_rollout_gpu.py says more).
Matrix products run without TF32 here so that the teacher-forced reference is float32 too."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from grpo.generate.backend import hf_generate
from grpo.generate.engine import RolloutEngine
from grpo.model import right_pad, token_logprobs
from test_architectures import ARCHS, EOS, NEW, PAD, ROUNDS, build, prompts, source

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
CUDA = torch.device("cuda", 0)
ATOL = 1e-5   # the bound; the CPU matrix holds it too
_MODELS: dict[str, torch.nn.Module] = {}


@pytest.fixture(autouse=True, scope="module")
def no_tf32():
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@pytest.fixture(params=ARCHS)
def arch(request):
    name = request.param
    if name not in _MODELS:
        _MODELS[name] = build(name).to(CUDA)
    return name, _MODELS[name]


def teacher_forced(model, ps, completions, temperature):
    whole = [p + g for p, g in zip(ps, completions)]
    ids, mask = right_pad(whole, PAD, CUDA)
    with torch.no_grad():
        tf = token_logprobs(model, ids, mask, temperature).float().cpu()
    return [tf[i, len(p) - 1:len(p) - 1 + len(g)].numpy() for i, (p, g) in enumerate(zip(ps, completions))]


def test_greedy_equals_generate_over_rounds_with_graphs(arch):
    _, model = arch
    engine = RolloutEngine(model, EOS, PAD)
    assert engine.cuda_graphs and engine.fallback is None
    for r, lengths in enumerate(ROUNDS):
        ps = prompts(lengths, seed=r)
        ref, ref_fin = hf_generate(model, ps, NEW, 1.0, True, [EOS], PAD)
        got = engine.generate(ps, NEW, greedy=True)
        assert got.stats["cuda_graphs"], r
        assert got.token_ids == ref and got.finished == ref_fin, r
    assert engine.graph_failures == 0
    # the same round again replays what was captured
    again = engine.generate(prompts(ROUNDS[0], seed=0), NEW, greedy=True)
    assert again.token_ids == hf_generate(model, prompts(ROUNDS[0], seed=0), NEW, 1.0, True, [EOS], PAD)[0]


def test_sampled_logprobs_equal_teacher_forced_with_graphs(arch):
    _, model = arch
    torch.manual_seed(3)
    engine = RolloutEngine(model, EOS, PAD)
    worst = 0.0
    for r, lengths in enumerate(ROUNDS):
        ps = prompts(lengths, seed=10 + r)
        got = engine.generate(ps, NEW, temperature=0.8)
        for lp, ref in zip(got.logprobs, teacher_forced(model, ps, got.token_ids, 0.8)):
            assert lp.shape == ref.shape
            worst = max(worst, float(np.abs(lp - ref).max(initial=0.0)))
    assert engine.graph_failures == 0
    assert worst <= ATOL, worst


def test_in_flight_equals_generate_with_graphs(arch):
    _, model = arch
    ps = prompts((5, 9, 3, 8, 1), seed=2)
    ref, _ = hf_generate(model, ps, NEW, 1.0, True, [EOS], PAD)
    engine = RolloutEngine(model, EOS, PAD, check_every=3)
    got = list(engine.stream(source(enumerate(ps)), 2, NEW, greedy=True, rows=4))
    assert sorted(g.key for g in got) == list(range(len(ps)))
    for g in got:
        assert g.token_ids == [ref[g.key]] * 2
    torch.manual_seed(4)
    for g in engine.stream(source(enumerate(ps)), 2, NEW, temperature=0.8, rows=4):
        p = ps[g.key]
        for lp, want in zip(g.logprobs, teacher_forced(model, [p, p], g.token_ids, 0.8)):
            np.testing.assert_allclose(lp, want, rtol=0, atol=ATOL)
    assert engine.graph_failures == 0
