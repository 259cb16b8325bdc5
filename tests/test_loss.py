"""The GRPO loss against numbers worked out by hand from the formula."""
import math

import pytest
import torch

from grpo.loss import group_advantages, grpo_token_loss, reduce_loss


def t(x, dtype=torch.float32):
    return torch.tensor(x, dtype=dtype)


def test_on_policy_ratio_is_one_and_loss_is_minus_advantage():
    logp = t([[-1.0, -2.0], [-0.5, -0.1]])
    out = grpo_token_loss(logp, logp.clone(), logp.clone(), t([2.0, -0.5]), torch.ones(2, 2), beta=0.1)
    assert torch.equal(out.ratio, torch.ones(2, 2))
    assert torch.equal(out.kl, torch.zeros(2, 2))  # ref == policy: k3 is exactly 0
    assert torch.equal(out.loss, t([[-2.0, -2.0], [0.5, 0.5]]))
    # grpo: per-sequence means -2 and 0.5, then the mean over 2 sequences
    assert reduce_loss(out.loss, torch.ones(2, 2), "grpo", 2, 4, 2).item() == pytest.approx(-0.75)


def test_ratio_of_e_is_clipped_to_1_2_for_positive_advantage():
    # logp - old = 1, so r = e = 2.718...; with A = 1 the surrogate is min(e, 1.2) = 1.2
    logp = t([[0.0]]).requires_grad_()
    out = grpo_token_loss(logp, t([[-1.0]]), t([[0.0]]), t([1.0]), torch.ones(1, 1), epsilon=0.2)
    assert out.ratio.item() == pytest.approx(math.e)
    assert out.loss.item() == pytest.approx(-1.2)
    assert out.clipped.item() is True
    out.loss.sum().backward()
    assert logp.grad.item() == 0.0  # clipped branch: no gradient


def test_ratio_of_e_with_negative_advantage_is_not_clipped():
    # A = -1: min(-e, -1.2) = -e, loss = e, d loss / d logp = -A * r = e
    logp = t([[0.0]]).requires_grad_()
    out = grpo_token_loss(logp, t([[-1.0]]), t([[0.0]]), t([-1.0]), torch.ones(1, 1), epsilon=0.2)
    assert out.loss.item() == pytest.approx(math.e)
    assert out.clipped.item() is False
    out.loss.sum().backward()
    assert logp.grad.item() == pytest.approx(math.e)


def test_clip_higher_uses_epsilon_high_above_one():
    # r = e^0.25 = 1.284; eps_high = 0.28 -> clip at 1.28; A = 1 -> loss -1.28
    out = grpo_token_loss(t([[0.25]]), t([[0.0]]), t([[0.25]]), t([1.0]), torch.ones(1, 1),
                          epsilon=0.2, epsilon_high=0.28)
    assert out.loss.item() == pytest.approx(-1.28)


def test_k3_kl_value():
    # ref - logp = ln 2: k3 = 2 - ln 2 - 1 = 0.30685...; beta 0.1, A = 0, on-policy ratio
    logp = t([[-1.0]])
    ref = logp + math.log(2.0)
    out = grpo_token_loss(logp, logp, ref, t([0.0]), torch.ones(1, 1), beta=0.1)
    assert out.kl.item() == pytest.approx(1 - math.log(2.0), rel=1e-6)
    assert out.loss.item() == pytest.approx(0.1 * (1 - math.log(2.0)), rel=1e-6)


def test_padding_contributes_nothing_even_if_it_holds_garbage():
    mask = t([[1.0, 0.0, 0.0]])
    good = grpo_token_loss(t([[-1.0, 0, 0]]), t([[-1.0, 0, 0]]), t([[-1.0, 0, 0]]), t([1.0]), mask)
    bad = grpo_token_loss(t([[-1.0, -1e4, 50.0]]), t([[-1.0, 1e4, -50.0]]), t([[-1.0, 1e4, 80.0]]),
                          t([1.0]), mask, beta=1.0)
    assert torch.isfinite(bad.loss).all() and torch.isfinite(bad.kl).all()
    assert torch.equal(good.loss, bad.loss)
    assert reduce_loss(bad.loss, mask, "grpo", 1, 1, 3).item() == pytest.approx(-1.0)


