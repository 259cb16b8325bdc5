"""Batch building, token-balanced splitting and micro-batch alignment."""
import numpy as np
import pytest
import torch
from builders import make_group

from grpo.learner.batch import balanced_split, build_batch, length_buckets, micro_batch, padded_tokens


def test_balanced_split_is_deterministic_and_balanced():
    lengths = [10, 9, 8, 7, 6, 5, 4, 3]
    parts = balanced_split(lengths, 3)
    assert parts == balanced_split(lengths, 3)
    assert sorted(i for p in parts for i in p) == list(range(8))
    # longest first, each to the lightest part (ties to the lower part): worked by hand
    assert parts == [[0, 5, 6], [1, 4, 7], [2, 3]]
    assert [sum(lengths[i] for i in p) for p in parts] == [19, 18, 15]
    assert balanced_split([5], 3) == [[0], [], []]  # fewer sequences than parts: empty parts


def test_length_buckets_keep_similar_lengths_together_and_pad_less():
    lengths = [10, 9, 8, 7, 6, 5, 4, 3]
    parts = length_buckets(lengths, 2)
    # sorted by length, cut in the middle: the four shortest, then the four longest
    assert parts == [[4, 5, 6, 7], [0, 1, 2, 3]]
    assert padded_tokens(lengths, parts) == 4 * 6 + 4 * 10 == 64
    # the token-balanced split (for ranks) mixes long and short: [0, 3, 4, 7] and [1, 2, 5, 6]
    assert padded_tokens(lengths, balanced_split(lengths, 2)) == 4 * 10 + 4 * 9 == 76
    # odd counts: the later (longer) runs take the extra sequence; ties keep index order
    assert length_buckets([5, 1, 4, 2, 3], 2) == [[1, 3], [0, 2, 4]]
    assert length_buckets([5, 1, 4, 2, 3], 3) == [[1], [3, 4], [0, 2]]
    assert length_buckets([2, 2, 2], 2) == [[0], [1, 2]]
    assert length_buckets([7], 3) == [[], [], [0]]        # fewer sequences than parts: empty runs
    assert padded_tokens([7], [[], [], [0]]) == 7


def test_build_batch_and_micro_batch_alignment():
    g = make_group(prefix_ids=[11, 12, 13], completions=[[21, 22], [31]], rewards=[1.0, 0.0], policy_version=3)
    b = build_batch([g], group_size=2, scale_rewards=False)
    assert b.meta.tolist() == [[3, 2, 3, 0, 1], [3, 1, 3, 0, 1]]
    assert b.tokens.tolist() == [11, 12, 13, 21, 22, 11, 12, 13, 31]
    assert b.scalars[:, 0].tolist() == pytest.approx([0.5, -0.5])  # r - mean, unscaled
    mb = micro_batch(b, [0, 1], pad_id=0, device=torch.device("cpu"))
    assert mb.input_ids.tolist() == [[11, 12, 13, 21, 22], [11, 12, 13, 31, 0]]
    assert mb.attention.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    # target at position t is input_ids[t + 1]: generated tokens 21, 22 are targets at 2, 3
    assert mb.gen_mask.tolist() == [[0, 0, 1, 1], [0, 0, 1, 0]]
    torch.testing.assert_close(mb.old_logp, torch.tensor([[0, 0, -0.1, -0.2], [0, 0, -0.1, 0]]))
    torch.testing.assert_close(mb.ref_logp, torch.tensor([[0, 0, -0.01, -0.02], [0, 0, -0.01, 0]]))
    only_second = micro_batch(b, [1], pad_id=0, device=torch.device("cpu"))
    assert only_second.input_ids.tolist() == [[11, 12, 13, 31]]
    assert only_second.advantages.tolist() == pytest.approx([-0.5])


def test_drop_reasons():
    from grpo.learner.intake import drop_reason

    g = make_group(prefix_ids=[1], completions=[[2], [3]], rewards=[1.0, 0.0], policy_version=5)
    assert drop_reason(g, version=7, max_staleness=4, filter_zero_signal=True) is None
    assert drop_reason(g, version=9, max_staleness=4, filter_zero_signal=False) is None    # exactly 4 old
    assert drop_reason(g, version=10, max_staleness=4, filter_zero_signal=False) == "stale"
    assert drop_reason(g, version=4, max_staleness=4, filter_zero_signal=False) == "future_version"
    flat = make_group(prefix_ids=[1], completions=[[2], [3]], rewards=[1.0, 1.0], policy_version=5)
    assert drop_reason(flat, version=5, max_staleness=4, filter_zero_signal=False) is None
    assert drop_reason(flat, version=5, max_staleness=4, filter_zero_signal=True) == "zero_signal"


