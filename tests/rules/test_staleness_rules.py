"""grpo.rules.staleness, the one owner of the staleness rule and the generation budget, with numbers
worked by hand. (Named _rules: tests/e2e/test_staleness.py, the end-to-end run, has the plain name,
and pytest collects one basename once.)"""
from __future__ import annotations

from types import SimpleNamespace

from grpo.config import ROW_BUCKETS
from grpo.rules.staleness import (FIRST_SIGNAL_SHARE, Staleness, bucket_prompts, first_round_groups, next_round_prompts,
                                 pool_room, round_prompts, signal_share, staleness_advice, steps_left_by_time)


def test_drop_reason_by_hand():
    rule = Staleness(max_staleness=2, groups_per_step=8)
    assert rule.drop_reason(10, 10) is None                # sampled by the very weights being trained
    assert rule.drop_reason(8, 10) is None                 # 10 - 8 = 2: exactly the bound
    assert rule.drop_reason(7, 10) == "stale"              # 10 - 7 = 3 > 2
    assert rule.drop_reason(11, 10) == "future_version"    # newer than the learner: never trained
    assert Staleness(0).drop_reason(4, 4) is None and Staleness(0).drop_reason(3, 4) == "stale"


def test_of_reads_the_learners_run_facts():
    facts = SimpleNamespace(max_staleness=2, groups_per_step=8)
    assert Staleness.of(facts) == Staleness(2, 8)


def test_budget_by_hand():
    rule = Staleness(max_staleness=2, groups_per_step=8)
    # learner at 10, sampler at 10, nothing ahead: (2 + 1) x 8 = 24 positions are trained by version 12
    assert rule.budget(10, 10) == 24
    # 5 queued ahead: 24 - 5 = 19
    assert rule.budget(10, 10, queued=5) == 19
    # the sampler one version behind (lag 1): (2 - 1 + 1) x 8 - 5 = 11
    assert rule.budget(10, 9, queued=5) == 11
    assert rule.budget(10, 8) == 8                          # lag 2: only the next step's batch, (2 - 2 + 1) x 8
    assert rule.budget(10, 7) == 0                          # lag 3: anything it makes now is stale when trained
    assert rule.budget(10, 12) == 24                        # a sampler ahead of the learner counts as lag 0
    # ahead = queued + this sampler's in flight + those taken for the step in progress: 10 + 4 + 8 = 22
    assert rule.budget(10, 10, queued=10, in_flight=4, training=8) == 2
    assert rule.budget(10, 10, queued=30) == 0              # more ahead than can ever be trained in time
    assert rule.budget(10, 10, samplers=3) == 8             # 24 shared by three samplers
    assert rule.budget(10, 10, queued=5, samplers=2) == 9   # 19 // 2
    assert rule.largest_budget() == 24 and rule.largest_budget(samplers=2) == 12
    # steps left to --max-steps: the learner at 98 of 100 trains 2 x 8 = 16 more groups; 10 ahead leave 6
    assert rule.budget(98, 98, queued=10, steps_left=2) == 6
    assert rule.budget(98, 98, queued=10) == 14                      # the bound alone: 24 - 10
    assert rule.budget(99, 99, training=8, steps_left=1) == 0        # the last step has its groups
    # 8 - 3 = 5 left for 2 samplers: 3 each, rounded up (the bound's 24 - 3 = 21 shared is 10 each)
    assert rule.budget(99, 99, training=3, steps_left=1, samplers=2) == 3
    # 1 group left, 2 samplers: 1 each, never 0 each, which would leave the last step unfed
    assert rule.budget(99, 99, training=7, steps_left=1, samplers=2) == 1
    assert rule.budget(100, 100, steps_left=0) == 0                  # done: nothing more is trained
    assert rule.budget(10, 10, steps_left=50) == 24                  # far from the end: the bound decides


