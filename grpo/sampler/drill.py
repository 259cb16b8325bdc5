"""A fault drill for runs that test recovery (bench/, tests).

GRPO_DRILL_DIE_IN_SWAP=FILE, where FILE holds a number N: the Nth version a sampler applies kills
it with SIGKILL once the weights are copied in and before the follow-up request that acknowledges
them (ipc, nccl), so the learner sees a sampler vanish in the middle of a swap. The sampler removes
the file before it dies: one drill kills one process, and the sampler the launcher restarts in its
place (--restart-samplers) runs on. Without the variable nothing is read.
"""
from __future__ import annotations

import logging
import os
import signal

ENV = "GRPO_DRILL_DIE_IN_SWAP"
log = logging.getLogger(__name__)


def drill_due(text: str, applied: int) -> bool:
    """The drill file's text ('3') against the versions applied so far: due at the Nth and after;
    a file that holds no number never fires."""
    try:
        return applied >= int(text.strip())
    except ValueError:
        return False


def maybe_die(applied: int) -> None:
    """Called after each applied version (applied: how many so far in this process)."""
    path = os.environ.get(ENV)
    if not path:
        return
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return   # no file (left by a drill that already fired): run on
    if not drill_due(text, applied):
        return
    try:
        os.remove(path)
    except FileNotFoundError:
        return   # another sampler on this host took the drill first
    log.warning("fault drill (%s): dying in the middle of a weight swap, at the %d-th version applied, "
                "before acknowledging it", ENV, applied)
    logging.shutdown()
    os.kill(os.getpid(), signal.SIGKILL)