def test_truncated_completions_are_flagged_for_masking():
    g = make_group(prefix_ids=[11, 12], completions=[[21, 22], [31]], rewards=[1.0, 0.0])
    g.completions[1].is_finished = False
    b = build_batch([g], group_size=2, scale_rewards=False)
    mb = micro_batch(b, [0, 1], pad_id=0, device=torch.device("cpu"))
    assert mb.finished.tolist() == [1.0, 0.0]
    masked = mb.gen_mask * mb.finished.unsqueeze(1)   # what the learner does with --mask-truncated
    assert masked.tolist() == [[0, 1, 1], [0, 0, 0]]


def test_groups_without_reference_log_probs():
    from grpo.learner.intake import drop_reason

    g = make_group([[5, 6], [7]], rewards=[1.0, 0.0])
    for c in g.completions:
        c.ref_policy_log_probs = np.zeros(0, np.float32)
    batch = build_batch([g], group_size=2, scale_rewards=True)
    assert batch.floats.tolist()[3:] == [0.0, 0.0, 0.0]           # zeros stand in for the missing refs
    assert drop_reason(g, 0, 4, False, needs_ref=False) is None
    assert drop_reason(g, 0, 4, False, needs_ref=True) == "missing_ref"


def test_importance_ratio_uses_the_behaviour_log_probs_the_group_carries():
    """Hand-built: a group sampled at version 3 carries the behaviour log-probs log 0.5 and log 0.25
    for its two tokens; the learner, at a later version, has its own log-probs from a real forward.
    Through build_batch, micro_batch and the loss, each token's ratio is exp(learner - carried), at
    that token's position: what the sampler sent, not the learner's own old policy."""
    from grpo.loss import grpo_token_loss
    from grpo.model.load import load_causal_lm
    from grpo.model.logprobs import token_logprobs
    from grpo.model.zoo import resolve_model

    model = load_causal_lm(resolve_model("tiny-random"), torch.device("cpu"), torch.float32).eval()
    behav = np.log([0.5, 0.25]).astype(np.float32)
    g = make_group(prefix_ids=[11, 12, 13], completions=[[21, 22], [31, 32]], rewards=[1.0, 0.0], policy_version=3)
    for c in g.completions:
        c.old_policy_log_probs = behav
    mb = micro_batch(build_batch([g], group_size=2, scale_rewards=False), [0, 1], pad_id=0,
                     device=torch.device("cpu"))
    with torch.no_grad():
        logp = token_logprobs(model, mb.input_ids, mb.attention, 1.0)                   # [2, 4]
    tl = grpo_token_loss(logp, mb.old_logp, mb.ref_logp, mb.advantages, mb.gen_mask)
    # generated tokens are the targets at positions 2 and 3 of each row
    for row in range(2):
        want = torch.exp(logp[row, 2:4] - torch.tensor(behav))
        torch.testing.assert_close(tl.ratio[row, 2:4], want)
        assert tl.loss[row, :2].tolist() == [0.0, 0.0]                                  # prompt positions
    # with random weights the learner's probabilities are ~1/vocab: every ratio far below 1
    assert bool((tl.ratio[:, 2:4] < 1e-2).all())


def test_minibatches_cut_whole_groups_in_order():
    from grpo.learner.batch import minibatches

    # 5 groups of 2 in 2 updates: groups 0-1, then 2-4 (the later run gets the extra group)
    assert minibatches(5, 2, 2) == [[0, 1, 2, 3], [4, 5, 6, 7, 8, 9]]
    assert minibatches(3, 4, 1) == [list(range(12))]
    assert minibatches(3, 1, 3) == [[0], [1], [2]]
    with pytest.raises(ValueError, match="--ppo-minibatches 4"):
        minibatches(3, 2, 4)


def test_token_buckets_pack_short_rows_together_hand_worked():
    from grpo.learner.batch import token_buckets

    # sorted: 2 (len 3), 0 (len 5), 3 (len 5), 1 (len 9), 4 (len 20)
    lens = [5, 9, 3, 5, 20]
    # budget 16: [2] 1x3 -> [2,0] 2x5=10 -> [2,0,3] 3x5=15 -> +1 would be 4x9=36 > 16: cut;
    # [1] 9 -> +4 would be 2x20=40: cut; [4] alone, 20 > 16 (a row past the budget travels alone)
    assert token_buckets(lens, 16) == [[0, 2, 3], [1], [4]]
    assert token_buckets(lens, 100) == [[0, 1, 2, 3, 4]]          # 5 x 20 = 100 fits exactly
    # budget 99: first fit makes 2 runs, [2 0 3 1] 4 x 9 = 36 and [4] 20, 56 slots; cut instead as
    # [2 0 3] 3 x 5 = 15 and [1 4] 2 x 20 = 40, 55 slots
    assert token_buckets(lens, 99) == [[0, 2, 3], [1, 4]]
    assert token_buckets([], 10) == []
    assert token_buckets([7, 7, 7], 1) == [[0], [1], [2]]


