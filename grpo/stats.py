"""What a learner step record computes from the groups it trained on: pure functions, no I/O.

Staleness is defined once here: a group sampled by policy version g and trained on by the
learner at version v (its version *before* that step's update) is v - g versions old. The
learner drops a group older than --max-staleness by this measure (grpo.learner.intake) and
logs it with every step (staleness_mean, staleness_max).
"""
from __future__ import annotations

import math
import zlib


def staleness(learner_version: int, group_version: int) -> int:
    """Optimizer steps between the policy that sampled a group and the learner that trains on it."""
    return learner_version - group_version


# --prompts-per-round 0: the share of groups with signal assumed until a round has been scored (under
# --filter-zero-signal; without it every group is sent, a share of 1), and the step's size assumed
# until the learner's answer says it (the benchmark's: 128 completions, G=16). Round 0 is generated
# before that answer, with round_prompts' rule on the two: 8 / (1/3) = 24 prompts, 8 without the filter.
# The first optimizer step waits for round 0 to yield a step's worth of groups with signal; a round
# 0 that falls short costs a second round, about 4 s of the first step on an H200 (where 1,024 rows
# took 3.5-6.4 s and 256 took 2.2-3.8 s). Round 0's share with signal was 0.44-0.56 on basic_arithmetic
# and 0.69-0.81 on letter_counting (docs/benchmarks.md); at an assumed half, 16 prompts gave 7 of 8.
# A round 0 larger than the learner's staleness bound can take is dropped as stale in part: with the
# defaults (steps of 2 groups of 8, --max-staleness 2) the learner trains 6 groups of version 0, and
# 24 prompts unfiltered lost 20 of them (bench/results/scale_NVIDIA_H200.json,
# row smollm2_exp).
FIRST_SIGNAL_SHARE = 1 / 3
FIRST_STEP_GROUPS = 8
# The lowest share of groups with signal a round is sized for: a round that found none cannot ask
# for unboundedly many.
MIN_SIGNAL_SHARE = 1 / 16


