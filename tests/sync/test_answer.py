"""Each answer on the sync channel carries the run's facts, the queue and how many groups the sampler
may generate (grpo.sync.answer): by hand without sockets, then through a real publisher and client."""
from __future__ import annotations

import torch
from netutil import free_ports

from grpo.learner.timelimit import TimeLimit
from grpo.sync.answer import QueueView, SyncAnswer
from grpo.sync.client import request_weights
from grpo.weights.tcp import TcpPublisher
from grpo.wire import messages as M
from grpo.wire.transport import SyncClient, SyncServer

FACTS = M.RunFacts(schema=2, model="m", vocab_size=10, dtype="float32", num_generations=2, max_new_tokens=4,
                   max_prompt_tokens=8, temperature=1.0, needs_ref_logprobs=False, max_staleness=1,
                   groups_per_step=2)


def test_sync_answer_fields_by_hand():
    """FACTS: max_staleness 1, 2 groups a step, so (1 + 1) * 2 = 4 queue positions are safe for a current sampler."""
    state = {"queued": 1, "received": 3, "training": 0, "samplers": 1}
    a = SyncAnswer(FACTS)

    def fields(have, sent, first=False, version=0, fresh=False, stopping=False):
        req = M.WeightsRequest(sampler_id=0, have_version=have, request_id=1, sent=sent)
        return a.fields(b"conn", req, first, version, fresh, stopping)

    # no queue view yet: the facts (first answer), no budget said
    assert fields(0, 3, first=True) == {"run": FACTS, "levels": None, "queued": -1, "budget": -1}
    a.queue_view = QueueView(queued=lambda: state["queued"], arrived=lambda sid, inc: (state["received"], 0),
                             samplers=lambda: state["samplers"], training=lambda: state["training"])
    # sent 3 = received 3 (floor 0): 4 - 1 queued = 3; not the first answer: no facts; the budget
    # accounts for the 3 groups the request said (the view knows no newer one)
    assert fields(0, 3) == {"run": None, "levels": None, "queued": 1, "budget": 3, "counted": 3}
    # sent 5: 2 in flight over the floor 0, so 4 - 1 - 2 = 1
    assert fields(0, 5)["budget"] == 1
    # have_version -1 gets the facts again; the answer carries version 2, so no lag once applied;
    # 2 groups taken for the step in progress: 4 - (1 + 0 + 2) = 1
    state["training"] = 2
    assert fields(-1, 3, version=2, fresh=True) == {"run": FACTS, "levels": None, "queued": 1, "budget": 1,
                                                    "counted": 3}
    # no update for a sampler at 0 while the learner is at 2: lag 2 > staleness 1, (1 - 2 + 1) * 2 - 3 < 0: 0
    assert fields(0, 3, version=2)["budget"] == 0
    # nothing queued nor training, two samplers alive: 4 shared, 2 each
    state.update(queued=0, training=0, samplers=2)
    assert fields(0, 3)["budget"] == 2
    # levels in every answer; a stop carries the facts and levels only
    a.levels = {"t": 1}
    assert fields(0, 3, first=True, stopping=True) == {"run": FACTS, "levels": {"t": 1}}
    assert a.unsolicited_stop() == {"levels": {"t": 1}}
    assert SyncAnswer(None).fields(b"x", M.WeightsRequest(0, -1, 1), True, 0, False, False) == \
        {"run": None, "levels": None, "queued": -1, "budget": -1}   # no facts: neither facts nor budget


def test_near_max_steps_the_budget_stops_at_the_groups_the_last_steps_train():
    """FACTS: 2 groups a step, bound 1 (4 safe positions). A learner with --max-steps 5 at version
    v has 5 - v steps left, 2 x (5 - v) groups in all; what is ahead counts against it."""
    state = {"queued": 1, "training": 0}
    a = SyncAnswer(FACTS)
    a.queue_view = QueueView(queued=lambda: state["queued"], arrived=lambda sid, inc: (3, 0), samplers=lambda: 1,
                             training=lambda: state["training"], max_steps=5)

    def budget(version):
        req = M.WeightsRequest(sampler_id=0, have_version=version, request_id=1, sent=3)
        return a.fields(b"conn", req, False, version, True, False)["budget"]

    assert budget(0) == 3      # 5 steps left: the bound's 4 - 1 queued, not 10 - 1
    assert budget(3) == 3      # 2 left: 4 - 1 either way
    assert budget(4) == 1      # 1 left: 2 - 1, where the bound alone gives 3
    state["training"] = 1      # the last step has taken 1 of its 2 groups; 1 is queued for it
    assert budget(4) == 0
    assert budget(5) == 0      # the last step is done: nothing more is trained
    a.queue_view = QueueView(queued=lambda: 1, arrived=lambda sid, inc: (3, 0), samplers=lambda: 1)
    assert budget(4) == 3      # no --max-steps said (0): the bound alone


