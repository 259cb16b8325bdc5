"""A sampler against a scripted learner over real sockets: how it ends and what it records.

* The learner's stop reaches it in the middle of a long round: it abandons the round within
  seconds (both generation backends) and leaves with its final status.
* The learner's first answer comes late (the learner is still loading): the sampler generates
  round 0 meanwhile with its own weights (version 0) and sends nothing before that answer, whose
  run facts it checks first ('connected' before 'first_group'). Facts it disagrees with end it
  with nothing sent, also when they come in the middle of a long round 0; an answer that never
  comes ends it after --first-answer-timeout-s; a stop abandons round 0; newer weights (a
  resumed learner) abandon it too, and round 0 is generated again with them.
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest
import torch
from netutil import free_ports, one_thread  # noqa: F401 - module-wide fixture (autouse)
from scripted import ScriptedLearner, facts, run_against

from grpo.config import SamplerConfig, from_flat
from grpo.obs import stages
from grpo.sampler.loop import Sampler
from grpo.sampler.weights_client import AnswersRejected, NoFirstAnswer, RunMismatch
from grpo.sync.client import rejected_streak
from grpo.weights.layout import plan_layout
from grpo.weights.pack import pack
from grpo.wire import messages as M
from grpo.wire.transport import DataReceiver

GSM8K = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k"


def make_sampler(data_port: int, sync_port: int, **kw) -> Sampler:
    return Sampler(from_flat(SamplerConfig, **{"model": "tiny-random", "device": "cpu", "dataset": str(GSM8K),
                                    "dataset_limit": 8, "num_generations": 2, "max_new_tokens": 4,
                                    "data_port": data_port, "sync_port": sync_port, "heartbeat_interval_s": 0,
                                    **kw}))


def drain(receiver: DataReceiver, timeout_s: float = 30.0) -> tuple[list[M.Group], M.SamplerStatus | None]:
    """What the sampler sent, up to and including its final status (bounded by timeout_s)."""
    groups, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        m = receiver.receive(timeout_s=0.5)
        if isinstance(m, M.SamplerStatus) and m.final:
            return groups, m
        if isinstance(m, M.Group):
            groups.append(m)
    return groups, None


@pytest.mark.parametrize("backend", ["hf", "fast"])
def test_a_stop_in_the_middle_of_a_round_ends_it_within_seconds(backend, caplog):
    """A round of 8 rows x 1500 new tokens takes tens of seconds on CPU; the learner says stop one
    second into it: the sampler abandons the round, sends its final status (nothing of the round
    counted as sent) and returns within 5 s of the stop."""
    caplog.set_level(logging.INFO, logger="grpo.sampler")
    data_port, sync_port = free_ports(2)
    receiver = DataReceiver("127.0.0.1", data_port, M.Limits(), 1 << 26)
    s = make_sampler(data_port, sync_port, prompts_per_round=4, max_new_tokens=1500, generation_backend=backend)
    learner = ScriptedLearner(sync_port, facts(s), stop_after_s=1.0)
    learner.start()
    try:
        t0 = time.monotonic()
        result = s.run()
        returned = time.monotonic()
    finally:
        learner.done.set()
        learner.join(timeout=10)
    groups, final = drain(receiver)
    receiver.close()
    assert learner.stopped_at is not None, "the scripted learner never said stop"
    assert returned - learner.stopped_at < 5.0, (returned - t0, learner.stopped_at - t0)
    assert "in the middle of round 0: the round is abandoned" in caplog.text
    assert result["rounds"] == 0 and result["groups_sent"] == 0 and groups == []
    assert final is not None and final.groups_sent == 0 and final.stats["samples"] == 0


class RoundWatch:
    """Wraps the sampler's engine: `done` is set (and `at` stamped) once its first round has been
    generated whole, when generate returns or when a stream has handed out the round's last group."""

    def __init__(self, s: Sampler):
        self.done, self.at = threading.Event(), None
        eng, n = s.parts.engine, s.cfg.rollout.prompts_per_round
        generate, stream = eng.generate, eng.stream

        def generated(*a, **k):
            out = generate(*a, **k)
            self._mark()
            return out

        def streamed(*a, **k):
            for i, fg in enumerate(stream(*a, **k)):
                if i + 1 == n:
                    self._mark()
                yield fg

        eng.generate, eng.stream = generated, streamed

    def _mark(self) -> None:
        if self.at is None:
            self.at = time.monotonic()
            self.done.set()


