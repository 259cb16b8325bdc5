"""The save schedule both systems use in bench/time_to_accuracy.py ('15x8,30': every 15 s eight
times, then every 30 s): the learner's own rule (grpo.learner.checkpoint, --save-weights-schedule),
so ours and TRL's saves fall on the same marks."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run as a script: the repo's grpo
from grpo.learner.checkpoint import next_save_mark as next_mark  # noqa: F401
from grpo.learner.checkpoint import parse_save_schedule as parse  # noqa: F401


Schedule = list[tuple[float, int | None]]   # [(period s, times or None: to the end)]


def is_constant(schedule: Schedule) -> bool:
    """One period to the end: the learner's --save-weights-every-s alone says it."""
    return len(schedule) == 1
