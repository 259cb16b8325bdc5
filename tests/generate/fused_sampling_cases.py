"""The fused sampling kernel (grpo.generate.fused_sampling) under Triton's interpreter on CPU, against
sample_step (run by test_fused_sampling.py in a process of its own with TRITON_INTERPRET=1, which
must be set before Triton is imported and would send every engine of a shared process through the
interpreter): the same greedy tokens (ties to the lowest id, across blocks too) and log-probs,
padding and EOS; draws that follow softmax(logits / T) with their log-probs; the device seed's
advance; and the engine's greedy and sampled streams through it (its GPU test is
test_fused_sampling_gpu.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from grpo.generate import fused_sampling  # noqa: E402
from grpo.generate.engine import RolloutEngine  # noqa: E402
from grpo.generate.fused_sampling import BLOCK, fused_sample_step, new_seed  # noqa: E402
from grpo.generate.sampling import sample_step  # noqa: E402
from grpo.model.load import load_causal_lm  # noqa: E402
from grpo.model.logprobs import right_pad, token_logprobs  # noqa: E402
from grpo.model.zoo import resolve_model  # noqa: E402

CPU = torch.device("cpu")
PAD = 0




def test_available_only_on_cuda_or_under_the_interpreter(monkeypatch):
    assert fused_sampling.available(CPU)
    monkeypatch.delenv("TRITON_INTERPRET")
    assert not fused_sampling.available(CPU)
    assert fused_sampling.available(torch.device("cuda", 0))   # a CUDA device: Triton's own


def test_greedy_equals_sample_step_with_ties_across_blocks_padding_and_eos():
    """bf16 logits over 2.5 blocks: row 2 has equal maxima in its first and third blocks (the lowest
    id wins, as torch.argmax's does), row 1 is done (padding, log-prob 0), row 3's argmax is an EOS
    id, row 4 ends on the other EOS id; temperature 0.7 scales the log-probs."""
    torch.manual_seed(0)
    V = 2 * BLOCK + BLOCK // 2
    logits = torch.randn(6, V).to(torch.bfloat16)
    logits[2, 10] = logits[2, 2 * BLOCK + 3] = 50.0
    logits[3, 7] = 60.0
    logits[4, V - 1] = 70.0                 # the last column, in the last (partial) block
    done = torch.tensor([False, True, False, False, False, False])
    eos = torch.tensor([7, V - 1])
    inv_t = torch.tensor(1 / 0.7)
    tok, lp, ended = fused_sample_step(logits, inv_t, True, new_seed(CPU), done, PAD, eos)
    want_tok, want_lp, want_ended = sample_step(logits, inv_t, True, None, done, PAD, eos)
    assert tok.tolist() == want_tok.tolist()
    assert tok[1].item() == PAD and tok[2].item() == 10 and tok[3].item() == 7 and tok[4].item() == V - 1
    assert ended.tolist() == want_ended.tolist() == [False, True, False, True, True, False]
    torch.testing.assert_close(lp, want_lp, rtol=0, atol=1e-5)
    assert lp[1].item() == 0.0
    # no EOS ids at all: only the done row has ended
    _, _, ended = fused_sample_step(logits, inv_t, True, new_seed(CPU), done, PAD, torch.zeros(0, dtype=torch.long))
    assert ended.tolist() == [False, True, False, False, False, False]


def test_the_engines_start_up_check_passes_where_the_kernel_runs():
    assert fused_sampling.check(CPU, 300) is None


def test_greedy_log_prob_by_hand():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    tok, lp, _ = fused_sample_step(logits, torch.tensor(1.0), True, new_seed(CPU), torch.tensor([False]), PAD,
                                   torch.tensor([9]))
    lse = 3.0 + math.log(math.exp(-2.0) + 1.0 + math.exp(-1.0) + math.exp(-3.0))
    assert tok.tolist() == [1] and abs(lp.item() - (3.0 - lse)) < 1e-6


def test_draws_follow_the_softmax_and_the_seed_advances():
    """600 draws of one row (stride-0 rows, as a refill's logits are) at T = 0.7: frequencies within
    a chi-square bound of softmax(logits / T), each with its log-prob under it; the seed moves by one
    per sampled draw (none per greedy one), the same torch seed gives the same draws, the next
    draw other ones."""
    row = torch.tensor([0.0, 1.0, 2.0, -1.0, 0.5])
    n, inv_t = 600, torch.tensor(1 / 0.7)
    torch.manual_seed(0)
    seed = new_seed(CPU)
    start = seed.item()
    done = torch.zeros(n, dtype=torch.bool)
    tok, lp, ended = fused_sample_step(row.expand(n, -1), inv_t, False, seed, done, PAD, torch.tensor([99]))
    assert seed.item() == start + 1
    want = torch.softmax(row * inv_t, -1)
    counts = torch.bincount(tok, minlength=5).double()
    chi2 = (((counts - n * want) ** 2) / (n * want)).sum().item()
    assert chi2 < 18.5, (counts, want)      # 4 degrees of freedom: P(chi2 > 18.5) < 0.001
    torch.testing.assert_close(lp, torch.log_softmax(row * inv_t, -1)[tok], rtol=0, atol=1e-6)
    assert not ended.any()
    # a row's noise is Philox's at (seed, row x vocab + column): the first 50 rows again, alone
    torch.manual_seed(0)
    again, _, _ = fused_sample_step(row.expand(50, -1), inv_t, False, new_seed(CPU), done[:50], PAD, torch.tensor([99]))
    assert torch.equal(tok[:50], again)
    nxt, _, _ = fused_sample_step(row.expand(50, -1), inv_t, False, seed, done[:50], PAD, torch.tensor([99]))
    assert not torch.equal(tok[:50], nxt) and seed.item() == start + 2
    fused_sample_step(row.expand(2, -1), inv_t, True, seed, done[:2], PAD, torch.tensor([99]))
    assert seed.item() == start + 2


@pytest.fixture(scope="module")
def tiny():
    return load_causal_lm(resolve_model("tiny-random"), CPU, torch.float32).eval()


def test_the_engine_draws_through_it_greedy_as_before_and_sampled_log_probs_teacher_forced(tiny):
    """RolloutEngine picks the kernel where it can run (here, the interpreter) unless told not to:
    greedy generate() gives the same tokens as torch's sampling; sampled tokens carry the
    log-probs a teacher-forced pass gives them."""
    ps = [[5, 9, 13], [7, 8, 9, 10, 11], [3]]
    fused = RolloutEngine(tiny, 2, 2, cuda_graphs=False)
    plain = RolloutEngine(tiny, 2, 2, cuda_graphs=False, fused_sampling=False)
    assert fused.fused and fused.ring.fused and not plain.fused and plain.seed is None
    assert fused.generate(ps, 6, greedy=True).token_ids == plain.generate(ps, 6, greedy=True).token_ids
    torch.manual_seed(3)
    got = fused.generate(ps, 6, temperature=0.8)
    whole = [p + g for p, g in zip(ps, got.token_ids)]
    ids, mask = right_pad(whole, 2, CPU)
    with torch.no_grad():
        tf = token_logprobs(tiny, ids, mask, 0.8)
    for i, (p, g) in enumerate(zip(ps, got.token_ids)):
        np.testing.assert_allclose(got.logprobs[i], tf[i, len(p) - 1:len(p) - 1 + len(g)].numpy(), rtol=0, atol=1e-4)
    # a compiled ring keeps torch's ops (the compiler fuses them); generate() keeps the kernel
    compiled = RolloutEngine(tiny, 2, 2, cuda_graphs=False, compile_ring=True)
    assert compiled.fused and not compiled.ring.fused