def answer_after_round_0(watch: RoundWatch, receiver: DataReceiver, early: list):
    """A gate for ScriptedLearner: hold the first answer until round 0 has been generated, then a
    while longer (more than a --sync-timeout-s window of the sampler's); whatever reached the data
    port by then goes into `early`."""
    def gate() -> None:
        watch.done.wait(60)
        time.sleep(0.8)
        while (m := receiver.receive(timeout_s=0.3)) is not None:
            early.append(m)
    return gate


@pytest.mark.parametrize("in_flight_rows", [0, 2])
def test_round_0_is_generated_before_the_first_answer_and_sent_after_it(tmp_path, caplog, in_flight_rows):
    """The learner answers only once round 0 has been generated (it is still loading): the sampler
    did not wait for it to generate, and sent nothing before it (fixed rounds and in flight)."""
    caplog.set_level(logging.INFO, logger="grpo.sampler")
    data_port, sync_port = free_ports(2)
    receiver = DataReceiver("127.0.0.1", data_port, M.Limits(), 1 << 26)
    s = make_sampler(data_port, sync_port, prompts_per_round=2, max_rounds=2, sync_timeout_s=0.5,
                     generation_backend="fast", in_flight_rows=in_flight_rows, run_dir=str(tmp_path))
    watch, early = RoundWatch(s), []
    learner = ScriptedLearner(sync_port, facts(s), gate=answer_after_round_0(watch, receiver, early))
    result = run_against(s, learner)
    groups, final = drain(receiver)
    receiver.close()
    assert watch.at is not None and learner.answered_at is not None and watch.at < learner.answered_at
    assert early == []   # nothing reached the data port before the learner's first answer
    assert final is not None and result["groups_sent"] == final.groups_sent == len(groups) == 4
    assert sorted(g.group_id for g in groups) == ["s0-r0-g0", "s0-r0-g1", "s0-r1-g0", "s0-r1-g1"]
    assert {g.policy_version for g in groups} == {0}
    assert s.parts.workflow.ref is None   # the facts (beta 0) were known before round 0 was finished: no reference model
    text = caplog.text
    assert "generating round 0 with version 0" in text
    assert f"no answer from the learner at 127.0.0.1:{sync_port} yet" in text   # it said why it waits
    assert text.index("learner's run:") < text.index("round 0 (v0)")
    marks = [e["stage"] for e in stages.history(tmp_path)["sampler0"]]
    assert marks == ["model_loaded", "connected", "first_group"]   # ('started' is the worker script's)
    assert stages.read(tmp_path)["sampler0"][0] == "first_group"
    t_start = stages.history(tmp_path)["sampler0"][0]["time"] - 1
    assert stages.overdue({"sampler0": t_start}, stages.read(tmp_path), time.time() + 1e4, 60, {}) == []


def test_late_facts_that_disagree_end_it_with_nothing_sent():
    data_port, sync_port = free_ports(2)
    receiver = DataReceiver("127.0.0.1", data_port, M.Limits(), 1 << 26)
    s = make_sampler(data_port, sync_port, prompts_per_round=2, sync_timeout_s=0.5, generation_backend="fast")
    watch, early = RoundWatch(s), []
    learner = ScriptedLearner(sync_port, facts(s, num_generations=3),
                              gate=answer_after_round_0(watch, receiver, early))
    with pytest.raises(RunMismatch, match="--num-generations: 2 here, 3 at the learner") as e:
        run_against(s, learner)
    late = receiver.receive(timeout_s=1.0)
    receiver.close()
    assert watch.at is not None and watch.at < learner.answered_at
    assert early == [] and late is None   # nothing at all on the data port
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("backend", ["hf", "fast"])
def test_facts_that_disagree_cut_a_long_round_0_short(backend):
    """A round of 8 rows x 1500 new tokens takes tens of seconds on CPU; the learner's first answer
    comes a second into it with a temperature that disagrees: the sampler stops generating and ends
    within seconds, with nothing sent."""
    data_port, sync_port = free_ports(2)
    receiver = DataReceiver("127.0.0.1", data_port, M.Limits(), 1 << 26)
    s = make_sampler(data_port, sync_port, prompts_per_round=4, max_new_tokens=1500, generation_backend=backend)
    learner = ScriptedLearner(sync_port, facts(s, temperature=0.5), gate=lambda: time.sleep(1.0))
    with pytest.raises(RunMismatch, match="--temperature: 1.0 here, 0.5 at the learner"):
        run_against(s, learner)
    ended = time.monotonic()
    late = receiver.receive(timeout_s=0.5)
    receiver.close()
    assert ended - learner.answered_at < 5.0
    assert late is None