def test_under_max_time_s_the_budget_stops_at_the_steps_its_time_leaves():
    """FACTS: 2 groups a step, bound 1 (4 safe positions). The learner's TimeLimit (--max-time-s 20,
    its own clock here) says how many steps the time left allows, and the budget stops at the groups
    those train, as at --max-steps; with both, the fewer steps decide."""
    now = [0.0]
    limit = TimeLimit(20.0, clock=lambda: now[0])
    a = SyncAnswer(FACTS)
    a.queue_view = QueueView(queued=lambda: 1, arrived=lambda sid, inc: (3, 0), samplers=lambda: 1,
                             time_steps_left=limit.steps_left)

    def budget(version=0):
        req = M.WeightsRequest(sampler_id=0, have_version=version, request_id=1, sent=3)
        return a.fields(b"conn", req, False, version, True, False)["budget"]

    assert budget() == 3                     # not started: no estimate, the bound's 4 - 1
    limit.start(0.0)
    for s in (3.0, 2.0, 2.5):
        limit.record(s)
    now[0] = 16.0                            # 4 s left, steps of at least 2 s: 1 + 2 = 3 steps, 6 groups
    assert limit.steps_left() == 3 and budget() == 3
    now[0] = 19.0                            # 1 s left: 1 + 1 = 2 steps, 4 groups: 4 - 1
    assert budget() == 3
    now[0] = 25.0                            # past the limit: the step under way only, 2 - 1
    assert limit.steps_left() == 1 and budget() == 1
    a.queue_view = QueueView(queued=lambda: 1, arrived=lambda sid, inc: (3, 0), samplers=lambda: 1, max_steps=10,
                             time_steps_left=limit.steps_left)
    assert budget(9) == 1                    # both ends: 1 step left either way
    now[0] = 10.0                            # 10 s left is 6 steps by time, 1 by --max-steps: 2 - 1
    assert budget(9) == 1 and budget(7) == 3 # 3 left by --max-steps: 6 - 1, cut to the bound's 4 - 1
    assert TimeLimit(0.0).steps_left() == -1  # no --max-time-s: never an estimate


def test_answers_carry_the_queue_and_the_budget():
    port = free_ports(1)[0]
    state = {"queued": 1, "received": 3, "training": 0}
    pub = TcpPublisher(SyncServer("127.0.0.1", port), torch.nn.Linear(2, 2), answers=SyncAnswer(FACTS))
    pub.answers.queue_view = QueueView(queued=lambda: state["queued"], arrived=lambda sid, inc: (state["received"], 0),
                               samplers=lambda: 1, training=lambda: state["training"])
    client = SyncClient("127.0.0.1", port, M.weights_limits(1 << 20))
    answers: list = []
    try:
        pub.publish(0, torch.nn.Linear(2, 2))

        def ask(rid, have, sent):
            ok, _, _ = request_weights(client, 0, have, rid, 5.0, on_answer=answers.append, sent=sent)
            assert ok
            return answers[-1]

        # (1 + 1) * 2 = 4 safe positions, 1 queued, and sent 3 = received 3: nothing in flight
        a = ask(1, 0, 3)
        assert isinstance(a, M.NoUpdate) and (a.queued, a.budget) == (1, 3) and a.run == FACTS   # first answer
        assert ask(2, 0, 5).budget == 1                 # 2 of its groups have not reached the queue yet
        state["training"] = 2                           # a step in progress will make version 1 first
        assert ask(3, 0, 3).budget == 1 and answers[-1].run is None
        pub.publish(1, torch.nn.Linear(2, 2))
        w = ask(4, 0, 3)                                # it gets version 1: no lag once applied
        assert isinstance(w, M.WeightsAnnounce) and (w.version, w.queued, w.budget) == (1, 1, 1)
        pub.answers.queue_view = None                   # a learner that gives no queue sets no limit
        assert ask(5, 1, 3).budget == -1
    finally:
        client.close()
        pub.close()