def test_loss_types_normalise_differently():
    # seq 0: one token with loss 1; seq 1: three tokens with loss 0
    loss = t([[1.0, 0, 0], [0.0, 0.0, 0.0]])
    mask = t([[1.0, 0, 0], [1.0, 1.0, 1.0]])
    assert reduce_loss(loss, mask, "grpo", 2, 4, 4).item() == pytest.approx((1.0 + 0.0) / 2)
    assert reduce_loss(loss, mask, "dapo", 2, 4, 4).item() == pytest.approx(1.0 / 4)
    assert reduce_loss(loss, mask, "dr_grpo", 2, 4, 4).item() == pytest.approx(1.0 / (2 * 4))
    with pytest.raises(ValueError, match="unknown loss_type"):
        reduce_loss(loss, mask, "ppo", 2, 4, 4)


def test_shares_of_a_split_batch_add_up_to_the_whole():
    torch.manual_seed(0)
    B, T = 6, 5
    logp, old, ref = (-torch.rand(B, T) for _ in range(3))
    adv = torch.randn(B)
    mask = (torch.rand(B, T) > 0.3).float()
    mask[:, 0] = 1
    n_tok = int(mask.sum())
    for lt in ("grpo", "dapo", "dr_grpo"):
        full = grpo_token_loss(logp, old, ref, adv, mask, beta=0.04)
        whole = reduce_loss(full.loss, mask, lt, B, n_tok, T)
        parts = sum(reduce_loss(grpo_token_loss(logp[s], old[s], ref[s], adv[s], mask[s], beta=0.04).loss,
                                mask[s], lt, B, n_tok, T) for s in (slice(0, 1), slice(1, 4), slice(4, 6)))
        assert parts.item() == pytest.approx(whole.item(), rel=1e-6)


def test_gradient_matches_float64_reference():
    torch.manual_seed(1)
    B, T = 3, 4
    logp64 = (-torch.rand(B, T, dtype=torch.float64) * 2).requires_grad_()
    old = logp64.detach() + 0.3 * torch.randn(B, T, dtype=torch.float64)
    ref = logp64.detach() + 0.2 * torch.randn(B, T, dtype=torch.float64)
    adv = torch.randn(B, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.float64)
    eps, beta = 0.2, 0.05
    # reference written out directly from the formula in float64
    r = torch.exp(logp64 - old)
    surr = torch.minimum(r * adv[:, None], torch.clamp(r, 1 - eps, 1 + eps) * adv[:, None])
    d = ref - logp64
    per_tok = (-surr + beta * (torch.exp(d) - d - 1)) * mask
    ref_loss = (per_tok.sum(1) / mask.sum(1)).mean()
    ref_loss.backward()
    logp32 = logp64.detach().float().requires_grad_()
    out = grpo_token_loss(logp32, old.float(), ref.float(), adv.float(), mask.float(), epsilon=eps, beta=beta)
    loss = reduce_loss(out.loss, mask.float(), "grpo", B, int(mask.sum()), T)
    loss.backward()
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-5)
    torch.testing.assert_close(logp32.grad.double(), logp64.grad, rtol=1e-4, atol=1e-6)
    assert torch.all(logp32.grad[mask == 0] == 0)


def test_group_advantages_by_hand():
    # group [1, 0, 0, 0]: mean 0.25, unbiased std sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5
    a = group_advantages(t([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]), group_size=4)
    expect = [0.75 / (0.5 + 1e-4)] + [-0.25 / (0.5 + 1e-4)] * 3 + [0.0] * 4  # equal rewards: no signal
    assert a.tolist() == pytest.approx(expect, rel=1e-6)
    unscaled = group_advantages(t([1.0, 0.0, 0.0, 0.0]), group_size=4, scale=False)
    assert unscaled.tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_equal_rewards_give_exactly_zero_advantage():
    # 1.2 = correctness 1 + format 0.2: the float32 mean of eight of them is not 1.2, and
    # dividing the rounding by (std 0 + eps) used to give every member +1.19e-3.
    rewards = torch.tensor([1.2] * 8 + [1.2] * 7 + [0.2], dtype=torch.float32)
    for scale in (True, False):
        a = group_advantages(rewards, group_size=8, scale=scale)
        assert a[:8].tolist() == [0.0] * 8                   # exactly, not approximately
        assert a[8:].abs().min() > 0                          # the other group still has signal
    assert group_advantages(t([0.1, 0.1, 0.1]), group_size=3).tolist() == [0.0, 0.0, 0.0]