def test_a_first_answer_that_never_comes_ends_it_after_the_bound(caplog):
    """No learner on the sync port: round 0 is generated, the wait is logged every --sync-timeout-s,
    and after --first-answer-timeout-s the sampler ends with one line naming the flag, nothing sent."""
    caplog.set_level(logging.INFO, logger="grpo.sampler")
    data_port, sync_port = free_ports(2)
    receiver = DataReceiver("127.0.0.1", data_port, M.Limits(), 1 << 26)
    s = make_sampler(data_port, sync_port, prompts_per_round=2, sync_timeout_s=0.3, first_answer_timeout_s=1.5,
                     generation_backend="fast", max_rounds=3)   # (ends, rather than hangs, where it would send)
    t0 = time.monotonic()
    with pytest.raises(NoFirstAnswer) as e:
        s.run()
    took = time.monotonic() - t0
    late = receiver.receive(timeout_s=1.0)
    receiver.close()
    msg = str(e.value)
    assert "\n" not in msg and "--first-answer-timeout-s" in msg and f"127.0.0.1:{sync_port}" in msg
    assert 1.5 <= took < 15
    assert caplog.text.count(f"no answer from the learner at 127.0.0.1:{sync_port} yet") >= 2
    assert "round 0 (v0)" not in caplog.text   # generated, but neither scored nor sent
    assert late is None


def test_rejected_streak_hand_worked():
    # (answered, rejected since the last count) per request -> the streak after it
    seq = [(False, 1), (False, 2), (False, 0), (True, 0), (False, 1), (True, 3), (False, 0), (False, 5)]
    streak, got = 0, []
    for answered, rejected in seq:
        streak = rejected_streak(streak, answered, rejected)
        got.append(streak)
    # a quiet wait (nothing came) keeps the streak; a valid answer ends it, whatever else was rejected
    assert got == [1, 2, 2, 0, 1, 0, 0, 1]


def test_answers_it_cannot_read_end_it_with_one_line_and_its_final_status(caplog):
    """The learner's first answer is valid (round 0 goes out); every later one is a frame the codec
    rejects: the sampler ends at its third such request with one line naming the reason and the fix,
    instead of generating with version 0 for ever, and its final status still reaches the data port."""
    caplog.set_level(logging.INFO, logger="grpo.sampler")
    data_port, sync_port = free_ports(2)
    receiver = DataReceiver("127.0.0.1", data_port, M.Limits(), 1 << 26)
    s = make_sampler(data_port, sync_port, prompts_per_round=2, sync_timeout_s=0.3, generation_backend="hf",
                     max_rounds=20)
    learner = ScriptedLearner(sync_port, facts(s), garble=True)
    t0 = time.monotonic()
    with pytest.raises(AnswersRejected) as e:
        run_against(s, learner)
    took = time.monotonic() - t0
    groups, final = drain(receiver)
    receiver.close()
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("3 weight requests in a row got only answers this sampler rejected (")
    assert f"127.0.0.1:{sync_port}" in msg and "same version of this code on both sides" in msg
    assert sum(s.parts.sync.rejected.values()) == 3 and len(learner.requests) == 4   # one valid answer, three garbled
    assert final is not None and final.groups_sent == len(groups) > 0           # rounds 0-2 went out, books closed
    assert took < 60


