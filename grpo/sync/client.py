"""Sampler side of the sync channel: ask for the newest weights, and wait for the answer to that request.

The exchange (docs/weight-sync.md): a weights_request naming the version the sampler has; the
answer is the newest version's announcement, no_update or stop, each with the control fields
of grpo.sync.answer. Applying an announced version is the weights method's (grpo.weights).
"""
from __future__ import annotations

import time
from typing import Callable

from grpo.wire import messages as M
from grpo.wire.transport import Transport

# Weight requests in a row whose only answers this sampler rejected (grpo.wire's checks) before it
# ends: the sync port carries the learner's messages alone, so a rejected answer is the two sides
# disagreeing on the protocol (different code, or a transfer handle longer than the codec allows),
# which asking again does not mend. One is allowed to be chance; three in a row are not.
REJECTED_ANSWERS_LIMIT = 3


def rejected_streak(streak: int, answered: bool, rejected: int) -> int:
    """Requests in a row left without a valid answer while the sync socket rejected `rejected` (> 0)
    messages since the last count. A valid answer ends the streak; a wait in which nothing came at
    all (the learner busy or away: its own bound, --first-answer-timeout-s or the liveness rules,
    covers that) leaves it as it was."""
    if answered:
        return 0
    return streak + 1 if rejected > 0 else streak


def ask(client: Transport, sampler_id: int, have_version: int, request_id: int, method: str = "",
        sent: int = -1, incarnation: int = 0) -> bool:
    """Sampler side, the first half of a sync: send one weights_request (never blocks; False when
    the socket could not take it now, as when it has never connected: the next request goes again).
    `sent`: the groups this process has handed to its data socket, and `incarnation` its random id,
    for the budget."""
    return client.send(M.WeightsRequest(sampler_id=sampler_id, have_version=have_version, request_id=request_id,
                                        method=method, sent=sent, incarnation=incarnation))


def await_answer(client: Transport, have_version: int, request_id: int, timeout_s: float,
                 on_answer: Callable[[M.Message], None] | None = None
                 ) -> tuple[bool, M.WeightsAnnounce | None, M.Stop | None]:
    """Sampler side, the second half: wait up to timeout_s for the answer to request `request_id`.

    Returns (answered, newest weights newer than have_version or None, stop or None).
    Answers to earlier requests (say, made while the learner was still loading) arrive late,
    in order, before ours: their weights are used if newer, but only the answer carrying our
    request_id ends the wait, so a sampler never settles for an out-of-date answer. Every answer
    also goes to `on_answer` (the run's facts, curriculum levels, the generation budget).
    """
    newest: M.WeightsAnnounce | None = None
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False, newest, None
        msg = client.receive(timeout_s=left)
        if msg is None:
            continue
        if on_answer is not None:
            on_answer(msg)
        if isinstance(msg, M.Stop):
            return True, newest, msg
        if isinstance(msg, M.WeightsAnnounce) and msg.version > (newest.version if newest else have_version):
            newest = msg
        if getattr(msg, "request_id", -1) == request_id:
            return True, newest, None


def request_weights(client: Transport, sampler_id: int, have_version: int, request_id: int,
                    timeout_s: float, method: str = "", on_answer: Callable[[M.Message], None] | None = None,
                    sent: int = -1) -> tuple[bool, M.WeightsAnnounce | None, M.Stop | None]:
    """Sampler side of one sync: ask, then wait up to timeout_s for the answer to *this* request
    (`ask`, then `await_answer`, which says what comes back)."""
    ask(client, sampler_id, have_version, request_id, method, sent)
    return await_answer(client, have_version, request_id, timeout_s, on_answer)