def test_kl_estimators_k1_k2_by_hand():
    # d = ref - logp = ln 2: k1 = -ln 2, k2 = (ln 2)^2 / 2
    logp = t([[-1.0]])
    ref = logp + math.log(2.0)
    k1 = grpo_token_loss(logp, logp, ref, t([0.0]), torch.ones(1, 1), beta=1.0, kl_estimator="k1")
    k2 = grpo_token_loss(logp, logp, ref, t([0.0]), torch.ones(1, 1), beta=1.0, kl_estimator="k2")
    assert k1.kl.item() == pytest.approx(-math.log(2.0), rel=1e-6)
    assert k2.kl.item() == pytest.approx(0.5 * math.log(2.0) ** 2, rel=1e-6)
    with pytest.raises(ValueError, match="kl_estimator"):
        grpo_token_loss(logp, logp, ref, t([0.0]), torch.ones(1, 1), kl_estimator="k4")


def test_dual_clip_bounds_negative_advantage_loss():
    # r = e^2 = 7.389 with A = -1: plain loss e^2; dual clip c = 3 caps it at 3 with no gradient
    logp = t([[0.0]]).requires_grad_()
    plain = grpo_token_loss(logp, t([[-2.0]]), t([[0.0]]), t([-1.0]), torch.ones(1, 1))
    assert plain.loss.item() == pytest.approx(math.exp(2.0), rel=1e-6)
    dual = grpo_token_loss(logp, t([[-2.0]]), t([[0.0]]), t([-1.0]), torch.ones(1, 1), dual_clip=3.0)
    assert dual.loss.item() == pytest.approx(3.0)
    dual.loss.sum().backward()
    assert logp.grad.item() == 0.0
    # a positive advantage is untouched by the dual clip: min(e^2, 1.2) = 1.2
    pos = grpo_token_loss(t([[0.0]]), t([[-2.0]]), t([[0.0]]), t([1.0]), torch.ones(1, 1), dual_clip=3.0)
    assert pos.loss.item() == pytest.approx(-1.2)


def test_truncated_importance_weight_against_proximal_policy():
    # behaviour log-prob -2, learner (proximal) -1: w = min(e^1, C); ratio vs prox = 1
    logp = t([[-1.0]]).requires_grad_()
    capped = grpo_token_loss(logp, t([[-2.0]]), t([[-1.0]]), t([1.0]), torch.ones(1, 1),
                             prox_logp=logp.detach(), tis_cap=2.0)
    assert capped.ratio.item() == pytest.approx(1.0)
    assert capped.loss.item() == pytest.approx(-2.0)          # -A * r * min(e, 2)
    capped.loss.sum().backward()
    assert logp.grad.item() == pytest.approx(-2.0)            # d/dlogp of -A * exp(logp - prox) * w
    loose = grpo_token_loss(t([[-1.0]]), t([[-2.0]]), t([[-1.0]]), t([1.0]), torch.ones(1, 1),
                            prox_logp=t([[-1.0]]), tis_cap=5.0)
    assert loose.loss.item() == pytest.approx(-math.e, rel=1e-6)
    with pytest.raises(ValueError, match="prox_logp"):
        grpo_token_loss(t([[-1.0]]), t([[-2.0]]), t([[-1.0]]), t([1.0]), torch.ones(1, 1), tis_cap=2.0)


