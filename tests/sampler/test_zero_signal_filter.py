"""--filter-zero-signal at the sampler (DAPO dynamic sampling at the source): a round is scored
before its log-prob passes, so a group whose rewards are all equal costs no passes and is not
sent; it still counts as offered, and the learner's books show it as dropped
(sampler_zero_signal), so sent = trained + dropped + queued still holds."""
from __future__ import annotations

from pathlib import Path

import pytest
from netutil import free_ports, one_thread  # noqa: F401 - module-wide fixture (autouse)
from scripted import ScriptedLearner, drain, facts, run_against

from grpo.config import SamplerConfig, from_flat
from grpo.data.prompts import PromptStream
from grpo.learner.accounting import Books
from grpo.sampler.counters import SamplerCounters
from grpo.sampler.loop import Sampler
from grpo.sampler.workflow import solved_and_unsolved
from grpo.wire import messages as M
from grpo.wire.transport import DataReceiver

GSM8K = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k"

REWARD = '''
def first_only(prompts, completions, **kwargs):
    # The round's first completion is right and every other one wrong: group 0 has signal
    # (rewards 1, 0), every other group has none (all 0).
    return [1.0 if i == 0 else 0.0 for i in range(len(completions))]
'''


@pytest.fixture
def reward(tmp_path, monkeypatch):
    (tmp_path / "zero_signal_reward.py").write_text(REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "zero_signal_reward:first_only"


def sampler(reward: str, filt: bool, data_port: int, sync_port: int, **kw) -> Sampler:
    return Sampler(from_flat(SamplerConfig, model="tiny-random", device="cpu", dataset=str(GSM8K), dataset_limit=8,
                                 prompts_per_round=3, num_generations=2, max_new_tokens=4,
                                 generation_backend="fast", old_logprobs="pass",   # both passes, to count them
                                 reward=reward, filter_zero_signal=filt,
                                 data_port=data_port, sync_port=sync_port, **kw))


def no_update_learner(s: Sampler) -> ScriptedLearner:
    """A scripted learner that answers every request with no update."""
    return ScriptedLearner(s.cfg.run.sync_port, facts(s, needs_ref_logprobs=True))


@pytest.mark.parametrize("filt", [True, False])
def test_zero_signal_groups_cost_no_logprob_passes_and_are_not_sent(reward, monkeypatch, filt):
    s = sampler(reward, filt, *free_ports(2))
    passes = []
    real = s.parts.workflow._logprobs
    monkeypatch.setattr(s.parts.workflow, "_logprobs",
                        lambda model, whole, plens: passes.append(len(whole)) or real(model, whole, plens))
    try:
        groups = [g for chunk in s.parts.workflow.stream_round(0, 3) for g in chunk]
    finally:
        s.parts.data.close()
        s.parts.sync.close()
    if filt:
        assert [g.group_id for g in groups] == ["s0-r0-g0"]
        assert passes == [2, 2]   # policy and reference passes over group 0's two completions only
        assert s.counters.dropped_zero_signal == 2
        # this reward has no correctness part, so neither kind is claimed for the two
        assert (s.counters.zero_signal_solved, s.counters.zero_signal_unsolved) == (0, 0)
    else:
        assert [g.group_id for g in groups] == ["s0-r0-g0", "s0-r0-g1", "s0-r0-g2"]
        assert passes == [6, 6] and s.counters.dropped_zero_signal == 0
    assert [c.reward for c in groups[0].completions] == [1.0, 0.0]
    for g in groups:
        for c in g.completions:   # each completion still gets its own log-probs, in order
            n = len(c.generated_token_ids)
            assert c.old_policy_log_probs.shape == c.ref_policy_log_probs.shape == (n,)
            assert list(c.whole_token_ids[-n:]) == list(c.generated_token_ids)


def test_dropped_groups_are_split_into_solved_and_unsolved_by_the_correctness_part():
    """By hand: a group every completion of which is right, two none of which is, one without the
    part (a reward set with no correctness part); then a real round of the tiny random model under
    the correctness reward, which solves nothing in 4 tokens: every group is dropped, all unsolved."""
    assert solved_and_unsolved([[1.0, 1.0], [0.0, 0.0], [0.0, 0.0], [None, None]]) == (1, 2)
    assert solved_and_unsolved([]) == (0, 0)
    s = sampler("correctness", True, *free_ports(2))
    try:
        groups = [g for chunk in s.parts.workflow.stream_round(0, 3) for g in chunk]
    finally:
        s.parts.data.close()
        s.parts.sync.close()
    assert groups == [] and s.counters.dropped_zero_signal == 3
    assert (s.counters.zero_signal_solved, s.counters.zero_signal_unsolved) == (0, 3)


def test_filtered_groups_count_as_offered_and_the_books_balance(reward):
    """Two real rounds over a real socket, a scripted learner that answers with no update (the
    sampler generates with its start weights): 6 groups offered, 2 delivered, 4 filtered."""
    data_port, sync_port = free_ports(2)
    receiver = DataReceiver("127.0.0.1", data_port, M.Limits(), 1 << 26)
    s = sampler(reward, True, data_port, sync_port, max_rounds=2, sync_timeout_s=0.2, heartbeat_interval_s=0)
    result = run_against(s, no_update_learner(s))
    groups, final = drain(receiver)
    assert final is not None and result["groups_sent"] == final.groups_sent == 6
    assert [g.group_id for g in groups] == ["s0-r0-g0", "s0-r1-g0"]
    assert final.stats["dropped_zero_signal"] == 4
    # the stats the counters carry, and only those (tests/sampler/test_counters.py: the dict's keys)
    assert set(final.stats) == set(SamplerCounters().snapshot()) | {"clock_s"}
    assert result["rounds"] == 2 and final.stats["rounds"] == 2.0
    books = Books()
    for g in groups:
        books.group(g, version=0)
    books.status(final, 0)
    sent, dropped = books.totals()
    # The learner's identity: sent (6) = trained + dropped (4 at the sampler) + queued (the 2 received)
    assert sent == 6 and dropped == {"sampler_zero_signal": 4}


FLAT_ROUND = '''
rounds = [0]

def flat_second_round(prompts, completions, **kwargs):
    # Per round (3 prompts x G=2 = 6 completions; the start-up probe scores 2 and is not a round):
    # rounds 0 and 2 have one right completion (group 0 has signal, groups 1 and 2 none), round 1
    # has none at all, so every group of it is filtered and nothing of it is sent.
    if len(completions) == 6:
        rounds[0] += 1
    flat = rounds[0] == 2
    return [1.0 if i == 0 and not flat else 0.0 for i in range(len(completions))]
'''


def test_a_round_filtered_whole_still_counts_as_offered(tmp_path, monkeypatch):
    """Three real rounds over a real socket, the second one all zero-signal: 9 groups offered
    (2 delivered, 7 filtered), and the final status says so; the learner's books balance with
    the final status alone (sent is the sampler's own count once it is final)."""
    (tmp_path / "flat_round_reward.py").write_text(FLAT_ROUND)
    monkeypatch.syspath_prepend(str(tmp_path))
    data_port, sync_port = free_ports(2)
    receiver = DataReceiver("127.0.0.1", data_port, M.Limits(), 1 << 26)
    s = sampler("flat_round_reward:flat_second_round", True, data_port, sync_port, max_rounds=3,
                sync_timeout_s=0.2, heartbeat_interval_s=0)
    result = run_against(s, no_update_learner(s))
    groups, final = drain(receiver)
    assert final is not None, "no final status within 30 s"
    assert [g.group_id for g in groups] == ["s0-r0-g0", "s0-r2-g0"]
    assert final.stats["dropped_zero_signal"] == 7
    assert result["groups_sent"] == final.groups_sent == 9
    books = Books()
    for g in groups:
        books.group(g, version=0)
    books.status(final, 0)
    assert books.totals() == (9, {"sampler_zero_signal": 7})
    [e] = books.entries.values()
    assert e.sent() == e.arrived() == 9


def test_rounds_grow_until_their_groups_with_signal_fill_a_step(reward):
    """--prompts-per-round 0: one group of every round has signal, the learner trains 2 a step.
    Round 0 assumes a third have signal (2 / (1/3) = 6 prompts, or 24 for the default step of 8
    groups if the learner's first answer, which says the step's size, is not in yet); then the share
    seen so far sets the size: 1 of 6 -> ceil(2 / (1/6)) = 12 prompts, then 2 of 18 -> 18 (from 24:
    1 of 24 -> 48, 2 of 72 -> floored at 1/16 -> 32)."""
    s = sampler(reward, True, *free_ports(2), max_rounds=3)
    s.cfg.rollout.prompts_per_round = 0
    sizes = []
    real = s.parts.workflow.stream_round

    def counted(round_idx, n_prompts, **kw):
        sizes.append(n_prompts)
        return real(round_idx, n_prompts, **kw)

    s.parts.workflow.stream_round = counted
    run_against(s, ScriptedLearner(s.cfg.run.sync_port, facts(s, groups_per_step=2)))
    assert sizes in ([6, 12, 18], [24, 48, 32])


@pytest.mark.parametrize("filt", [True, False])
def test_round_sizes_fill_the_engines_smallest_bucket_within_the_budget(reward, filt):
    """--prompts-per-round 0 with a row-bucketed engine (CUDA graphs pad a round to 64 rows): a round
    smaller than the bucket is filled to it, here 64 / G=2 = 32 prompts, as the decode step costs
    the same; the learner's budget still bounds it (6 groups of room: 6 prompts unfiltered,
    ceil(6 / (1/3)) = 18 under the filter, whose share is a third before any round is scored).
    Round 0, before the learner's answer, assumes a step of 8 groups: 24 prompts under the filter,
    8 without. Without buckets (hf, or no graphs: this CPU engine) no floor."""
    s = sampler(reward, filt, *free_ports(2))
    try:
        s.cfg.rollout.prompts_per_round = 0
        assert s.parts.engine is not None and s.parts.engine.buckets == ()   # CPU: no graphs, exact sizes
        assert s.parts.workflow.bucket_prompts() == 1
        assert s.parts.workflow.round_prompts() == (24 if filt else 8)          # round 0
        s.parts.client.run_facts = facts(s, groups_per_step=2)
        assert s.parts.workflow.round_prompts() == (6 if filt else 2)           # 2 / (1/3), or 2 / 1
        s.parts.engine.buckets = (64, 128, 256)                          # what the engine has on CUDA
        assert s.parts.workflow.bucket_prompts() == 32
        assert s.parts.workflow.round_prompts() == 32
        s.parts.client.budget = 6
        assert s.parts.workflow.round_prompts() == (18 if filt else 6)
        s.parts.client.run_facts = None                                          # round 0 again: no budget said yet
        assert s.parts.workflow.round_prompts() == 32
    finally:
        s.parts.data.close()
        s.parts.sync.close()


def test_deferred_prompts_are_not_generated_again_at_once_and_the_books_balance(reward):
    """--defer-zero-signal, two real rounds over a real socket on a shard of 3 prompts: round 0's
    groups 1 and 2 have no signal (first_only), so round 1 passes over their prompts once (2 counted)
    and takes round 0's first prompt (epoch 1's only unmarked one) and then epoch 2's first two; all
    6 groups are sent (no filter) and the books balance."""
    data_port, sync_port = free_ports(2)
    receiver = DataReceiver("127.0.0.1", data_port, M.Limits(), 1 << 26)
    s = sampler(reward, False, data_port, sync_port, max_rounds=2, sync_timeout_s=0.2, heartbeat_interval_s=0,
                defer_zero_signal=True)
    prompts = s.parts.workflow.prompts
    prompts.mine = prompts.mine[:3]
    prompts.stream = PromptStream(prompts.mine, seed=s.cfg.run.seed, deferrals=prompts.deferrals)
    e = [[prompts.mine[i].question for i in prompts.stream._permutation(k)] for k in range(3)]
    result = run_against(s, no_update_learner(s))
    groups, final = drain(receiver)
    assert final is not None and result["groups_sent"] == final.groups_sent == 6
    asked = [next(q for q in e[0] if q in g.prefix) for g in groups]
    assert asked == [*e[0], e[0][0], *e[2][:2]] and final.stats["prompts_deferred"] == 2
    books = Books()
    for g in groups:
        books.group(g, version=0)
    books.status(final, 0)
    sent, dropped = books.totals()
    assert sent == 6 and dropped == {}
