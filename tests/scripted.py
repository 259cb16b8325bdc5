"""A scripted learner's sync side, for tests that run a real sampler (grpo.sampler.loop.Sampler)
over real ZeroMQ sockets: ``from scripted import ScriptedLearner, facts``; and a scripted rollout
engine for evaluation tests (``ScriptedEngine``)."""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Callable

from grpo.wire import messages as M
from grpo.wire.transport import SyncServer


class ScriptedLearner(threading.Thread):
    """The learner's sync side: answers requests with no_update (the first answer to each
    connection carrying the run's facts, as the learner's does), except the first `ignore`
    requests; `stop_after_s` after its first answer it sends a stop unprompted, as a finishing
    learner does, and answers stop from then on.

    `gate`, if given, runs (on this thread) before the first answer: it holds that answer back,
    as a learner still loading does. `first`, if given, makes the first answer from its request id
    (say, facts that disagree, newer weights, or stop) instead of no_update with `facts`.
    `answered_at`: time.monotonic() of the first answer. `garble`: every answer after the first is
    a frame no codec accepts, as from a learner that speaks other messages. `restart_with`: facts
    that the answer to the request of that index carries, as a learner started again on the same
    port sends with its first answer. `later`: request index -> a function of that request giving
    its answer (say, newer weights) instead of no_update, for requests after the first. `budget`: a
    function of a request giving the budget its no_update answers carry (default: no limit said).
    `stop_when`: a function of the requests so far; once it says True, that request and every later
    one is answered with stop."""

    def __init__(self, port: int, facts: M.RunFacts, ignore: int = 0, stop_after_s: float | None = None,
                 gate: Callable[[], None] | None = None, first: Callable[[int], M.Message] | None = None,
                 garble: bool = False, restart_with: dict[int, M.RunFacts] | None = None,
                 later: dict[int, Callable[[M.WeightsRequest], M.Message]] | None = None,
                 budget: Callable[[M.WeightsRequest], int] = lambda req: -1,
                 stop_when: Callable[[list[M.WeightsRequest]], bool] = lambda requests: False):
        super().__init__(daemon=True)
        self.server = SyncServer("127.0.0.1", port)
        self.facts, self.ignore, self.stop_after_s = facts, ignore, stop_after_s
        self.gate, self.first, self.garble = gate, first, garble
        self.restart_with = restart_with or {}
        self.later = later or {}
        self.budget, self.stop_when = budget, stop_when
        self.answered_at = self.stopped_at = None
        self.requests: list[M.WeightsRequest] = []
        self.told: set[bytes] = set()   # connections given the facts
        self.done = threading.Event()

    def run(self) -> None:
        peer = None
        while not self.done.is_set():
            got = self.server.receive(timeout_s=0.02)
            if got is not None:
                peer, req = got
                self.requests.append(req)
                run = None if peer in self.told else self.facts
                run = self.restart_with.get(len(self.requests) - 1, run)
                if self.ignore > 0:
                    self.ignore -= 1
                    continue
                if self.stopped_at is None and self.answered_at is not None and self.stop_when(self.requests):
                    self.stopped_at = time.monotonic()
                if self.stopped_at is not None:
                    self.server.reply(peer, M.Stop(version=0, reason="learner finished", request_id=req.request_id,
                                                   run=run))
                elif self.answered_at is None:
                    if self.gate is not None:
                        self.gate()
                    self.answered_at = time.monotonic()
                    self.server.reply(peer, self.first(req.request_id) if self.first is not None else
                                      M.NoUpdate(version=0, request_id=req.request_id, run=run,
                                                 budget=self.budget(req)))
                elif self.garble:
                    self.server.sock.send_multipart([peer, b"not a message"])
                elif (answer := self.later.get(len(self.requests) - 1)) is not None:
                    self.server.reply(peer, answer(req))
                else:
                    version = max(req.have_version, 0)
                    self.server.reply(peer, M.NoUpdate(version=version, request_id=req.request_id, run=run,
                                                       budget=self.budget(req)))
                self.told.add(peer)
            if (self.stop_after_s is not None and self.stopped_at is None and self.answered_at is not None
                    and time.monotonic() - self.answered_at >= self.stop_after_s):
                self.server.reply(peer, M.Stop(version=0, reason="learner finished", request_id=-1))
                self.stopped_at = time.monotonic()
        self.server.close()


def facts(s, **changes) -> M.RunFacts:
    """The run's facts that agree with sampler `s` (beta 0: no reference log-probs), with `changes`."""
    cfg = s.cfg
    return M.RunFacts(**{"schema": M.SCHEMA_VERSION, "model": cfg.run.model, "vocab_size": s.parts.vocab_size,
                         "dtype": "float32",
                         "num_generations": cfg.rollout.num_generations, "max_new_tokens": cfg.rollout.max_new_tokens,
                         "max_prompt_tokens": 4096, "temperature": cfg.rollout.temperature, "needs_ref_logprobs": False,
                         "max_staleness": 4, "groups_per_step": 1, **changes})


def run_against(s, learner: ScriptedLearner) -> dict:
    """s.run() against `learner`, which is stopped and joined however the run ends."""
    learner.start()
    try:
        return s.run()
    finally:
        learner.done.set()
        learner.join(timeout=10)


class ScriptedEngine:
    """A stand-in rollout engine for greedy evaluation: answers each prompt with the completion
    scripted for it (text keyed by the prompt's ids), EOS-terminated, and records the prompts it was
    given."""

    def __init__(self, tok, script: dict[tuple[int, ...], str]):
        self.tok, self.script, self.prompts = tok, script, []

    def generate(self, prompts, max_new_tokens, *args, **kwargs):
        self.prompts += [list(p) for p in prompts]
        rows = [self.tok(self.script.get(tuple(p), ""), add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
                for p in prompts]
        return SimpleNamespace(token_ids=rows, finished=[True] * len(rows))


def drain(receiver, within_s: float = 30.0) -> tuple[list[M.Group], M.SamplerStatus | None]:
    """The groups a sampler sent, until its final status (None if none came within `within_s`); closes the receiver."""
    groups, final = [], None
    deadline = time.monotonic() + within_s
    while final is None and time.monotonic() < deadline:
        m = receiver.receive(timeout_s=0.5)
        if isinstance(m, M.SamplerStatus) and m.final:
            final = m
        elif isinstance(m, M.Group):
            groups.append(m)
    receiver.close()
    return groups, final
