"""What a finished run's measured rates say about its split of GPUs: pure rules, no I/O.

A step needs a step's worth of groups generated, scored and passed through the log-prob passes
(the samplers' busy seconds) and one optimizer step (the learner ranks' training seconds). With
GPUs of their own, samplers and learner ranks work side by side, so a step takes about the larger
of the two. Spread over s sampler GPUs and r learner ranks: max(gen / s, train / r), where gen is
one GPU's sampler-seconds a step and train one rank's training-seconds a step. gen is measured
(each sampler's busy seconds over the run's steps); train assumes training time scales with
1 / ranks, which data parallelism approaches and never beats: a prediction for more ranks than
measured is optimistic, one for fewer pessimistic (a rank's own step has less to share).
"""
from __future__ import annotations

import statistics

# Say so when a role is idle more than this share of each step, and only for a split predicted
# to be at least this much faster (what the rule cannot promise is left unsaid).
IDLE_SHARE = 0.5
MIN_GAIN = 1.25


def measured(metrics: list[dict], summary: dict) -> dict | None:
    """Per-step figures from metrics.jsonl's step records and summary.json: the median step, the
    learner's busy share (training seconds over step seconds, the first step left out: it waits for
    the first groups) and the samplers' busy sampler-seconds a step (generation, log-prob passes
    and scoring, all samplers, over the steps). None before two steps."""
    steps = [m for m in metrics if "step" in m and "step_time_s" in m and "train_s" in m][1:]
    n = summary.get("steps") or 0
    if not steps or not n:
        return None
    busy = sum(sum(s.get("stats", {}).get(k, 0.0) for k in ("gen_s", "logprob_s", "reward_s"))
               for s in (summary.get("samplers") or {}).values())
    return {"step_s": statistics.median(s["step_time_s"] for s in steps),
            "learner_busy": statistics.median(s["train_s"] / s["step_time_s"] for s in steps if s["step_time_s"] > 0),
            "train_s": statistics.median(s["train_s"] for s in steps),
            "sampler_s": busy / n}


def predicted_step(gen_s: float, train_s: float, samplers: int, ranks: int) -> float:
    """The step of `samplers` sampler GPUs and `ranks` learner ranks on GPUs of their own, from one
    GPU's sampler-seconds (gen_s) and one rank's training-seconds (train_s) a step."""
    return max(gen_s / samplers, train_s / ranks)


def best_split(gpus: int, gen_s: float, train_s: float) -> tuple[int, int]:
    """(samplers, ranks) with samplers + ranks = gpus (at least one of each) whose predicted step is
    shortest; on a tie, more learner ranks (they also shorten the optimizer step's wall time)."""
    splits = [(s, gpus - s) for s in range(1, gpus)]
    return min(splits, key=lambda sr: (predicted_step(gen_s, train_s, *sr), sr[0]))


def advice(rates: dict, sampling_gpus: list[int], training_gpus: list[int]) -> str | None:
    """One line when a role was idle most of each step and another split of the same GPUs is
    predicted at least MIN_GAIN faster; None otherwise (or when roles share GPUs)."""
    samplers, ranks = len(sampling_gpus), len(training_gpus)
    if not samplers or not ranks or set(sampling_gpus) & set(training_gpus):
        return None
    gen, train = rates["sampler_s"], rates["train_s"] * ranks   # one GPU's seconds a step, each role
    sampler_busy = min(1.0, gen / samplers / rates["step_s"]) if rates["step_s"] else 0.0
    idle = [name for name, busy in (("learner ranks", rates["learner_busy"]), ("samplers", sampler_busy))
            if busy < IDLE_SHARE]
    s, r = best_split(samplers + ranks, gen, train)
    now, then = predicted_step(gen, train, samplers, ranks), predicted_step(gen, train, s, r)
    if not idle or (s, r) == (samplers, ranks) or now < MIN_GAIN * then:
        return None
    gpus = sorted(sampling_gpus + training_gpus)
    return (f"layout: the learner ranks trained {rates['learner_busy']:.0%} and the samplers were busy "
            f"{sampler_busy:.0%} of each {rates['step_s']:.2f} s step; the {' and '.join(idle)} idle most of it. "
            f"By these rates --sampling-gpus {','.join(map(str, gpus[:s]))} --training-gpus "
            f"{','.join(map(str, gpus[s:]))} would take about {then:.2f} s a step (training assumed to scale "
            f"with its ranks)")
