"""Ctrl+C and SIGTERM on a learner rank: keep the work, then end.

The launcher passes a stop on to every learner rank (grpo.launch.supervisor); whoever runs
training_worker.py by hand sends it themselves. The first SIGINT or SIGTERM only records itself
here. Rank 0 reads the record between steps and while it waits for a step's data (a step being
trained is finished, one still waiting for data is abandoned, its groups left queued), and its
decision reaches every rank as the stop flag of the batch broadcast
(grpo.learner.batch.broadcast_batch), the collective every rank meets at the top of each step,
as --max-time-s's does while rank 0 waits for data. So all ranks leave the loop together and
save the same step: a DeepSpeed checkpoint is collective, and a rank that left on its own
signal would leave the others waiting in a collective. Ranks other than 0 never read their own
record.

From the first signal on, both signals have their default action again: a second one ends the
process at once, without a save, even while the main thread is inside a long native call (a
Python handler runs only when that call returns).
"""
from __future__ import annotations

import signal
import threading

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """The first SIGINT or SIGTERM this process received since install(), by name ('' for none)."""

    def __init__(self) -> None:
        self.signum = 0

    def install(self) -> bool:
        """Catch both signals; False (nothing caught) off the main thread, where Python cannot."""
        if threading.current_thread() is not threading.main_thread():
            return False
        for s in STOP_SIGNALS:
            signal.signal(s, self._on_signal)
        return True

    def _on_signal(self, signum: int, _frame) -> None:
        # Nothing else here (no logging: the main thread may hold the logging lock); the loop says it.
        for s in STOP_SIGNALS:
            signal.signal(s, signal.SIG_DFL)
        if not self.signum:
            self.signum = signum

    def requested(self) -> bool:
        return bool(self.signum)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""
