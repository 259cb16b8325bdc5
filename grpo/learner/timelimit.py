"""--max-time-s as the steps the learner will still take, read by the generation budget on the
publisher's thread (grpo.sync.answer.QueueView.time_steps_left): as at --max-steps, the samplers
stop at the groups those steps train, instead of filling the line to the staleness bound with
groups the run ends before training (grpo.rules.staleness.steps_left_by_time, the rule)."""
from __future__ import annotations

import time
from typing import Callable

from grpo.rules.staleness import TIMED_STEPS_RECENT, steps_left_by_time


class TimeLimit:
    """The learner loop's clock under --max-time-s (0: none, every estimate -1). The loop starts it
    with its own clock and records each step's seconds; the publisher's thread asks steps_left()."""

    def __init__(self, max_time_s: float, clock: Callable[[], float] = time.perf_counter):
        self.max_time_s, self.clock = float(max_time_s), clock
        self.t_start: float | None = None
        self.recent: tuple[float, ...] = ()   # replaced whole, never mutated: the other thread reads one tuple

    def start(self, t_start: float) -> None:
        self.t_start = t_start

    def record(self, step_s: float) -> None:
        self.recent = (*self.recent[-(TIMED_STEPS_RECENT - 1):], float(step_s))

    def steps_left(self) -> int:
        if not self.max_time_s or self.t_start is None:
            return -1
        return steps_left_by_time(self.max_time_s - (self.clock() - self.t_start), self.recent)
