"""A sampler against a scripted learner over real sockets: how it ends and what it records.

* The learner's stop reaches it in the middle of a long round: it abandons the round within
  seconds (both generation backends) and leaves with its final status.
* Its first weights request goes unanswered, so it sends its first round before the learner's
  first answer arrives: its stage file keeps both marks, and it reads as 'first_group'.
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest
from netutil import free_ports, one_thread  # noqa: F401 - module-wide fixture (autouse)

from grpo.config import SamplerConfig
from grpo.obs import stages
from grpo.sampler.loop import Sampler
from grpo.wire import messages as M
from grpo.wire.transport import DataReceiver, SyncServer

GSM8K = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k"


def make_sampler(data_port: int, sync_port: int, **kw) -> Sampler:
    return Sampler(SamplerConfig(**{"model": "tiny-random", "device": "cpu", "dataset": str(GSM8K),
                                    "dataset_limit": 8, "num_generations": 2, "max_new_tokens": 4,
                                    "data_port": data_port, "sync_port": sync_port, "heartbeat_interval_s": 0,
                                    **kw}))


class ScriptedLearner(threading.Thread):
    """The learner's sync side: answers requests with no_update (the first one carrying the run's
    facts), except the first `ignore` requests; `stop_after_s` after its first answer it sends a
    stop unprompted, as a finishing learner does, and answers stop from then on."""

    def __init__(self, port: int, facts: M.RunFacts, ignore: int = 0, stop_after_s: float | None = None):
        super().__init__(daemon=True)
        self.server = SyncServer("127.0.0.1", port)
        self.facts, self.ignore, self.stop_after_s = facts, ignore, stop_after_s
        self.answered_at = self.stopped_at = None
        self.done = threading.Event()

    def run(self) -> None:
        peer = None
        while not self.done.is_set():
            got = self.server.receive(timeout_s=0.02)
            if got is not None:
                peer, req = got
                if self.ignore > 0:
                    self.ignore -= 1
                elif self.stopped_at is not None:
                    self.server.reply(peer, M.Stop(version=0, reason="learner finished", request_id=req.request_id))
                else:
                    self.server.reply(peer, M.NoUpdate(version=0, request_id=req.request_id,
                                                       run=self.facts if self.answered_at is None else None))
                    self.answered_at = self.answered_at or time.monotonic()
            if (self.stop_after_s is not None and self.stopped_at is None and self.answered_at is not None
                    and time.monotonic() - self.answered_at >= self.stop_after_s):
                self.server.reply(peer, M.Stop(version=0, reason="learner finished", request_id=-1))
                self.stopped_at = time.monotonic()
        self.server.close()


def facts(s: Sampler) -> M.RunFacts:
    cfg = s.cfg
    return M.RunFacts(schema=M.SCHEMA_VERSION, model=cfg.model, vocab_size=s.vocab_size, dtype="float32",
                      num_generations=cfg.num_generations, max_new_tokens=cfg.max_new_tokens, max_prompt_tokens=4096,
                      temperature=cfg.temperature, needs_ref_logprobs=False, max_staleness=4, groups_per_step=1)


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
    caplog.set_level(logging.INFO, logger="grpo.sampler.loop")
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


def test_a_first_round_sent_before_the_first_answer_reads_as_first_group(tmp_path):
    data_port, sync_port = free_ports(2)
    receiver = DataReceiver("127.0.0.1", data_port, M.Limits(), 1 << 26)
    s = make_sampler(data_port, sync_port, prompts_per_round=1, max_rounds=2, sync_timeout_s=1.0,
                     run_dir=str(tmp_path))
    learner = ScriptedLearner(sync_port, facts(s), ignore=1)   # the first request times out
    learner.start()
    try:
        result = s.run()
    finally:
        learner.done.set()
        learner.join(timeout=10)
    groups, final = drain(receiver)
    receiver.close()
    assert final is not None and result["groups_sent"] == final.groups_sent == len(groups) == 2
    marks = [e["stage"] for e in stages.history(tmp_path)["sampler0"]]
    assert marks == ["model_loaded", "first_group", "connected"]   # ('started' is the worker script's)
    assert stages.read(tmp_path)["sampler0"][0] == "first_group"
    t_start = stages.history(tmp_path)["sampler0"][0]["time"] - 1
    assert stages.overdue({"sampler0": t_start}, stages.read(tmp_path), time.time() + 1e4, 60, {}) == []