def test_a_learner_started_again_with_other_settings_ends_it_and_other_changes_are_followed(caplog):
    """Mid-run, an answer carries new facts, as from a learner started again on the same port: a
    change of --max-staleness is said and followed; a change of --num-generations ends the sampler
    with one line naming it, after its final status (what it sent stays counted). Before this, facts
    after the first were taken without a check."""
    caplog.set_level(logging.INFO, logger="grpo.sampler")
    data_port, sync_port = free_ports(2)
    receiver = DataReceiver("127.0.0.1", data_port, M.Limits(), 1 << 26)
    s = make_sampler(data_port, sync_port, prompts_per_round=2, sync_timeout_s=0.5, generation_backend="hf",
                     max_rounds=20)
    learner = ScriptedLearner(sync_port, facts(s), restart_with={2: facts(s, max_staleness=7),
                                                                 4: facts(s, max_staleness=7, num_generations=3)})
    with pytest.raises(RunMismatch) as e:
        run_against(s, learner)
    groups, final = drain(receiver)
    receiver.close()
    assert str(e.value) == ("the learner's settings changed (a learner started again on this port?): "
                            "--num-generations: 2 here, 3 at the learner: give both the same settings")
    assert "the learner's run facts changed (a learner started again on this port?): max_staleness 4 -> 7" in caplog.text
    assert s.parts.client.run_facts.max_staleness == 7 and len(learner.requests) == 5
    assert final is not None and final.groups_sent == len(groups) > 0


def test_a_stop_as_the_first_answer_abandons_round_0(caplog):
    caplog.set_level(logging.INFO, logger="grpo.sampler")
    data_port, sync_port = free_ports(2)
    receiver = DataReceiver("127.0.0.1", data_port, M.Limits(), 1 << 26)
    s = make_sampler(data_port, sync_port, prompts_per_round=2, sync_timeout_s=0.5, generation_backend="fast")
    watch, early = RoundWatch(s), []
    stop = lambda rid: M.Stop(version=7, reason="learner finished", request_id=rid, run=facts(s))   # noqa: E731
    learner = ScriptedLearner(sync_port, facts(s), gate=answer_after_round_0(watch, receiver, early), first=stop)
    result = run_against(s, learner)
    groups, final = drain(receiver)
    receiver.close()
    assert watch.at is not None and early == [] and groups == []
    assert result["rounds"] == 0 and result["groups_sent"] == 0
    assert final is not None and final.groups_sent == 0 and final.stats["samples"] == 0
    assert "in the middle of round 0: the round is abandoned" in caplog.text


def test_newer_weights_in_the_first_answer_abandon_round_0_which_is_generated_again(caplog):
    """A resumed learner is past version 0: its first answer carries version 3. Round 0, generated
    with version 0 meanwhile, is not sent (the learner would drop it as too stale): the sampler
    applies version 3 and generates round 0 again with it."""
    caplog.set_level(logging.INFO, logger="grpo.sampler")
    data_port, sync_port = free_ports(2)
    receiver = DataReceiver("127.0.0.1", data_port, M.Limits(), 1 << 26)
    s = make_sampler(data_port, sync_port, prompts_per_round=2, max_rounds=1, sync_timeout_s=0.5,
                     generation_backend="fast")
    named = [(n, p.detach() + 0.01) for n, p in s.parts.policy.named_parameters()]
    layout, dtypes, nbytes = plan_layout(named)
    buckets = [memoryview(b.numpy()) for b in pack(named, layout, nbytes)]
    v3 = lambda rid: M.WeightsAnnounce(version=3, method=M.TCP, layout=layout, bucket_dtypes=dtypes,   # noqa: E731
                                       bucket_nbytes=nbytes, buckets=buckets, request_id=rid, run=facts(s))
    watch, early = RoundWatch(s), []
    learner = ScriptedLearner(sync_port, facts(s), gate=answer_after_round_0(watch, receiver, early), first=v3)
    result = run_against(s, learner)
    groups, final = drain(receiver)
    receiver.close()
    assert watch.at is not None and early == []
    assert result["rounds"] == 1 and final is not None and final.groups_sent == len(groups) == 2
    assert sorted(g.group_id for g in groups) == ["s0-r0-g0", "s0-r0-g1"] and {g.policy_version for g in groups} == {3}
    assert s.version == 3
    for (name, p), (_, want) in zip(s.parts.policy.named_parameters(), named):
        assert torch.equal(p.detach(), want), name
    assert [r.have_version for r in learner.requests[:2]] == [0, 3]   # its next request acknowledged version 3
    text = caplog.text
    assert "round 0 (v3)" in text and "round 0 (v0)" not in text
    assert text.index("round 0 is abandoned") < text.index("now running policy version 3") < text.index("round 0 (v3)")