def round_prompts(groups_per_step: int, signal_share: float, budget: int = -1, cap: int = 64,
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


def bucket_prompts(buckets: tuple[int, ...], group: int) -> int:
    """Prompts that fill the smallest of the engine's row buckets (64 rows with CUDA graphs: 8 at
    G=8): a decode step of fewer rows is padded to it and costs the same, so a round of fewer
    prompts takes as long as this many. 1 without buckets (hf, eager)."""
    return math.ceil(buckets[0] / group) if buckets else 1


def largest_round_prompts(groups_per_step: int, max_staleness: int, filter_zero_signal: bool, cap: int = 64,
                          min_prompts: int = 1, samplers: int = 1) -> int:
    """The most prompts a sampler's round can take under --prompts-per-round 0 (what the memory
    plan sizes its KV cache for): the larger of round 0 (FIRST_STEP_GROUPS at FIRST_SIGNAL_SHARE,
    no budget yet) and a later round at the lowest share round_prompts counts (1 without
    --filter-zero-signal: every group is sent) and the largest budget a learner answers, that of
    an empty queue and a sampler at its version: (max_staleness + 1) x groups_per_step, shared
    evenly by the samplers on its port (grpo.sync.flow.generation_budget)."""
    first_share, share = (FIRST_SIGNAL_SHARE, MIN_SIGNAL_SHARE) if filter_zero_signal else (1.0, 1.0)
    first = round_prompts(FIRST_STEP_GROUPS, first_share, cap=cap, min_prompts=min_prompts)
    budget = max(0, max_staleness + 1) * groups_per_step // max(1, samplers)
    return max(first, round_prompts(groups_per_step, share, budget, cap, min_prompts=min_prompts))


# A run whose samplers find almost no group with signal: the share of groups sent with zero
# signal, over at least this many groups since the last look, above which the learner says so.
ZERO_SIGNAL_ALARM_SHARE = 0.9
ZERO_SIGNAL_ALARM_GROUPS = 256


def zero_signal_alarm(sent: int, zero_signal: int, share: float = ZERO_SIGNAL_ALARM_SHARE,
                      min_groups: int = ZERO_SIGNAL_ALARM_GROUPS) -> str | None:
    """One line when `zero_signal` of the `sent` groups offered since the last look (at least
    `min_groups` of them) reach `share`, else None. Such a run spins: its samplers generate
    sent / (sent - zero_signal) groups for each one trained and its steps wait for data. Seen in
    docs/benchmarks.md: on letter_counting the policy had settled on one answer for every
    question; on basic_arithmetic it had become right on most problems and still improved."""
    if sent < max(min_groups, 1) or zero_signal < share * sent:
        return None
    useful = sent - zero_signal
    per = f"about {sent / useful:.0f} generated for each one trained" if useful else "none trained"
    return (f"{zero_signal / sent:.0%} of the last {sent} groups had zero signal ({per}, so steps may wait for "
            f"data): every rollout of such a group scored alike, all right where a problem is too easy for the "
            f"policy, all wrong where it is too hard, or both where it gives one answer whatever the question "
            f"(held-out top_answers show that); problems of the right difficulty give signal back "
            f"(--curriculum on rg: tasks)")


def reward_parts(groups: list) -> dict[str, float]:
    """The mean of each reward part (reward_info key) over every completion that has it, as reward/<name>."""
    parts: dict[str, list[float]] = {}
    for c in (c for g in groups for c in g.completions):
        for name, value in c.reward_info.items():
            parts.setdefault(name, []).append(value)
    return {f"reward/{k}": sum(v) / len(v) for k, v in sorted(parts.items())}


def batch_crc32(groups: list) -> int:
    """Fingerprint of a step's completions: equal seeds and settings give equal batches."""
    return zlib.crc32(b"".join(c.generated_token_ids.tobytes() for g in groups for c in g.completions))


def group_stats(groups: list, version: int) -> dict:
    """Per-step statistics of the trained groups; `version` is the learner's version after the step.

    accuracy: the fraction of completions with reward_info 'correct'; accuracy/<task> the same
    per task, for groups whose meta names one (reasoning-gym tasks).
    reward_components: the mean of every numeric reward_info key (e.g. has_answer, or one
    entry per reward function), 'correct' excepted since it is already `accuracy`.
    entropy: mean -log p of the generated tokens under the behaviour policy, a Monte Carlo
    estimate of the per-token entropy (E[-log p(x)] over x ~ p) that costs no extra pass.
    staleness_mean / staleness_max: see `staleness`, at the version the step trained at.
    """
    comps = [c for g in groups for c in g.completions]
    if not comps:
        return {}
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for c in comps:
        for k, v in c.reward_info.items():
            if k != "correct" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                sums[k] = sums.get(k, 0.0) + float(v)
                counts[k] = counts.get(k, 0) + 1
    lens = [len(c.generated_token_ids) for c in comps]
    n_tok = sum(len(c.old_policy_log_probs) for c in comps)
    neg_lp = -sum(float(c.old_policy_log_probs.sum()) for c in comps)
    ages = [staleness(version - 1, g.policy_version) for g in groups]
    by_task: dict[str, list[float]] = {}   # reasoning-gym mixtures: accuracy/<task>
    for g in groups:
        if "task" in g.meta:
            by_task.setdefault(str(g.meta["task"]), []).extend(c.reward_info.get("correct", 0.0)
                                                              for c in g.completions)
    return {"accuracy": sum(c.reward_info.get("correct", 0.0) for c in comps) / len(comps),
            "reward_components": {k: sums[k] / counts[k] for k in sorted(sums)},
            "entropy": neg_lp / n_tok if n_tok else 0.0,
            "completion_len_min": min(lens), "completion_len_max": max(lens),
            "truncated_frac": sum(1 for c in comps if not c.is_finished) / len(comps),
            "staleness_mean": sum(ages) / len(ages), "staleness_max": max(ages),
            "batch_crc32": batch_crc32(groups), **reward_parts(groups),
            **{f"accuracy/{t}": sum(v) / len(v) for t, v in sorted(by_task.items()) if v}}
