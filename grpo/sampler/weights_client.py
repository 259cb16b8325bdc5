"""The sampler's weights client: its side of the sync port.

It asks the learner for newer weights (each request says the version it runs and the groups it
has handed to its data socket, for the budget), takes every answer's control fields (the run's
facts, checked against this sampler's; curriculum levels; the generation budget), applies an
announced version by its method (ipc, nccl, shared, tcp) and steps down to the next method by
the rule both sides share when one proves impossible here.

The first round does not wait for the learner (which may still be loading): the sampler loaded
the run's checkpoint itself, so its own weights are version 0. It sends its first weights request
and generates round 0 at once; the learner's answer, which carries the run's facts, is waited for
before anything of the round is scored or sent (WeightsClient.first_answer, which the rollout
workflow calls).
"""
from __future__ import annotations

import logging
import time
from dataclasses import fields
from typing import Callable

import torch

from grpo.config import SamplerConfig
from grpo.model.load import compute_dtype
from grpo.obs.stages import mark as mark_stage
from grpo.sampler import drill
from grpo.sampler.counters import SamplerCounters
from grpo.sampler.heartbeat import SyncInbox
from grpo.sync.client import REJECTED_ANSWERS_LIMIT, ask, await_answer, rejected_streak
from grpo.weights import make_receiver
from grpo.weights.methods import LAST_RESORT, acknowledges, fallback, own_weights, sampler_method
from grpo.weights.verify import fingerprint
from grpo.wire import messages as M
from grpo.wire.transport import SyncClient

log = logging.getLogger(__name__)


# The first weights request of a sampler with weights of its own waits this long for its answer
# (the answer of a learner that is up comes in milliseconds: a sampler restarted mid-run then
# starts at the learner's version, as before) before round 0 is generated without it.
FIRST_GRACE_S = 0.25


class RunMismatch(ValueError):
    """This sampler disagrees with the learner on a setting both must share (one line, with the fix)."""


class NoFirstAnswer(RuntimeError):
    """The learner never answered the first weights request within --first-answer-timeout-s (one line)."""


class AnswersRejected(RuntimeError):
    """The learner's answers on the sync port keep failing this sampler's checks (one line): the two
    sides do not speak the same messages, and this sampler would generate with old weights for ever."""


# --swap-in-flight: the least time between two weights requests a stream sends (its host checks
# come every few milliseconds on a GPU; the learner publishes once a step, seconds apart).
SWAP_ASK_S = 0.2


def run_mismatches(facts: M.RunFacts, cfg: SamplerConfig, vocab_size: int) -> list[str]:
    """What this sampler and the learner's run facts disagree on, each as 'flag: here vs learner'."""
    out = []
    if facts.vocab_size != vocab_size:
        out.append(f"vocabulary: {vocab_size} here, {facts.vocab_size} at the learner (--model {cfg.run.model} "
                   f"here, {facts.model} there)")
    for flag, mine, theirs in (("--num-generations", cfg.rollout.num_generations, facts.num_generations),
                               ("--max-new-tokens", cfg.rollout.max_new_tokens, facts.max_new_tokens),
                               ("--temperature", cfg.rollout.temperature, facts.temperature)):
        if mine != theirs:
            out.append(f"{flag}: {mine} here, {theirs} at the learner")
    return out


def method_receiver(cfg: SamplerConfig, method: str, policy: torch.nn.Module, dtype: torch.dtype):
    """The receiver of `method` for `policy` (grpo.weights.registry): ipc and nccl move its parameters
    into flat buckets so that a version is one copy (so it is made before the rollout engine, which
    reads the parameters where they live)."""
    receiver = make_receiver(method, policy, dtype, cfg.run.sync_port, cfg.weight_sync.sync_timeout_s * 12)
    if method != LAST_RESORT:   # bytes set nothing up: said by the first version's line
        log.info("weight sync: %s (--weight-sync %s)", method, cfg.weight_sync.weight_sync)
    return receiver


