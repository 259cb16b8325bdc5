"""The staleness and generation-budget owner: pure rules, no I/O, no torch or numpy (the launcher's
memory plan imports it), no state beyond the run's two settings (the callers keep their counts).

Every module that asks how old a trained group may be, or how many groups a sampler may make,
asks here (the job of AReaL's staleness manager):

  drop     the learner at version V trains a group of version v only if 0 <= V - v <= max_staleness:
           older is `stale`, newer than V is `future_version` (grpo.learner.intake)
  budget   how many groups one sampler may generate now with none certain to be dropped as stale,
           nor past what the steps left to --max-steps train, or those --max-time-s leaves time for
           (steps_left_by_time); every answer on the sync port carries it (grpo.sync.answer)
  rounds   how many prompts a sampler's round takes: enough that its groups with signal fill one
           learner step, within that budget (grpo.sampler); and the most a round can ever take,
           which the memory plan sizes the KV cache for (grpo.rules.memory)
  pool     a sampler that streams without rounds (in flight, swapping weights between decode
           steps) starts a prompt whenever its pool of groups not yet ended fits that budget
  round 0  what a sampler's first round may send with no budget (made before the learner's first
           answer), and the bound that trains all of it (the launcher raises a default bound to it)
  advice   at the run's end, when more groups were dropped as stale than a run should lose: the
           bound that the ages the learner saw fit in (the budget counts the line ahead of a
           group, not how long its longest completion takes to generate)

A group's age, V - v, is grpo.stats.staleness: the step record's staleness_mean and staleness_max
are computed in grpo.stats, a layer below this one that cannot import it, so the one definition
sits there and the rules here use it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Reversible, Sequence

from grpo.config import SamplerRollout
from grpo.stats import staleness

MAX_PROMPTS = SamplerRollout.max_prompts_per_round   # a round's cap where the caller gives none

# --prompts-per-round 0: the share of groups with signal assumed until a round has been scored (under
# --filter-zero-signal; without it every group is sent, a share of 1), and the step's size assumed
# until the learner's answer says it (the benchmark's: 128 completions, G=16). Round 0 is generated
# before that answer, with round_prompts' rule on the two: 8 / (1/3) = 24 prompts, 8 without the filter.
# The first optimizer step waits for round 0 to yield a step's worth of groups with signal; a round
# 0 that falls short costs a second round on the first step's path (docs/benchmarks.md, "Start-up:
# what moved it": assuming a third took that second round off the first step).
# A round 0 larger than the learner's staleness bound can take is dropped as stale in part: with the
# defaults (steps of 2 groups of 8, --max-staleness 2) the learner trains 6 groups of version 0 and
# round 0's 8 (FIRST_STEP_GROUPS; the 64-row smallest bucket with CUDA graphs) lost 2, so the launcher
# raises a default bound to the one that trains them all (first_round_groups,
# Staleness.staleness_for_first_round: 3 there).
FIRST_SIGNAL_SHARE = 1 / 3
FIRST_STEP_GROUPS = 8
# The lowest share of groups with signal a round is sized for: a round that found none cannot ask
# for unboundedly many.
MIN_SIGNAL_SHARE = 1 / 16


# Timed steps before --max-time-s's steps left are estimated, and how many recent ones the estimate reads.
TIMED_STEPS_KNOWN = 3
TIMED_STEPS_RECENT = 5


def steps_left_by_time(remaining_s: float, recent_step_s: Sequence[float]) -> int:
    """The steps a learner that stops after the step ending past --max-time-s will still take, the
    one being collected or trained included (Staleness.budget's steps_left): -1, not known, until
    TIMED_STEPS_KNOWN steps are timed; then one for the step under way and one for each of the
    fastest recent steps (the last TIMED_STEPS_RECENT) that fits in the time left, the last one
    started before the limit counted whole. 10 s left after steps of 2.5, 2.0 and 3.0 s:
    1 + ceil(10 / 2.0) = 6; no time left: 1, the step under way.

    The fastest, not the median: once the samplers stop generating at the end, a learner that
    shares their GPU steps faster, so the estimate errs towards feeding a step that may not come
    (its groups made in vain, as without the estimate) rather than starving one that does."""
    if len(recent_step_s) < TIMED_STEPS_KNOWN:
        return -1
    fastest = max(min(recent_step_s[-TIMED_STEPS_RECENT:]), 1e-3)
    return 1 + max(0, math.ceil(max(0.0, remaining_s) / fastest))


@dataclass(frozen=True)
class Staleness:
    """The run's staleness bound and step size, and the rules that follow from them (module docstring)."""
    max_staleness: int        # a group more than this many versions older than the learner that trains it is dropped
    groups_per_step: int = 0  # groups one learner step trains (its train batch / G); 0: not known

    @classmethod
    def of(cls, facts) -> Staleness:
        """The rule of the learner's run facts (grpo.wire.messages.RunFacts)."""
        return cls(facts.max_staleness, facts.groups_per_step)

    def drop_reason(self, group_version: int, learner_version: int) -> str | None:
        """Why the learner at `learner_version` must not train on a group of `group_version` for its
        age ('future_version', 'stale'), or None."""
        if group_version > learner_version:
            return "future_version"
        if staleness(learner_version, group_version) > self.max_staleness:
            return "stale"
        return None

    def budget(self, version: int, sampler_version: int, queued: int = 0, in_flight: int = 0, training: int = 0,
               samplers: int = 1, steps_left: int = -1) -> int:
        """How many groups one sampler may generate now with none of them certain to be dropped as stale,
        or to be left untrained when the run ends.

        A group made from `sampler_version` joins the learner's line behind the groups ahead of it:
        `queued`, this sampler's still `in_flight` (grpo.sync.flow.gap_floor), and those already
        taken for the step being collected or trained (`training`: they fill its batch before any
        queued group). The learner, at `version`, trains groups_per_step a step, so the group at
        position p (0-based) of that line is trained at version + p // groups_per_step and is stale
        once that is more than sampler_version + max_staleness. Positions
        p < (max_staleness - lag + 1) * groups_per_step are safe (lag = version - sampler_version):
        AReaL's bound of (staleness + 1) x batch rollouts in flight, less what is ahead. Samplers
        on one port share it evenly.

        steps_left: the steps the learner will still take, the one being collected or trained
        included (--max-steps less its version, or steps_left_by_time's estimate under --max-time-s,
        whichever is fewer; -1: no end known). Those steps train
        steps_left x groups_per_step groups in all, so no more than that, less what is ahead, may
        be made: a group past them would be generated and never trained. Learner at 98 of
        --max-steps 100, 8 groups a step, 10 ahead: 2 x 8 - 10 = 6, where the bound alone allows more.
        Shared by samplers rounded up, not down: the bound's room grows again as the learner steps,
        but the end's grows only once its last groups have come, so 1 group left for 2 samplers is
        1 each (at most samplers - 1 made in vain), never 0 each (the last step never fed).
        """
        lag = max(0, version - sampler_version)
        ahead = queued + in_flight + training
        n = max(1, samplers)
        room = max(0, (self.max_staleness - lag + 1) * self.groups_per_step - ahead) // n
        if steps_left >= 0:
            room = min(room, -(-max(0, steps_left * self.groups_per_step - ahead) // n))
        return room

    def largest_budget(self, samplers: int = 1) -> int:
        """The largest budget a learner answers: that of an empty line and a sampler at its version,
        (max_staleness + 1) x groups_per_step shared by the samplers."""
        return self.budget(0, 0, samplers=samplers)

    def pool_rows(self, group_size: int, samplers: int = 1) -> int:
        """The most rows a streaming sampler's pool keeps decoding once the run is under way, every
        group counted as reaching the learner: the budget of a sampler at the learner's version with
        one step's groups taken (the step being collected or trained) and nothing queued,
        max_staleness x groups_per_step groups shared by the samplers, group_size rows each. Steps
        of 8 groups of 16 rows at --max-staleness 2: 2 x 8 / 2 = 8 groups, 128 rows, for each of
        2 samplers; at 4 with one sampler, 32 groups, 512 rows. Where zero-signal groups are
        filtered a pool holds more prompts than this (pool_room counts budget / share)."""
        return self.max_staleness * self.groups_per_step // max(1, samplers) * group_size

    def staleness_for_pool(self, rows: int, group_size: int, samplers: int = 1) -> int:
        """The smallest max_staleness whose pool_rows reach `rows`: 320 rows of groups of 16 (20
        groups) with steps of 8 groups take ceil(20 x 2 / 8) = 5 for 2 samplers, ceil(20 / 8) = 3
        for one."""
        groups = -(-rows // max(1, group_size))
        return max(1, -(-groups * max(1, samplers) // max(1, self.groups_per_step)))

    def staleness_for_first_round(self, groups: int, samplers: int = 1) -> int:
        """The smallest max_staleness that trains every group of the samplers' round 0, `groups` each
        (first_round_groups), all of version 0: the learner trains groups_per_step of them a step,
        so up to version max_staleness it trains (max_staleness + 1) x groups_per_step. 8 groups of
        one sampler with steps of 2 groups take ceil(8 / 2) - 1 = 3; of 2 samplers, 7; with steps of
        8 groups, 0."""
        return max(0, -(-groups * max(1, samplers) // max(1, self.groups_per_step)) - 1)

    def round_prompts(self, signal_share: float, budget: int = -1, cap: int = MAX_PROMPTS, min_prompts: int = 1) -> int:
        """round_prompts for a step of this rule's groups_per_step."""
        return round_prompts(self.groups_per_step, signal_share, budget, cap, min_prompts=min_prompts)

    def largest_round_prompts(self, filter_zero_signal: bool, cap: int = MAX_PROMPTS, min_prompts: int = 1,
                              samplers: int = 1) -> int:
        """The most prompts a sampler's round can take under --prompts-per-round 0 (what the memory
        plan sizes its KV cache for): the larger of round 0 (FIRST_STEP_GROUPS at FIRST_SIGNAL_SHARE,
        no budget yet) and a later round at the lowest share round_prompts counts (1 without
        --filter-zero-signal: every group is sent) within the largest budget."""
        first_share, share = (FIRST_SIGNAL_SHARE, MIN_SIGNAL_SHARE) if filter_zero_signal else (1.0, 1.0)
        first = round_prompts(FIRST_STEP_GROUPS, first_share, cap=cap, min_prompts=min_prompts)
        return max(first, self.round_prompts(share, self.largest_budget(samplers), cap, min_prompts))


def round_prompts(groups_per_step: int, signal_share: float, budget: int = -1, cap: int = MAX_PROMPTS,
                  min_share: float = MIN_SIGNAL_SHARE, min_prompts: int = 1) -> int:
    """Prompts for a sampler's next round (--prompts-per-round 0): enough that the groups with
    signal it yields fill one learner step, whatever the zero-signal share.

    signal_share: the share of recent groups that had signal (1.0 without --filter-zero-signal,
    where every group is sent), floored at min_share so a round that found none cannot ask for
    unboundedly many. min_prompts: a round has at least these (the sampler's: enough to fill the
    decode step's smallest row bucket, which costs the same for fewer rows). budget: groups the
    learner can still queue before they go stale (-1: no limit); it counts groups that reach its
    queue, so it allows budget / share prompts, and it bounds min_prompts too: no round makes a
    group certain to go stale. At least 1 (a budget of 0 is the caller's to handle: it waits), at
    most cap.
    """
    share = min(1.0, max(signal_share, min_share))
    want = max(math.ceil(groups_per_step / share - 1e-9), min_prompts)
    if budget >= 0:
        want = min(want, math.ceil(budget / share - 1e-9))
    return max(1, min(cap, want))


def next_round_prompts(prompts_per_round: int, budget: int, groups_per_step: int, signal_share: float,
                       cap: int = MAX_PROMPTS, min_prompts: int = 1) -> int:
    """A sampler's next round: --prompts-per-round when set (> 0), cut to the learner's budget;
    under 0, round_prompts for the learner's step within that budget, or, while the step's size is
    not known (groups_per_step 0: before the learner's first answer), for FIRST_STEP_GROUPS with no
    budget. 0: the budget is 0, and the sampler waits.

    budget: the learner's last answer's (-1: no limit said)."""
    if prompts_per_round > 0:
        return prompts_per_round if budget < 0 else min(prompts_per_round, budget)
    if budget == 0:
        return 0
    if not groups_per_step:
        return round_prompts(FIRST_STEP_GROUPS, signal_share, cap=cap, min_prompts=min_prompts)
    return round_prompts(groups_per_step, signal_share, budget, cap, min_prompts=min_prompts)


def first_round_groups(prompts_per_round: int, filter_zero_signal: bool, cap: int = MAX_PROMPTS,
                       min_prompts: int = 1) -> int:
    """The groups a sampler's round 0 sends when it is made before the learner's first answer, which
    says the step's size and the budget (grpo.sampler.weights_client: a sampler does not wait for it):
    next_round_prompts with neither, counted as reaching the learner at the share signal_share
    assumes before any group is scored. The defaults: FIRST_STEP_GROUPS, 8; 24 prompts at a third
    under --filter-zero-signal, 8; --prompts-per-round 12, 12 (4 filtered); 8 prompts at least where
    the engine's smallest bucket holds 64 rows of G=8 (min_prompts, bucket_prompts)."""
    share = signal_share((), filter_zero_signal)
    return math.ceil(next_round_prompts(prompts_per_round, -1, 0, share, cap, min_prompts) * share - 1e-9)


def pool_room(budget: int, in_pool: int, signal_share: float, min_share: float = MIN_SIGNAL_SHARE) -> int:
    """How many more prompts a sampler streaming without rounds may start now (-1: no limit).

    budget: groups the learner can still take from this sampler before they go stale, as its last
    answer said less the groups handed to the data socket since the request it answered (-1: no
    limit said); in_pool: prompts started whose groups have not ended yet. Those groups are not yet
    in the learner's count, and a share signal_share of each prompt's groups will reach it (floored
    at min_share, as round_prompts does), so the pool may hold ceil(budget / share) prompts, the
    most a round would take on that budget: budget 8 at a share of 0.7 allows 12, so with 5 in the
    pool 7 more may start; a pool already past it (the budget fell) starts none and shrinks as
    its groups end.
    """
    if budget < 0:
        return -1
    share = min(1.0, max(signal_share, min_share))
    return max(0, math.ceil(budget / share - 1e-9) - in_pool)


# Versions beyond the bound that fills a streaming pool (Staleness.staleness_for_pool) that the
# launcher gives a default bound: a group is as old as its first token, and its longest completion
# ends versions after that while the learner steps on younger groups. Two samplers of 320 rows at
# bound 6 (fill 5) on 4x H200 dropped 9.3% of the groups judged, and 99.2% were at most 7 = fill + 2
# versions old; one sampler at 4 (fill 3) on 2x H200 dropped 0.4% (docs/benchmarks.md).
IN_FLIGHT_SPAN = 2


def flight_span(screen_generations: int) -> int:
    """IN_FLIGHT_SPAN for a sampler's groups: twice it with --screen-generations, whose rest of a
    group starts only once its screen has ended, so a group's first token is one generation older
    (two `--gpus 0` rows at fill 3 + 2 dropped 17% and 19% of the groups judged, ages up to 7).
    It narrows the drops without ending them: a screen takes K rows, so the budget, not the rows,
    caps what a screening sampler starts, and its line then fills whatever bound it is given
    (docs/benchmarks.md, "Screening at bound 7")."""
    return IN_FLIGHT_SPAN * (2 if screen_generations else 1)

# A run that drops more than this share of the groups it judged as stale gets a line at its end.
STALE_SHARE_NOTE = 0.02


def staleness_advice(ages: dict[int, int], max_staleness: int, keep: float = 1 - STALE_SHARE_NOTE) -> str | None:
    """One line when more than 1 - keep of the groups the learner judged were older than
    max_staleness (dropped as stale): the share, the ages, and the smallest bound that `keep` of
    those ages fit in. ages: age (learner version - group version, >= 0) -> groups judged at it.
    {0: 10, 1: 30, 2: 40, 3: 15, 4: 5} at 2: 20% older; 95% are at most 3 and 100% at most 4, so 4.
    None when the share is within it, or nothing was judged."""
    total = sum(ages.values())
    stale = sum(n for a, n in ages.items() if a > max_staleness)
    if not total or stale <= (1 - keep) * total + 1e-9:
        return None
    seen, fit = 0, max(ages)
    for age in sorted(ages):
        seen += ages[age]
        if seen >= keep * total - 1e-9:
            fit = age
            break
    spread = ", ".join(f"{a}: {n}" for a, n in sorted(ages.items()))
    share = f"{stale / total:.1%}" if stale < 0.1 * total else f"{stale / total:.0%}"   # 2.4%, not 2%, near 2%
    return (f"staleness: {share} of the {total} groups judged were older than --max-staleness "
            f"{max_staleness} and dropped (groups by age in versions: {spread}); {keep:.0%} of them were at most "
            f"{fit} versions old, so --max-staleness {fit} would have trained them (a group is as old as its "
            f"first token, and in flight its longest completion takes versions to generate; a larger bound "
            f"also lets each sampler keep more rows in flight, with the off-policy correction of --tis-cap)")


# The share of groups with signal is taken over at least this many of the newest groups scored.
# It sizes what a sampler starts by its reciprocal (round_prompts, pool_room), and a streaming
# sampler finishes groups one or two at a time: over its last four chunks the share swung so far
# that its reciprocal averaged 11-18% above the run's own on 4x H200, and the extra groups waited
# in a line already at the budget's length; over 64 groups, 1% above (docs/benchmarks.md).
SIGNAL_GROUPS = 64


def signal_share(recent: Reversible[tuple[int, int]], filter_zero_signal: bool,
                 min_groups: int = SIGNAL_GROUPS) -> float:
    """The share of the newest groups scored that had signal, from (kept, groups) per chunk of
    groups finished, oldest first: the newest chunks back until they hold at least min_groups
    groups (all of them while fewer were scored). 1.0 without --filter-zero-signal (every group is
    sent), FIRST_SIGNAL_SHARE before any group is scored. [(0, 4), (3, 4), (1, 2)] over 6 groups:
    the last two chunks, 4 / 6."""
    if not filter_zero_signal:
        return 1.0
    kept = total = 0
    for k, n in reversed(recent):   # a deque or list: no copy (asked at every prompt a stream may start)
        kept, total = kept + k, total + n
        if total >= min_groups:
            break
    return kept / total if total else FIRST_SIGNAL_SHARE


def bucket_prompts(buckets: tuple[int, ...], group: int) -> int:
    """Prompts that fill the smallest of the engine's row buckets (64 rows with CUDA graphs: 8 at
    G=8): a decode step of fewer rows is padded to it and costs the same, so a round of fewer
    prompts takes as long as this many. 1 without buckets (hf, eager)."""
    return math.ceil(buckets[0] / group) if buckets else 1