def test_groups_lost_with_an_earlier_learner_do_not_shrink_the_budget_for_ever():
    """A resumed learner never received what died with the old one: the sampler's sent - received
    gap stays; only its excess over the smallest gap seen on the connection counts as in flight."""
    port = free_ports(1)[0]
    pub = TcpPublisher(SyncServer("127.0.0.1", port), torch.nn.Linear(2, 2), answers=SyncAnswer(FACTS))
    pub.answers.queue_view = QueueView(queued=lambda: 0, arrived=lambda sid, inc: (10, 0), samplers=lambda: 1)
    client = SyncClient("127.0.0.1", port, M.weights_limits(1 << 20))
    answers: list = []
    try:
        pub.publish(0, torch.nn.Linear(2, 2))
        for rid, sent, budget in ((1, 40, 4), (2, 42, 2), (3, 40, 4)):   # 30 lost; 2 more in flight once
            assert request_weights(client, 0, 0, rid, 5.0, on_answer=answers.append, sent=sent)[0]
            assert answers[-1].budget == budget, (rid, answers[-1])
    finally:
        client.close()
        pub.close()


def test_groups_counted_on_their_way_that_never_come_stop_holding_the_budget():
    """FACTS: 2 groups a step, bound 1; --max-steps 5 at version 4: one step left, 2 groups. The
    sampler says sent 9 while the learner has 7 of them and none will come (lost where no rule could
    see): 2 in flight fill the last step, budget 0. While the learner waits for data, 60 s without an
    arrival count them lost (a warning), and the budget is 2 again; a late group lowers the floor."""
    clock = {"t": 1000.0}
    state = {"received": 7, "waiting_since": None}
    a = SyncAnswer(FACTS, lost_after_s=60.0, clock=lambda: clock["t"])
    a.queue_view = QueueView(queued=lambda: 0, arrived=lambda sid, inc: (state["received"], 0),
                             samplers=lambda: 1, max_steps=5, waiting_since=lambda: state["waiting_since"])

    def budget(sent=9):
        return a.fields(b"c", M.WeightsRequest(0, 4, 1, sent=sent), False, 4, False, False)["budget"]

    assert budget(7) == 2        # first request: floor 0, nothing in flight
    assert budget() == 0         # 2 handed since, not come: they fill the last step
    clock["t"] += 61
    assert budget() == 0         # the learner is training (reading nothing): not overdue
    state["waiting_since"] = clock["t"]
    clock["t"] += 59
    assert budget() == 0         # waiting 59 s
    clock["t"] += 2
    assert budget() == 2         # 61 s of waiting without an arrival: counted lost
    assert budget() == 2
    state["received"] = 8        # one of them came after all: gap 1 under the floor 2 lowers it
    assert budget() == 2 and a._flight[b"c"][0] == 1


def test_groups_that_overtake_the_request_are_taken_off_the_budget_once():
    """FACTS: 2 groups a step, bound 1: 4 safe positions. The request said sent 3; groups 4 and 5 were
    handed after it and reached the learner first (queued: 2). The learner's budget counts them
    ahead (4 - 2 = 2) and says counted 5, so the sampler, at 6 handed, takes off only group 6:
    2 - 1 = 1. Taking off all handed since the request (3) would have left 0 until the next answer."""
    from grpo.config import SamplerConfig, from_flat
    from grpo.sampler.counters import SamplerCounters
    from grpo.sampler.weights_client import WeightsClient

    a = SyncAnswer(FACTS)
    a.queue_view = QueueView(queued=lambda: 2, arrived=lambda sid, inc: (5, 5) if (sid, inc) == (0, 7) else (3, 0),
                             samplers=lambda: 1)
    out = a.fields(b"c", M.WeightsRequest(0, 0, 1, sent=3, incarnation=7), False, 0, False, False)
    assert (out["queued"], out["budget"], out["counted"]) == (2, 2, 5)
    assert a.fields(b"d", M.WeightsRequest(0, 0, 1, sent=3, incarnation=8), False, 0, False, False)["counted"] == 3
    assert "counted" not in a.fields(b"e", M.WeightsRequest(0, 0, 1), False, 0, False, False)   # sent not said

    counters = SamplerCounters(groups_offered=6)
    client = WeightsClient(from_flat(SamplerConfig), None, torch.nn.Linear(2, 2), torch.device("cpu"), 10, None,
                           "tcp", counters, lambda levels: None, incarnation=7)
    client._asked[1] = 3                                   # request 1 said sent 3
    client._on_answer(M.NoUpdate(version=0, request_id=1, queued=2, budget=2, counted=5))
    assert client.live_budget() == 1
    client._on_answer(M.NoUpdate(version=0, request_id=1, queued=2, budget=2))   # a learner that does not say it
    assert client.live_budget() == 0