def test_bnpo_is_a_token_mean_per_micro_batch():
    loss = t([[1.0, 0, 0], [0.0, 0.0, 0.0]])
    mask = t([[1.0, 0, 0], [1.0, 1.0, 1.0]])
    # 1 over the 4 tokens of this micro-batch, averaged over 2 micro-batches in the step
    assert reduce_loss(loss, mask, "bnpo", 2, 99, 4, num_micro_batches=2).item() == pytest.approx(0.125)


def test_masked_importance_sampling_drops_tokens_outside_the_band():
    # Behaviour log-probs -2, -1, -3; proximal (= current, one update) -1 everywhere:
    # w = e^1 = 2.718, e^0 = 1, e^2 = 7.389. Band [0.5, 4]: the third token leaves the surrogate.
    logp = t([[-1.0, -1.0, -1.0]]).requires_grad_()
    out = grpo_token_loss(logp, t([[-2.0, -1.0, -3.0]]), t([[-1.0] * 3]), t([1.0]), torch.ones(1, 3),
                          prox_logp=logp.detach(), is_mask=(0.5, 4.0))
    assert out.is_weight[0].tolist() == pytest.approx([math.e, 1.0, math.e ** 2])
    assert out.is_limited[0].tolist() == [False, False, True]
    # ratio against the proximal policy is 1: loss -w * A = -e, -1, and 0 for the masked token
    assert out.loss[0].tolist() == pytest.approx([-math.e, -1.0, 0.0])
    out.loss.sum().backward()
    # d(-w r A)/d logp = -w r A = -w: the gradient of a policy gradient weighted by w
    assert logp.grad[0].tolist() == pytest.approx([-math.e, -1.0, 0.0])


def test_truncation_marks_capped_tokens_and_keeps_the_raw_weight():
    logp = t([[-1.0, -1.0]])
    out = grpo_token_loss(logp, t([[-3.0, -1.5]]), t([[-1.0, -1.0]]), t([-1.0]), torch.ones(1, 2),
                          prox_logp=logp, tis_cap=2.0)
    # w = e^2 = 7.39 (capped at 2), e^0.5 = 1.65; A = -1: loss = +w_capped
    assert out.is_weight[0].tolist() == pytest.approx([math.e ** 2, math.exp(0.5)])
    assert out.is_limited[0].tolist() == [True, False]
    assert out.loss[0].tolist() == pytest.approx([2.0, math.exp(0.5)])


def test_second_update_clips_around_the_proximal_policy_not_the_behaviour():
    # After one update the current log-prob moved from the proximal -1.0 to -0.5: r = e^0.5 = 1.649,
    # above 1 + 0.2, so with A = 1 the clipped branch is taken: loss = -1.2 * w, w = e^(-1 - -1.5) = e^0.5.
    # Around the behaviour policy (-1.5) the ratio would be e^1 and the same clip would bind at 1.2,
    # but the weight would be 1: the decoupled loss is -1.2 * 1.649 = -1.978.
    logp = t([[-0.5]]).requires_grad_()
    out = grpo_token_loss(logp, t([[-1.5]]), t([[-0.5]]), t([1.0]), torch.ones(1, 1),
                          prox_logp=t([[-1.0]]), tis_cap=2.0)
    assert out.ratio.item() == pytest.approx(math.exp(0.5))
    assert out.clipped.item() is True
    assert out.loss.item() == pytest.approx(-1.2 * math.exp(0.5))
    out.loss.sum().backward()
    assert logp.grad.item() == 0.0
    # Within the trust region (current -0.9: r = e^0.1 = 1.105) the gradient is -w r A.
    logp = t([[-0.9]]).requires_grad_()
    out = grpo_token_loss(logp, t([[-1.5]]), t([[-0.9]]), t([1.0]), torch.ones(1, 1),
                          prox_logp=t([[-1.0]]), is_mask=(0.0, 8.0))
    assert out.clipped.item() is False
    out.loss.sum().backward()
    assert logp.grad.item() == pytest.approx(-math.exp(0.5) * math.exp(0.1))