def start_receiver(cfg: SamplerConfig, policy: torch.nn.Module, device: torch.device):
    """(receiver, method) this sampler starts with: --weight-sync's choice on this device."""
    method = sampler_method(cfg.weight_sync.weight_sync, device.type)
    return method_receiver(cfg, method, policy, compute_dtype(device)), method


class WeightsClient:
    """The sampler's side of the sync port (the module's docstring), used from the main thread only.

    version: the policy version this sampler runs. run_facts: the learner's, from its first answer.
    budget: groups the learner's last answer let this sampler generate (-1: no limit said).
    `counters.handed()` gives the groups this process has handed to its data socket (each request
    says it); `on_levels(levels)` is called with the curriculum's levels of every answer that carries
    them. Of the sampler's counters, sync_s, apply_s, weight_syncs, weight_bytes, swaps and the
    --verify-weight-sync fields are written here.
    """
    _inbox: SyncInbox | None = None   # made on first use around self.sync (see inbox)
    # Round 0 goes out before the learner's first answer (sync_weights, first_answer):
    _heard = False                    # any answer from the learner yet
    _first_request: int | None = None   # the first request's id while its answer is awaited
    _first_asked = 0.0                # when it was sent (time.monotonic())
    _held: M.WeightsAnnounce | None = None   # newer weights in that answer, applied by the next sync_weights
    _rejected_streak = 0              # requests in a row answered only by rejected messages (rejected_streak)
    _rejected_seen = 0                # the sync socket's rejections counted so far

    def __init__(self, cfg: SamplerConfig, sync: SyncClient, policy: torch.nn.Module, device: torch.device,
                 vocab_size: int, receiver, method: str, counters: SamplerCounters,
                 on_levels: Callable[[dict[str, int]], None], incarnation: int = 0):
        self.cfg, self.sync, self.policy, self.device, self.vocab_size = cfg, sync, policy, device, vocab_size
        self.receiver, self.sync_method = receiver, method
        # Receivers of methods the learner answered with instead of the one asked (_receiver_of).
        self._served: dict[str, object] = {}
        self.counters, self.handed, self.on_levels = counters, counters.handed, on_levels
        self.name = f"sampler{cfg.run.sampler_id}"
        self.incarnation = incarnation   # this process's random id, as its groups carry (each request says it)
        self.version = 0
        self.run_facts: M.RunFacts | None = None
        self.budget = -1
        self._budget_handed = 0            # groups handed that the budget accounts for (_on_answer)
        self._asked: dict[int, int] = {}   # request id -> groups handed when it was sent
        self._request_id = 0

    @property
    def inbox(self) -> SyncInbox:
        """The sync socket as the main thread reads it: answers, and the learner's stop mid-round."""
        if self._inbox is None:
            self._inbox = SyncInbox(self.sync)
        return self._inbox

    @property
    def stop(self) -> M.Stop | None:
        """The learner's stop, once it has been read (in an answer or in the middle of a round)."""
        return self.inbox.stop

    @property
    def awaiting_first(self) -> bool:
        """Round 0 is generated while the learner's first answer is on its way (sync_weights)."""
        return self._first_request is not None

    @property
    def holds_newer(self) -> bool:
        """The learner's first answer carried weights newer than round 0's: that round was abandoned
        and the next sync_weights applies them (first_answer)."""
        return self._held is not None

    def answers_waiting(self) -> bool:
        """Whether answers have arrived that no wait has read yet (reads the socket without waiting)."""
        return bool(self.inbox.peek())

    def round_guard(self):
        """Held around a round: with shared weights the sampler reads the learner's live weights, so
        the learner must not step during it (sync, evaluation, generation, old log-probs)."""
        return self.receiver.guard()

    # ------------------------------------------------------------------ answers
    def _on_answer(self, msg: M.Message) -> None:
        """Every answer on the sync channel: the run's facts (first), curriculum levels, the budget."""
        self._heard = True
        if getattr(msg, "run", None) is not None:
            self._check_run(msg.run)
        if getattr(msg, "levels", None) is not None:
            self.on_levels(msg.levels)
        if isinstance(msg, (M.WeightsAnnounce, M.NoUpdate)):
            self.budget = msg.budget   # -1: the learner set no limit
            # The budget accounts for the groups the request said, and for any handed after it that
            # reached the learner before it answered (`counted`): only those after are taken off it.
            self._budget_handed = max(self._asked.get(msg.request_id, self.handed()), msg.counted)

    def live_budget(self) -> int:
        """The last answer's budget less the groups handed since those it accounts for (the request's,
        or the answer's `counted`): those the learner had not counted yet (-1: no limit said)."""
        return -1 if self.budget < 0 else max(0, self.budget - (self.handed() - self._budget_handed))

    def _check_run(self, facts: M.RunFacts) -> None:
        """The learner's facts, with its first answer and again with the first answer of a learner
        that started since (resumed, or restarted by hand, on the same port): they must agree with
        ours, or no group of ours is valid. Other changes (staleness, step size, reference log-probs,
        which the next round follows) are said in one line."""
        if problems := run_mismatches(facts, self.cfg, self.vocab_size):
            raise RunMismatch(("the learner's settings changed (a learner started again on this port?): "
                               if self.run_facts is not None else "this sampler disagrees with the learner; ")
                              + "; ".join(problems) + ": give both the same settings")
        if self.run_facts is not None and facts != self.run_facts:
            changed = [f"{f.name} {getattr(self.run_facts, f.name)} -> {getattr(facts, f.name)}"
                       for f in fields(facts) if getattr(self.run_facts, f.name) != getattr(facts, f.name)]
            log.info("the learner's run facts changed (a learner started again on this port?): %s; this sampler "
                     "follows them", ", ".join(changed))
        if self.run_facts is None:
            log.info("learner's run: model %s, vocabulary %d, %s weights, G=%d, up to %d new tokens, temperature "
                     "%g, %s reference log-probs, staleness <= %d", facts.model, facts.vocab_size, facts.dtype,
                     facts.num_generations, facts.max_new_tokens, facts.temperature,
                     "needs" if facts.needs_ref_logprobs else "does not need", facts.max_staleness)
            mark_stage(self.cfg.run.run_dir, self.name, "connected")
            if not facts.needs_ref_logprobs:
                log.info("reference log-probs: not used by this run (the learner's beta is 0): no reference model, "
                         "no reference pass; groups carry none")
        self.run_facts = facts

    # ------------------------------------------------------------------ requests
    def _ask(self) -> bool:
        """Send the next weights request, saying the groups handed so far (remembered for live_budget)."""
        self._request_id += 1
        self._asked[self._request_id] = handed = self.handed()
        self._asked.pop(self._request_id - 64, None)   # answers come in order: older ones are long answered
        return ask(self.inbox, self.cfg.run.sampler_id, self.version, self._request_id, self.sync_method, sent=handed,
                   incarnation=self.incarnation)

    def sync_weights(self) -> bool:
        """Ask for newer weights and apply the newest answer; False when the learner says stop.

        Waits (up to sync_timeout_s) for the answer to *this* request, recognised by its
        request id; answers to earlier requests that arrive meanwhile are used too if they
        carry newer weights, but never mistaken for this one.

        The first request, before the learner has ever answered, waits only FIRST_GRACE_S when
        this sampler has weights of its own (every method but shared, whose sampler uses the
        learner's): unanswered by then, round 0 is generated with version 0, the checkpoint this
        sampler loaded, while the answer is on its way, and first_answer waits for it before
        anything of the round is scored or sent. A shared sampler waits sync_timeout_s first, and
        then does the same. Either way nothing is sent before the learner's facts are checked.
        """
        t0 = time.perf_counter()
        if (held := self._held) is not None:   # the first answer's newer weights (see first_answer)
            self._held = None
            self._apply(held)   # the request below acknowledges them (ipc, nccl) and asks for anything newer
        # ipc: after applying, ask once more at once. That request acknowledges the version
        # (the learner may then reuse its slot) and picks up anything newer; a copy spoiled
        # by a slot rewrite (stamp changed) is retried the same way.
        for _attempt in range(3):
            first = not self._heard
            self._ask()
            asked = time.monotonic()
            wait = self.cfg.weight_sync.sync_timeout_s
            if first and own_weights(self.sync_method):
                wait = min(wait, FIRST_GRACE_S)
            answered, newest, stop = await_answer(self.inbox, self.version, self._request_id, wait,
                                                  on_answer=self._on_answer)
            self._count_rejections(answered)
            if stop is not None:
                log.info("learner says stop (%s) at version %d", stop.reason, stop.version)
                return False
            if not answered and first:
                self._first_request, self._first_asked = self._request_id, asked
                log.info("no answer from the learner at %s:%d within %.2f s: generating round 0 with version %d (the "
                         "weights loaded here) while its first answer is on its way; nothing is sent before it comes",
                         self.cfg.run.host, self.cfg.run.sync_port, wait, self.version)
                break
            if not answered:
                log.info("no answer from the learner at %s:%d within %.1f s; generating with version %d",
                         self.cfg.run.host, self.cfg.run.sync_port, self.cfg.weight_sync.sync_timeout_s, self.version)
            if newest is None or not self._apply(newest):
                break
        self.counters.add(sync_s=time.perf_counter() - t0)
        return True

    def first_answer(self) -> bool:
        """Round 0 was generated while the learner's first answer was on its way (sync_weights):
        wait for that answer before anything of the round is scored or sent. It carries the run's
        facts, checked as it arrives (_on_answer: a RunMismatch ends the sampler with nothing
        sent). The wait is logged every --sync-timeout-s and ends, after --first-answer-timeout-s
        from the request, in NoFirstAnswer.

        True: finish and send the round (at once when nothing is awaited). False: abandon it,
        nothing of it counted or sent, when the learner said stop (then inbox.stop is set, as for
        a stop in the middle of a round), or when its answer carries weights newer than version 0
        (a resumed learner, or this sampler restarted in the middle of a run). Those weights are
        not applied to a round that version 0 generated (its old log-probs must come from the
        weights that sampled it), and its groups are not sent either, since the learner would
        drop them as too stale: the next sync_weights applies them (they must be taken: an nccl
        learner's sync thread waits for this sampler to receive them) and round 0 is generated
        again with them.
        """
        rid = self._first_request
        if rid is None:
            return True
        cfg = self.cfg
        t0 = time.perf_counter()
        newest: M.WeightsAnnounce | None = None
        while True:
            waited = time.monotonic() - self._first_asked
            if waited >= cfg.weight_sync.first_answer_timeout_s:
                raise NoFirstAnswer(f"no answer from the learner at {cfg.run.host}:{cfg.run.sync_port} within "
                                    f"{cfg.weight_sync.first_answer_timeout_s:g} s of this sampler's first weights request "
                                    f"(--first-answer-timeout-s); nothing was sent. Is the learner running, on "
                                    f"this --host and --sync-port?")
            window = min(max(cfg.weight_sync.sync_timeout_s, 0.1), cfg.weight_sync.first_answer_timeout_s - waited)
            answered, got, stop = await_answer(self.inbox, self.version, rid, window, on_answer=self._on_answer)
            self._count_rejections(answered)
            if got is not None and (newest is None or got.version > newest.version):
                newest = got
            if answered:
                break
            log.info("no answer from the learner at %s:%d yet (%.0f s); round 0 is generated and waits for the run's "
                     "facts before anything is sent", cfg.run.host, cfg.run.sync_port,
                     time.monotonic() - self._first_asked)
        self._first_request = None
        self.counters.add(sync_s=time.perf_counter() - t0)
        if stop is not None:
            self.inbox.stop = stop   # the loop abandons the round and ends
            return False
        if newest is not None:
            self._held = newest
            log.info("the learner's first answer: it is at version %d, past the version %d this sampler loaded; round "
                     "0 is abandoned (nothing of it sent) and generated again with version %d", newest.version,
                     self.version, newest.version)
            return False
        return True

    def _count_rejections(self, answered: bool) -> None:
        """After each wait for an answer: end the sampler (AnswersRejected) once REJECTED_ANSWERS_LIMIT
        requests in a row were answered only by messages that failed this side's checks."""
        total = sum(self.sync.rejected.values())
        self._rejected_streak = rejected_streak(self._rejected_streak, answered, total - self._rejected_seen)
        self._rejected_seen = total
        if self._rejected_streak >= REJECTED_ANSWERS_LIMIT:
            reasons = ", ".join(f"{reason} x{n}" for reason, n in sorted(self.sync.rejected.items()))
            raise AnswersRejected(
                f"{self._rejected_streak} weight requests in a row got only answers this sampler rejected ({reasons}; "
                f"the warning above gives the first one's detail): the learner at {self.cfg.run.host}:{self.cfg.run.sync_port} "
                f"sends messages this code does not accept, so this sampler would go on generating with version "
                f"{self.version}; run the same version of this code on both sides, or another --weight-sync")

    def _ends_round_0(self, msg: M.Message) -> bool:
        """Whether the learner's first answer, read during round 0, makes first_answer abandon the
        round or end the sampler anyway (newer weights, facts we disagree with): then generation
        stops at once instead of finishing the round first."""
        if isinstance(msg, M.WeightsAnnounce) and msg.version > self.version:
            return True
        run = getattr(msg, "run", None)
        return run is not None and bool(run_mismatches(run, self.cfg, self.vocab_size))

    def stop_said(self) -> bool:
        """Between decode chunks: has the learner said stop? (then the round is abandoned) Or, in
        round 0 before the learner's first answer, has that answer come and ends the round?"""
        if self.inbox.stopped():
            return True
        return self._first_request is not None and any(self._ends_round_0(m) for m in self.inbox.peek())

    # ------------------------------------------------------------------ applying a version
    def _apply(self, newest: M.WeightsAnnounce, fall_back: bool = True) -> bool:
        """Apply one announced version; True if a follow-up request should be sent (ipc).
        fall_back=False: a method that proves impossible raises instead of stepping down."""
        t_apply = time.perf_counter()
        try:
            ok = self._receiver_of(newest.method).apply(newest)
        except RuntimeError as exc:
            if not fall_back or fallback(newest.method, self.cfg.weight_sync.weight_sync) == newest.method:
                raise   # asked not to step down, or the last resort failed: nothing to step down to
            self._fall_back(str(exc))
            return True   # ask again, the new way
        if not ok:
            log.info("%s transfer of version %d did not complete (slot rewritten or peer gone); asking again",
                     newest.method, newest.version)
            return True
        dt = time.perf_counter() - t_apply
        self.counters.add(apply_s=dt, weight_syncs=1, weight_bytes=sum(newest.bucket_nbytes))
        drill.maybe_die(int(self.counters.weight_syncs))   # only where GRPO_DRILL_DIE_IN_SWAP is set
        self.version = newest.version
        if self.cfg.weight_sync.verify_weight_sync:  # after the apply's timing: not part of apply_s
            self.counters.put(verified_checksum=fingerprint(self.policy, compute_dtype(self.device)),
                              verified_version=float(self.version))
        log.info("now running policy version %d (%.1f MB by %s applied in %.4f s)", self.version,
                 sum(newest.bucket_nbytes) / 1e6, newest.method, dt)
        return acknowledges(newest.method)   # the follow-up request acknowledges the version

    # ------------------------------------------------------------------ swaps in flight
    _swap_asked = -1     # the request id of the last swap request (out while no later request was sent)
    _swap_asked_at = 0.0
    _swap_failed = -1    # the request id current when a method failed in flight (no swaps until the next sync)

    def round_sync_wanted(self) -> bool:
        """Whether a version the learner announced can be taken only by the sync between two rounds
        (round 0's newer weights; a method that failed in flight or has no receiver here yet)."""
        return self._held is not None or self._swap_failed == self._request_id

    def apply_newer_now(self) -> int | None:
        """A stream's swap() (--swap-in-flight), between two decode steps: apply the newest version
        the learner has announced, in place (ipc and nccl copy over the live buckets, tcp copy_ into
        the parameters), and return it; None when there is none. Never waits: it takes the answers
        that have arrived and keeps one request out, sent at most every SWAP_ASK_S (again at once
        after an apply, to acknowledge it, and after sync_timeout_s without an answer, which the
        protocol may lose). Not while round 0 awaits the learner's first answer (first_answer reads
        it), nor with shared weights (the learner steps them only outside a round). A method that
        fails here is not stepped down from: a new receiver would move the parameters the rows in
        flight read; the next sync_weights steps down and applies it."""
        if self.awaiting_first or self._held is not None or not own_weights(self.sync_method):
            return None
        kept = self.inbox.peek()
        if self._swap_failed == self._request_id or any(isinstance(m, M.Stop) for m in kept):
            return None   # a stop is left for the stream's should_stop and the loop
        newest = None
        for _ in kept:
            msg = self.inbox.receive(0)
            self._on_answer(msg)
            if isinstance(msg, M.WeightsAnnounce) and msg.version > (newest.version if newest else self.version):
                newest = msg
            if getattr(msg, "request_id", -1) == self._swap_asked:
                self._swap_asked = -1   # answered: the next request may go
        before, again = self.version, False
        if newest is not None and newest.method not in (self.sync_method, M.TCP) and newest.method not in self._served:
            # a method this sampler has no receiver for yet: making one would move the parameters the
            # rows in flight read; the next round's sync takes it (no swaps until then)
            newest, self._swap_failed = None, self._request_id
        if newest is not None:
            try:
                again = self._apply(newest, fall_back=False)
            except RuntimeError as exc:
                self._swap_failed = self._request_id
                log.info("%s cannot apply version %d in flight (%s): the next round's sync takes it",
                         newest.method, newest.version, exc)
                return None
        now = time.monotonic()
        # Out: unanswered, not yet given up on, and no later request sent (sync_weights' reads its answer).
        out = self._swap_asked == self._request_id and now - self._swap_asked_at < self.cfg.weight_sync.sync_timeout_s
        if again or (not out and now - self._swap_asked_at >= SWAP_ASK_S):
            if self._ask():
                self._swap_asked, self._swap_asked_at = self._request_id, now
        if self.version == before:
            return None
        self.counters.add(swaps=1)
        return self.version

    def _fall_back(self, why: str) -> None:
        """The current method proved impossible here: step down by the rule both sides share."""
        method = fallback(self.sync_method, self.cfg.weight_sync.weight_sync)
        log.warning("%s unavailable (%s); asking for weights by %s from now on%s", self.sync_method, why, method,
                    " (auto: the learner is on another host)" if method == M.NCCL else "")
        self.receiver = self._served.pop(method, None) or method_receiver(self.cfg, method, self.policy,
                                                                          compute_dtype(self.device))
        self.sync_method = method

    def _receiver_of(self, method: str):
        """The receiver for a version announced by `method`: this sampler's own, or, when the learner
        answered by another method than the one asked (bytes: a CPU learner has no IPC handles, a
        tcp learner serves nothing else), that method's, made on first use."""
        if method == self.sync_method:
            return self.receiver
        if method not in self._served:
            self._served[method] = method_receiver(self.cfg, method, self.policy, compute_dtype(self.device))
        return self._served[method]
