"""What a learner step record computes from the groups it trained on: pure functions, no I/O.

A group's age is defined once here: a group sampled by policy version g and trained on by the
learner at version v (its version *before* that step's update) is v - g versions old. Every step
logs it (staleness_mean, staleness_max); the rules built on it (which groups the learner drops,
how many a sampler may make) are grpo.rules.staleness's.
"""
from __future__ import annotations

import math
import zlib


def staleness(learner_version: int, group_version: int) -> int:
    """Optimizer steps between the policy that sampled a group and the learner that trains on it."""
    return learner_version - group_version


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


# Dense bf16 matrix peaks by the vendors' datasheets, TFLOP/s (no sparsity), matched against
# torch.cuda.get_device_name in order; measured rates run below them (an 8192^3 bf16 product on an
# H200 of this project's machines: about 790, docs/benchmarks.md). bench/ reads these too.
BF16_PEAK_TFLOPS = (("H200", 989.0), ("H100 PCIe", 756.0), ("H100", 989.0), ("B200", 2250.0),
                    ("A100", 312.0), ("A10G", 70.0), ("L40S", 362.1), ("L4", 121.0), ("A6000", 154.8),
                    ("RTX 4090", 165.2), ("RTX 3090", 71.0))


def bf16_peak_tflops(device_name: str) -> float | None:
    """The datasheet's dense bf16 peak of a GPU by its name ('NVIDIA H200' -> 989.4); None when unknown."""
    for key, tflops in BF16_PEAK_TFLOPS:
        if key in device_name:
            return tflops
    return None


def bf16_peak_share(params: int, tokens: float, seconds: float, gpus: int, peak_tflops: float | None,
                    lora: bool = False) -> float | None:
    """A training step's model FLOPs over what `gpus` GPUs at their bf16 peak do in `seconds`: the
    usual 6 x parameters x tokens (forward 2, backward 4; attention's own FLOPs left out, as in
    most model-FLOPs utilisations), 4 x with LoRA (frozen weights get no gradient). None without a
    peak or a time. 0.5B parameters, 40,000 tokens in 2 s on one H200: 6 x 0.5e9 x 4e4 / (2 x 989e12)
    = 6.1%."""
    if not peak_tflops or seconds <= 0 or gpus < 1:
        return None
    return (4.0 if lora else 6.0) * params * tokens / (seconds * gpus * peak_tflops * 1e12)


def sampler_busy_s(stats: dict) -> float:
    """A sampler's busy seconds so far, from its status's stats: generating, log-prob passes, scoring."""
    return sum(float(stats.get(k, 0.0)) for k in ("gen_s", "logprob_s", "reward_s"))


def both_busy_share(step_s: float, learner_s: float, sampler_share: float) -> float:
    """The least share of a step in which the learner trained and a sampler was busy at once: the
    two busy times overlap by at least what their sum exceeds the step (inclusion-exclusion), and by
    at most the shorter. learner_s: the step's training seconds; sampler_share: the sampler's busy
    share over about the same span (grpo.stats.busy_rate). A 4 s step with 2 s of training and a
    sampler busy 75% of the time: (2 + 3 - 4) / 4 = 0.25 at least."""
    if step_s <= 0:
        return 0.0
    learner = min(max(learner_s, 0.0), step_s)
    sampler = min(max(sampler_share, 0.0), 1.0) * step_s
    return max(0.0, learner + sampler - step_s) / step_s


def busy_rate(before: tuple[float, float] | None, now: tuple[float, float], last: float | None) -> float | None:
    """A sampler's busy share between two of its statuses, each (its clock s, its busy s so far):
    the busy seconds it added over the seconds its clock moved. `last` (the previous rate) when no
    newer status came (statuses come every --heartbeat-interval-s, steps may be shorter); None
    before a second status. (10, 4) then (14, 7): 3 / 4 = 0.75."""
    if before is None:
        return last
    dt = now[0] - before[0]
    if dt <= 0:
        return last
    return min(1.0, max(0.0, (now[1] - before[1]) / dt))