def test_is_mask_needs_the_proximal_policy():
    with pytest.raises(ValueError, match="prox_logp"):
        grpo_token_loss(t([[-1.0]]), t([[-2.0]]), t([[-1.0]]), t([1.0]), torch.ones(1, 1), is_mask=(0.1, 8.0))


def test_entropy_bonus_subtracts_coef_times_entropy_per_token():
    """On-policy (r = 1): loss_t = -A - c * H_t. A = [1, 0], H = [[2, 1], [0.5, 9]], c = 0.1,
    the last token padding: [[-1.2, -1.1], [-0.05, 0]]; d loss / d H = -c where counted."""
    logp = t([[-1.0, -2.0], [-0.5, -0.1]])
    ent = t([[2.0, 1.0], [0.5, 9.0]]).requires_grad_()
    mask = t([[1.0, 1.0], [1.0, 0.0]])
    out = grpo_token_loss(logp, logp.clone(), logp.clone(), t([1.0, 0.0]), mask, entropy=ent, entropy_coef=0.1)
    torch.testing.assert_close(out.loss, t([[-1.2, -1.1], [-0.05, 0.0]]))
    assert torch.equal(out.entropy, t([[2.0, 1.0], [0.5, 0.0]]))   # logged, padding zero
    out.loss.sum().backward()
    torch.testing.assert_close(ent.grad, t([[-0.1, -0.1], [-0.1, 0.0]]))
    # coefficient 0 (the default): the entropy is neither in the loss nor logged
    off = grpo_token_loss(logp, logp.clone(), logp.clone(), t([1.0, 0.0]), mask, entropy=ent)
    torch.testing.assert_close(off.loss, t([[-1.0, -1.0], [0.0, 0.0]]))
    assert torch.equal(off.entropy, torch.zeros(2, 2))


def test_a_loss_variant_is_one_function_and_one_entry():
    """A new --loss-type: one function of the variants' signature, registered; the learner's path
    (compute_loss) then reduces by it, and its settings check accepts the name."""
    from grpo.loss import LOSS_VARIANTS, LossConfig, Norms, compute_loss, loss_variant

    logp = t([[-1.0, -2.0], [-0.5, 0.0]])
    mask = t([[1.0, 1.0], [1.0, 0.0]])
    adv = t([1.0, -2.0])
    try:
        @loss_variant("sum_test")
        def summed(token_loss, mask, n):
            return token_loss.sum() / n.num_micro_batches

        cfg = LossConfig(loss_type="sum_test", beta=0.0, tis_cap=0.0)
        cfg.check()
        share, tl = compute_loss(logp, logp.clone(), logp.clone(), adv, mask, cfg, Norms(2, 3, 2, num_micro_batches=2))
        # on-policy, no KL: each token's loss is -A (ratio 1): -1 -1 for the first row, +2 for the second
        assert tl.loss.tolist() == [[-1.0, -1.0], [2.0, 0.0]] and share.item() == pytest.approx(0.0 / 2)
    finally:
        LOSS_VARIANTS.pop("sum_test", None)
    with pytest.raises(ValueError, match="--loss-type sum_test"):
        LossConfig(loss_type="sum_test").check()


def test_compute_loss_is_the_token_loss_reduced_by_its_variant():
    from grpo.loss import LOSS_TYPES, LossConfig, Norms, compute_loss

    torch.manual_seed(0)
    logp, old, ref = (torch.randn(3, 4) * 0.3 - 1 for _ in range(3))
    mask, adv = t([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]]), t([0.5, -1.0, 2.0])
    assert LOSS_TYPES == ("grpo", "dapo", "dr_grpo", "bnpo")
    for lt in LOSS_TYPES:
        cfg = LossConfig(loss_type=lt, beta=0.04, tis_cap=2.0)
        share, _ = compute_loss(logp, old, ref, adv, mask, cfg, Norms(3, 9, 4, 2), prox_logp=logp.detach())
        tl = grpo_token_loss(logp, old, ref, adv, mask, beta=0.04, prox_logp=logp.detach(), tis_cap=2.0)
        assert share.item() == reduce_loss(tl.loss, mask, lt, 3, 9, 4, num_micro_batches=2).item(), lt
