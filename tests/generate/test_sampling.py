"""The one sampling step (grpo.generate.sampling.sample_step) that the fixed-batch and in-flight
paths share: hand-worked greedy picks and log-probs, temperature, padding after the end, EOS (one id,
several, none), and draws that follow softmax(logits / T)."""
from __future__ import annotations

import math

import torch

from grpo.generate.sampling import new_generator, sample_step

PAD = 0
CPU = torch.device("cpu")


def _lse(xs):
    m = max(xs)
    return m + math.log(sum(math.exp(x - m) for x in xs))


def test_greedy_picks_the_argmax_with_its_log_prob_by_hand():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0], [0.0, 0.0, 5.0, 1.0]])
    done = torch.tensor([False, False])
    tok, lp, ended = sample_step(logits, 1.0, True, None, done, PAD, torch.tensor([9]))
    assert tok.tolist() == [1, 2]
    assert abs(lp[0].item() - (3.0 - _lse([1.0, 3.0, 2.0, 0.0]))) < 1e-6
    assert abs(lp[1].item() - (5.0 - _lse([0.0, 0.0, 5.0, 1.0]))) < 1e-6
    assert ended.tolist() == [False, False]


def test_temperature_scales_the_log_prob():
    logits = torch.tensor([[2.0, 4.0, 0.0]])
    tok, lp, _ = sample_step(logits, torch.tensor(0.5), True, None, torch.tensor([False]), PAD, torch.tensor([7]))
    assert tok.tolist() == [1]   # argmax does not move with T
    assert abs(lp.item() - (2.0 - _lse([1.0, 2.0, 0.0]))) < 1e-6   # logits / T at T = 2


def test_ended_rows_emit_padding_and_eos_ends_a_row():
    logits = torch.tensor([[0.0, 9.0, 0.0], [0.0, 0.0, 9.0], [9.0, 0.0, 0.0], [0.0, 9.0, 0.0]])
    done = torch.tensor([True, False, False, False])
    tok, lp, ended = sample_step(logits, 1.0, True, None, done, PAD, torch.tensor([1, 2]))   # two EOS ids
    assert tok.tolist() == [PAD, 2, 0, 1]
    assert lp[0].item() == 0.0 and (lp[1:] < 0).all()
    assert ended.tolist() == [True, True, False, True]   # already done; EOS 2; no EOS; EOS 1
    # No EOS ids at all: only the rows already done have ended.
    _, _, ended = sample_step(logits, 1.0, True, None, done, PAD, torch.zeros(0, dtype=torch.long))
    assert ended.tolist() == [True, False, False, False]


def test_draws_follow_the_softmax_and_report_their_log_probs():
    torch.manual_seed(0)
    gen = new_generator(CPU)
    row = torch.tensor([0.0, 1.0, 2.0, -1.0, 0.5])
    n, inv_t = 40000, 1 / 0.7
    logits = row.expand(n, -1)
    tok, lp, ended = sample_step(logits, inv_t, False, gen, torch.zeros(n, dtype=torch.bool), PAD,
                                 torch.tensor([99]))
    want = torch.softmax(row * inv_t, -1)
    freq = torch.bincount(tok, minlength=5).float() / n
    assert (freq - want).abs().max() < 0.01, (freq, want)
    torch.testing.assert_close(lp, torch.log_softmax(row * inv_t, -1)[tok])
    assert not ended.any()
    # The engine's generator follows torch.manual_seed: the same seed, the same draws.
    torch.manual_seed(0)
    again, _, _ = sample_step(logits, inv_t, False, new_generator(CPU), torch.zeros(n, dtype=torch.bool), PAD,
                              torch.tensor([99]))
    assert torch.equal(tok, again)
