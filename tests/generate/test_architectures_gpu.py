"""The architecture matrix of test_architectures.py on a GPU, with CUDA graphs (skipped without
CUDA): the same tiny random float32 models, on cuda:0. Greedy tokens equal Hugging Face generate's
on the same GPU, sampled log-probs equal a teacher-forced pass, one engine serves rounds of
different widths and batch sizes (graphs captured per row bucket and attention length, then
replayed), in fixed batches and in flight.

float32 because token identity is the test: the engine's attention and Hugging Face's sum in
different orders, and in bf16 near-ties flip (tests/generate/test_rollout_gpu.py says more).
Matrix products run without TF32 here so that the teacher-forced reference is float32 too."""
from __future__ import annotations

import pytest
import torch

from grpo.generate.backend import hf_generate
from grpo.generate.engine import RolloutEngine
from test_architectures import (ARCHS, EOS, NEW, PAD, ROUNDS, build, check_greedy_rounds, check_in_flight,
                                check_sampled_rounds, check_swap_in_flight, prompts)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
CUDA = torch.device("cuda", 0)
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


def test_greedy_equals_generate_over_rounds_with_graphs(arch):
    _, model = arch
    engine = RolloutEngine(model, EOS, PAD)
    assert engine.cuda_graphs and engine.fallback is None
    results = check_greedy_rounds(model, engine)
    assert all(got.stats["cuda_graphs"] for got in results)
    assert engine.graph_failures == 0
    # the same round again replays what was captured
    again = engine.generate(prompts(ROUNDS[0], seed=0), NEW, greedy=True)
    assert again.token_ids == hf_generate(model, prompts(ROUNDS[0], seed=0), NEW, 1.0, True, [EOS], PAD)[0]


def test_sampled_logprobs_equal_teacher_forced_with_graphs(arch):
    _, model = arch
    torch.manual_seed(3)
    engine = RolloutEngine(model, EOS, PAD)
    check_sampled_rounds(model, engine)
    assert engine.graph_failures == 0


def test_in_flight_equals_generate_with_graphs(arch):
    _, model = arch
    engine = RolloutEngine(model, EOS, PAD, check_every=3)
    check_in_flight(model, engine)
    assert engine.graph_failures == 0


def test_in_flight_swaps_weights_without_draining_with_graphs(arch):
    """New weights copied into the parameters at a check replace nothing the ring's captured step
    holds: the same graph replays with the new weights (check_swap_in_flight)."""
    name, model = arch
    check_swap_in_flight(model, build(name, seed=1).to(CUDA), lambda m: RolloutEngine(m, EOS, PAD, check_every=3))