def test_token_buckets_cut_where_the_fewest_slots_are_padded_hand_worked():
    from grpo.learner.batch import padded_tokens, token_buckets

    # sorted: 1, 3, 5 (len 2), 2 (len 3), 0, 4 (len 4); budget 8. First fit: [1 3 5] 6, then
    # [2 0] 2 x 4 = 8, then [4] 4: 18 slots for 17 tokens. The same 3 runs cut as [1 3 5] 6,
    # [2] 3, [0 4] 8: 17 slots, no padding.
    lens = [4, 2, 3, 2, 4, 2]
    assert token_buckets(lens, 8) == [[1, 3, 5], [2], [0, 4]]
    assert padded_tokens(lens, token_buckets(lens, 8)) == 17 == sum(lens)


def every_cut(lens: list[int]):
    """Every cut of the rows, sorted by length, into runs of neighbours (lists of indices): what the
    brute-force checks below search."""
    import itertools

    n = len(lens)
    order = sorted(range(n), key=lambda i: (lens[i], i))
    for k in range(n):
        for points in itertools.combinations(range(1, n), k):
            yield [order[a:b] for a, b in zip((0, *points), (*points, n))]


def test_token_buckets_are_the_fewest_runs_and_the_least_padding_of_them():
    """Against every cut of the sorted rows into runs (small cases, by brute force): no cut that
    fits has fewer runs, and none with as few runs pads fewer slots; every run fits or is one row."""
    import random

    from grpo.learner.batch import padded_tokens, token_buckets

    rng = random.Random(3)
    for _ in range(300):
        n = rng.randint(1, 8)
        lens = [rng.randint(1, 12) for _ in range(n)]
        budget = rng.randint(1, 40)
        got = token_buckets(lens, budget)
        assert sorted(i for run in got for i in run) == list(range(n))
        assert all(len(r) == 1 or len(r) * max(lens[i] for i in r) <= budget for r in got)
        cuts = [(len(runs), padded_tokens(lens, runs)) for runs in every_cut(lens)
                if all(len(r) == 1 or len(r) * max(lens[i] for i in r) <= budget for r in runs)]
        assert (len(got), padded_tokens(lens, got)) == min(cuts), (lens, budget, got)


def test_micro_token_budget_rule():
    from grpo.config import micro_token_budget

    assert micro_token_budget(0, 32, 4096, 256) == 32 * (128 + 256) == 12288   # default: rows x assumed length
    assert micro_token_budget(0, 32, 64, 256) == 32 * 320                      # prompts capped below 128
    assert micro_token_budget(5000, 32, 4096, 256) == 5000
    assert micro_token_budget(-1, 32, 4096, 256) == 0                          # off: fixed micro-batches
    with pytest.raises(ValueError, match="--micro-batch-tokens -2"):
        micro_token_budget(-2, 32, 4096, 256)


def test_real_token_buckets_hand_worked():
    """Padding-free passes: the budget holds a micro-batch's real tokens. The docstring's case, then
    the same rows as the padded test above: lengths 5 9 3 5 20 sorted 3 5 5 9 20; budget 16 fits
    3 + 5 + 5 = 13, then 9, then 20 alone (a row past the budget travels alone), and with three runs
    no cap below 20 works, so those; budget 100 takes all 42 tokens in one."""
    from grpo.learner.batch import real_token_buckets

    assert real_token_buckets([5, 3, 8, 2, 7], 12) == [[0, 1, 3], [4], [2]]
    lens = [5, 9, 3, 5, 20]
    assert real_token_buckets(lens, 16) == [[0, 2, 3], [1], [4]]
    assert real_token_buckets(lens, 100) == [[0, 1, 2, 3, 4]]
    assert real_token_buckets(lens, 42) == [[0, 1, 2, 3, 4]] and len(real_token_buckets(lens, 41)) == 2
    # 2 runs over 3 5 5 9 20: first fit at 41 is [3 5 5 9] [20]; the least largest run is 22 ([3 5 5 9] 22, [20])
    assert real_token_buckets(lens, 41) == [[0, 1, 2, 3], [4]]
    assert real_token_buckets([], 10) == []
    assert real_token_buckets([7, 7, 7], 1) == [[0], [1], [2]]


def test_real_token_buckets_are_the_fewest_runs_and_the_least_largest_of_them():
    """Against every cut of the sorted rows into runs (small cases, by brute force): no cut that fits
    has fewer runs, and none with as few has a smaller largest run; every run fits or is one row."""
    import random

    from grpo.learner.batch import real_token_buckets

    rng = random.Random(5)
    for _ in range(300):
        n = rng.randint(1, 8)
        lens = [rng.randint(1, 12) for _ in range(n)]
        budget = rng.randint(1, 40)
        got = real_token_buckets(lens, budget)
        assert sorted(i for run in got for i in run) == list(range(n))
        assert all(sum(lens[i] for i in run) <= budget or len(run) == 1 for run in got)
        real = [(len(runs), max(sum(lens[i] for i in r) for r in runs)) for runs in every_cut(lens)
                if all(sum(lens[i] for i in r) <= budget or len(r) == 1 for r in runs)]
        assert (len(got), max(sum(lens[i] for i in run) for run in got)) == min(real), (lens, budget, got)