def test_budget_by_hand_small_steps():
    # staleness 4, 2 groups a step, nothing queued, sampler current: (4 + 1) * 2 = 10 groups
    rule = Staleness(max_staleness=4, groups_per_step=2)
    assert rule.budget(version=7, sampler_version=7, queued=0) == 10
    # 6 queued ahead: positions 6..9 are still trained by version 7 + 4 = 11
    assert rule.budget(7, 7, 6) == 4
    # the sampler's weights are 3 versions old: only (4 - 3 + 1) * 2 - 0 = 4 positions are safe
    assert rule.budget(7, 4, 0) == 4
    assert rule.budget(7, 2, 0) == 0          # 5 behind: nothing it makes now can be trained
    assert rule.budget(7, 7, 11) == 0         # more queued than it can ever train in time
    assert rule.budget(7, 7, 0, samplers=3) == 3   # 10 shared by three samplers
    # 1 queued, 2 of this sampler in flight, 2 taken for the step being collected: 5 ahead, 10 - 5
    assert rule.budget(7, 7, 1, 2, 2) == 5
    # staleness 0: only the next step's batch, and a step in progress (2 ahead) leaves no room
    assert Staleness(0, 2).budget(0, 0) == 2 and Staleness(0, 2).budget(0, 0, training=2) == 0


