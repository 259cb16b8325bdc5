"""A learner's first answer to a sampler that asked while it loaded carries the budget (grpo.learner.setup
wires the intake's queue view before the publisher's thread answers): without it the answer set no gap
floor, and the sampler's round 0, still on its way at the next request, was taken as lost."""
from __future__ import annotations

from netutil import free_ports

from grpo.config import LearnerConfig, from_flat
from grpo.learner.setup import build
from grpo.sync.client import ask, await_answer
from grpo.wire import messages as M
from grpo.wire.transport import SyncClient


def test_a_request_sent_before_the_learner_loads_gets_a_budget(tmp_path, monkeypatch):
    data, sync = free_ports(2)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):   # one rank (--no-deepspeed: no process group)
        monkeypatch.delenv(key, raising=False)
    client = SyncClient("127.0.0.1", sync, M.weights_limits(64 << 20))
    parts = None
    try:
        # queued before the ports are bound: the publisher's thread finds it the moment it starts, as
        # a sampler's first request that waited while the learner loaded its model
        assert ask(client, 0, 0, 1, sent=0)
        parts = build(from_flat(LearnerConfig, device="cpu", model="tiny-random", no_deepspeed=True,
                                run_dir=str(tmp_path),
                                    data_port=data, sync_port=sync, report_to="none"))
        answers: list[M.Message] = []
        answered, _, _ = await_answer(client, 0, 1, 30.0, on_answer=answers.append)
        assert answered
        # the defaults: steps of 16 completions in groups of 8 (2 groups), --max-staleness 2, nothing
        # queued, sent, received or taken: (2 + 1) x 2 = 6 groups, not -1 (no budget said)
        assert (answers[-1].queued, answers[-1].budget) == (0, 6)
        # the next request says round 0's 6 groups were handed over, none received yet: all in flight
        assert ask(client, 0, 0, 2, sent=6)
        answered, _, _ = await_answer(client, 0, 2, 30.0, on_answer=answers.append)
        assert answered and answers[-1].budget == 0
    finally:
        client.close()
        if parts is not None:
            parts.publisher.close()
            parts.receiver.close()
            parts.metrics.close()
            parts.tracker.close()