def test_the_budget_never_makes_a_group_the_learner_drops():
    """The two rules agree: a group at position p of the line (0-based) is trained at version
    V + p // groups_per_step; every position the budget allows is trained, and the first one past it
    is stale: the budget is exactly the room the drop rule leaves."""
    for stale, gps in [(2, 8), (0, 2), (4, 2), (1, 3)]:
        rule = Staleness(stale, gps)
        for version in (5, 6):
            for sampler_version in range(version - stale - 2, version + 1):
                for ahead in range(0, 3 * gps):
                    room = rule.budget(version, sampler_version, queued=ahead)
                    trained_at = [version + (ahead + k) // gps for k in range(room + 1)]
                    assert all(rule.drop_reason(sampler_version, v) is None for v in trained_at[:room])
                    assert rule.drop_reason(sampler_version, trained_at[room]) == "stale"


def test_steps_left_by_time_by_hand():
    # not known until 3 steps are timed
    assert steps_left_by_time(10.0, []) == -1 and steps_left_by_time(10.0, [2.0, 2.0]) == -1
    # 10 s left after steps of 2.5, 2.0 and 3.0 s: the step under way and ceil(10 / 2.0) = 5 more
    assert steps_left_by_time(10.0, [2.5, 2.0, 3.0]) == 6
    assert steps_left_by_time(10.5, [2.5, 2.0, 3.0]) == 7    # ceil(5.25): the last one started counts
    # only the last 5 are read: the early 1.0 s step is forgotten, the fastest since is 2.0
    assert steps_left_by_time(10.0, [1.0, 2.5, 2.0, 3.0, 2.2, 2.4]) == 6
    assert steps_left_by_time(10.0, [1.0, 2.5, 2.0, 3.0, 2.2]) == 11
    # the limit passed: the step under way only
    assert steps_left_by_time(0.0, [2.0] * 3) == 1 and steps_left_by_time(-4.0, [2.0] * 3) == 1
    # fed to the budget, 8 groups a step at bound 2, 10 queued: 1 s left is 2 steps, 16 - 10 = 6 where the
    # bound alone allows (2 + 1) x 8 - 10 = 14; 30 s left is 16 steps, and the bound decides
    rule = Staleness(max_staleness=2, groups_per_step=8)
    assert rule.budget(50, 50, queued=10, steps_left=steps_left_by_time(1.0, [2.0, 2.5, 2.1])) == 6
    assert rule.budget(50, 50, queued=10, steps_left=steps_left_by_time(30.0, [2.0, 2.5, 2.1])) == 14


def test_the_budget_never_makes_a_group_past_the_last_step():
    """With steps_left, every position the budget allows one sampler is trained by one of those
    steps: the group at position p of the line is trained by step p // groups_per_step + 1 of those
    left. Several samplers together may overshoot the end by at most samplers - 1 groups, and never
    leave it short while the bound has room."""
    for stale, gps in [(2, 8), (0, 2), (4, 2), (1, 3)]:
        rule = Staleness(stale, gps)
        for steps_left in range(0, stale + 3):
            for ahead in range(0, 3 * gps):
                room = rule.budget(7, 7, queued=ahead, steps_left=steps_left)
                assert all((ahead + k) // gps + 1 <= steps_left for k in range(room))
                # and it is the tighter of the two limits, never less
                end = max(0, steps_left * gps - ahead)
                assert room == min(rule.budget(7, 7, queued=ahead), end)
                for samplers in (2, 3):
                    each = rule.budget(7, 7, queued=ahead, samplers=samplers, steps_left=steps_left)
                    bound_each = rule.budget(7, 7, queued=ahead, samplers=samplers)
                    assert each * samplers <= end + samplers - 1
                    assert each == bound_each or each * samplers >= end   # the end is covered, or the bound rules


def test_round_prompts_by_hand():
    # 8 groups a step, every group has signal: 8 prompts fill a step
    assert round_prompts(8, 1.0) == 8
    # half the groups have signal: 16 prompts yield 8 with signal
    assert round_prompts(8, 0.5) == 16
    # 3 of 10 with signal: ceil(8 / 0.3) = ceil(26.67) = 27
    assert round_prompts(8, 0.3) == 27
    # no signal at all: floored at 1/16, so 8 * 16 = 128, then the cap of 64
    assert round_prompts(8, 0.0) == 64
    assert round_prompts(8, 0.0, cap=200) == 128
    # a budget of 6 queued groups at share 0.5 allows ceil(6 / 0.5) = 12 prompts (fewer than 16)
    assert round_prompts(8, 0.5, budget=6) == 12
    # a budget larger than a step's worth does not raise the round past one step
    assert round_prompts(8, 0.5, budget=40) == 16
    # never fewer than 1
    assert round_prompts(8, 1.0, budget=0) == 1
    # exact divisions do not round up by floating-point error: 6 / 0.75 = 8
    assert round_prompts(6, 0.75) == 8
    # the defaults' step of 2 groups (G=8), every group sent: 2 prompts, 16 rows; a floor of 8 prompts
    # (the 64-row bucket those 16 rows are padded to) fills the bucket, within the budget: with 6
    # groups of room (--max-staleness 2: 3 steps of 2) 6 prompts, with room for 10 the whole 8
    assert round_prompts(2, 1.0) == 2
    assert round_prompts(2, 1.0, min_prompts=8) == 8
    assert round_prompts(2, 1.0, budget=6, min_prompts=8) == 6
    assert round_prompts(2, 1.0, budget=10, min_prompts=8) == 8
    # at share 0.5 the budget of 3 groups allows ceil(3 / 0.5) = 6 prompts, the floor asks for 8
    assert round_prompts(2, 0.5, budget=3, min_prompts=8) == 6
    # a round already past the floor is not changed by it; the cap still bounds it
    assert round_prompts(8, 0.5, min_prompts=8) == 16
    assert round_prompts(2, 1.0, min_prompts=100) == 64
    # the rule's own step: Staleness(2, 8) at share 0.5 within a budget of 6 is round_prompts(8, 0.5, 6)
    assert Staleness(2, 8).round_prompts(0.5, budget=6) == 12


def test_next_round_prompts_by_hand():
    """A sampler's round: (prompts_per_round, budget, the learner's groups_per_step, share, cap, floor)."""
    # --prompts-per-round 5: 5, cut to the budget; a budget of 0 waits (0)
    assert next_round_prompts(5, -1, 8, 1.0) == 5
    assert next_round_prompts(5, 3, 8, 1.0) == 3 and next_round_prompts(5, 0, 8, 1.0) == 0
    # --prompts-per-round 0 before the learner said its step (0): FIRST_STEP_GROUPS, 8 / (1/3) = 24
    # under the filter (FIRST_SIGNAL_SHARE), 8 without; no budget applies yet
    assert next_round_prompts(0, -1, 0, FIRST_SIGNAL_SHARE) == 24 and next_round_prompts(0, -1, 0, 1.0) == 8
    assert next_round_prompts(0, 6, 0, 1.0, min_prompts=32) == 32
    # a step of 2 groups: 2 / (1/3) = 6, or 2; a 32-prompt floor within a budget of 6: 6, or 18 at share 1/3
    assert next_round_prompts(0, -1, 2, FIRST_SIGNAL_SHARE) == 6 and next_round_prompts(0, -1, 2, 1.0) == 2
    assert next_round_prompts(0, 6, 2, 1.0, min_prompts=32) == 6
    assert next_round_prompts(0, 6, 2, FIRST_SIGNAL_SHARE, min_prompts=32) == 18
    # a budget of 0 waits, whatever the step
    assert next_round_prompts(0, 0, 8, 1.0) == 0 and next_round_prompts(0, 0, 0, 1.0) == 0


def test_signal_share_by_hand():
    assert signal_share([], True) == FIRST_SIGNAL_SHARE          # nothing scored yet
    assert signal_share([(1, 6)], True) == 1 / 6
    assert signal_share([(1, 6), (1, 12)], True) == 2 / 18       # groups, not rounds, weigh
    assert signal_share([(0, 5)], False) == 1.0                  # without the filter every group is sent
    # the newest chunks back until they hold min_groups groups: over 6, the last two of these
    assert signal_share([(0, 4), (3, 4), (1, 2)], True, min_groups=6) == 4 / 6
    assert signal_share([(0, 4), (3, 4), (1, 2)], True, min_groups=7) == 4 / 10   # all: 6 is not 7
    assert signal_share([(0, 4), (3, 4), (1, 2)], True, min_groups=2) == 1 / 2
    # a streaming sampler's chunks of one group: 64 of them weigh, not the last four
    ones = [(1, 1)] * 60 + [(0, 1)] * 4
    assert signal_share(ones, True) == 60 / 64 and signal_share(ones[1:], True) == 59 / 63


def test_bucket_prompts_by_hand():
    assert bucket_prompts(ROW_BUCKETS, 8) == 8      # 64 rows / 8
    assert bucket_prompts(ROW_BUCKETS, 16) == 4
    assert bucket_prompts(ROW_BUCKETS, 3) == 22     # ceil(64 / 3)
    assert bucket_prompts((), 8) == 1               # no buckets (hf, eager): no floor


def test_largest_round_prompts_by_hand():
    """The most prompts a round can take (the memory plan's KV cache): round 0 (8 groups at share 1/3
    under the filter, 1 without) or a later round at share 1/16 (1 without) within the largest
    budget, (max_staleness + 1) x groups a step over the samplers, whichever is larger."""
    # the defaults (G=8, 16 rows a step: 2 groups; --max-staleness 2), a floor of 8 prompts (the
    # 64-row bucket): round 0 max(8, 8) = 8; later rounds min(max(2, 8), budget 6) = 6. So 8.
    assert Staleness(2, 2).largest_round_prompts(False, 64, min_prompts=8) == 8
    # the same under --filter-zero-signal: round 0 ceil(8 / (1/3)) = 24; later ceil(2 x 16) = 32,
    # within ceil(6 x 16) = 96. So 32.
    assert Staleness(2, 2).largest_round_prompts(True, 64, min_prompts=8) == 32
    # the benchmark's (G=16, 128 rows: 8 groups a step, floor 4): later 8 x 16 = 128, capped at 64
    assert Staleness(2, 8).largest_round_prompts(True, 64, min_prompts=4) == 64
    # without the filter, a step of 8 groups: round 0 and later rounds both 8
    assert Staleness(2, 8).largest_round_prompts(False, 64, min_prompts=4) == 8
    # --max-staleness 0 and two samplers on the port, no filter, step of 4: budget 4 // 2 = 2, so
    # later rounds take 2 (the floor of 8 is bounded by it), round 0 takes 8
    assert Staleness(0, 4).largest_round_prompts(False, 64, min_prompts=8, samplers=2) == 8
    # a step of 16 groups, two samplers, no floor: later rounds min(16, budget 16 // 2 = 8) = 8, round 0
    # 8 too; with --max-staleness 1 the budget is 32 // 2 = 16, so later rounds take 16
    assert Staleness(0, 16).largest_round_prompts(False, 64, samplers=2) == 8
    assert Staleness(1, 16).largest_round_prompts(False, 64, samplers=2) == 16
    # the budget it uses is the learner's for an empty line and a sampler at its version
    for gps, stale, n in [(2, 2, 1), (8, 0, 2), (5, 3, 3)]:
        assert Staleness(stale, gps).largest_budget(n) == Staleness(stale, gps).budget(7, 7, samplers=n) \
            == (stale + 1) * gps // n


def test_pool_room_by_hand():
    # budget 8 at a share of 0.7: ceil(8 / 0.7) = ceil(11.43) = 12 prompts may be in the pool
    assert pool_room(8, 0, 0.7) == 12 and pool_room(8, 5, 0.7) == 7 and pool_room(8, 12, 0.7) == 0
    assert pool_room(8, 15, 0.7) == 0            # the budget fell below the pool: none until it shrinks
    assert pool_room(0, 0, 1.0) == 0             # the learner's line is full
    assert pool_room(-1, 400, 0.5) == -1         # no limit said
    assert pool_room(3, 1, 1.0) == 2             # every group sent (no filter): one prompt a group
    assert pool_room(7, 0, 0.5) == 14 and pool_room(7, 0, 0.4) == 18   # ceil(17.5)
    assert pool_room(1, 0, 0.0) == 16            # a share floored at 1/16: 1 / (1/16)


def test_a_pool_within_the_room_never_holds_more_than_a_round_would():
    # pool_room's bound is round_prompts' cut at the same budget (no cap, no step size in the way)
    for budget in range(0, 40):
        for share in (1 / 16, 0.1, 1 / 3, 0.5, 0.7, 1.0):
            room = pool_room(budget, 0, share)
            assert room == (round_prompts(10 ** 6, share, budget, cap=10 ** 6) if budget else 0)


def test_staleness_advice_by_hand():
    ages = {0: 10, 1: 30, 2: 40, 3: 15, 4: 5}   # 100 judged; 20 older than 2: 20%
    line = staleness_advice(ages, 2)
    # 98 of 100 are needed: 95 are at most 3 old, all 100 at most 4
    assert line.startswith("staleness: 20% of the 100 groups judged were older than --max-staleness 2 and dropped "
                           "(groups by age in versions: 0: 10, 1: 30, 2: 40, 3: 15, 4: 5); 98% of them were at "
                           "most 4 versions old, so --max-staleness 4 would have trained them"), line
    assert "at most 3 versions old" in staleness_advice(ages, 2, keep=0.95)
    assert staleness_advice(ages, 4) is None                      # none dropped
    assert staleness_advice({0: 98, 1: 1, 5: 1}, 1) is None       # 1 of 100 dropped: within 2%
    assert "at most 5 versions" in staleness_advice({0: 97, 5: 3}, 1)   # 3 of 100: 97 < 98 kept
    # the 4x H200 0.5B run at bound 7: 121 of 4,944, 2.4%, which a whole percent would print as 2%
    run = {0: 8, 1: 10, 2: 55, 3: 443, 4: 1194, 5: 1430, 6: 1095, 7: 588, 8: 110, 9: 11}
    assert staleness_advice(run, 7).startswith("staleness: 2.4% of the 4944 groups judged were older than "
                                               "--max-staleness 7")
    assert staleness_advice({}, 2) is None


def test_pool_rows_by_hand():
    """Steps of 128 completions in groups of 16 (8 groups a step). A pool's steady budget is the
    learner's with one step's groups taken and nothing queued, lag 0: (s + 1) x 8 - 8 = s x 8 groups,
    shared by the samplers, 16 rows each."""
    rule = Staleness(max_staleness=2, groups_per_step=8)
    assert rule.budget(5, 5, training=8) == 16 == 2 * 8            # the budget pool_rows is drawn from
    assert rule.pool_rows(16, samplers=1) == 16 * 16 == 256
    assert rule.pool_rows(16, samplers=2) == 8 * 16 == 128
    assert Staleness(4, 8).pool_rows(16, samplers=1) == 32 * 16 == 512
    assert Staleness(2, 8).pool_rows(16, samplers=3) == 5 * 16     # 16 groups over 3: 5 each (floor)
    # the smallest bound that keeps 320 rows (20 groups of 16) decoding
    assert Staleness(2, 8).staleness_for_pool(320, 16, samplers=2) == 5      # 5 x 8 / 2 = 20 groups
    assert Staleness(2, 8).staleness_for_pool(320, 16, samplers=1) == 3      # 3 x 8 = 24 >= 20; 2 x 8 = 16 < 20
    assert Staleness(2, 8).staleness_for_pool(8, 16, samplers=1) == 1        # never below 1
    for s, n in ((2, 1), (2, 2), (4, 3)):
        need = Staleness(s, 8).staleness_for_pool(300, 16, samplers=n)
        assert Staleness(need, 8).pool_rows(16, n) >= 300 > Staleness(need - 1, 8).pool_rows(16, n)


def test_first_round_groups_by_hand():
    """Round 0 made before the learner's first answer: no step size (8 groups assumed), no budget."""
    assert first_round_groups(0, False) == 8                    # 8 prompts, every group sent
    assert first_round_groups(0, True) == 8                     # 24 prompts at a third: 8 expected to be sent
    assert first_round_groups(0, False, min_prompts=8) == 8     # the 64-row bucket at G=8: 8 prompts anyway
    assert first_round_groups(0, False, min_prompts=22) == 22   # G=3: ceil(64 / 3) prompts cost the same as 8
    assert first_round_groups(0, False, cap=4) == 4             # --max-prompts-per-round 4
    assert first_round_groups(12, False) == 12                  # --prompts-per-round 12, as given
    assert first_round_groups(12, True) == 4                    # 12 at a third under the filter


def test_staleness_for_first_round_by_hand():
    """The smallest bound under which the learner trains every group of the samplers' round 0, all of
    version 0: (bound + 1) x groups a step of them, one step at each version 0..bound."""
    assert Staleness(2, 2).staleness_for_first_round(8) == 3               # 4 x 2 = 8; 3 x 2 = 6 < 8
    assert Staleness(2, 2).staleness_for_first_round(8, samplers=2) == 7   # 16 groups of version 0
    assert Staleness(2, 2).staleness_for_first_round(6) == 2               # 3 x 2 = 6: the default fits
    assert Staleness(2, 2).staleness_for_first_round(7) == 3               # ceil(7 / 2) - 1
    assert Staleness(2, 8).staleness_for_first_round(8) == 0               # one step trains them all
    assert Staleness(2, 1).staleness_for_first_round(8) == 7
    # it is the bound whose largest budget (what an empty line lets a sampler make) first takes them
    for gps, groups, n in [(2, 8, 1), (3, 8, 2), (1, 5, 3), (8, 24, 1)]:
        need = Staleness(2, gps).staleness_for_first_round(groups, n)
        assert Staleness(need, gps).largest_budget() >= groups * n
        assert need == 0 or Staleness(need - 1, gps).largest_budget() < groups * n
