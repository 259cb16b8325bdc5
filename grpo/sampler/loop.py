"""The sampler: start up, then round after round wait for weights, run the rollout workflow, send
its groups, and report (heartbeat, status, evaluation).

  weights_client   the sync port: requests, the learner's first answer and its run facts, applying
                   a new version, the method fallbacks, the budget
  workflow         prompts in, scored groups out: generate (one path: a stream; a fixed round is a
                   stream of one batch with a prompt cap), score, filter zero-signal groups, old and
                   reference log-probs, the wire's Groups
  heartbeat        liveness, backpressure (--on-full) and the sync inbox
  setup            builds all of these (and the model, engine, prompts, rewards, sockets) in
                   start-up order; this module runs them

Weights are swapped between rounds, and with --swap-in-flight also between decode steps of an
in-flight round (grpo.sampler.workflow says how groups then carry their versions). Round 0 is
generated before the learner's first answer and sent only after it (grpo.sampler.weights_client).
"""
from __future__ import annotations

import logging
import time

from grpo.config import SamplerConfig, flat
from grpo.data.rewards import RewardBroken
from grpo.evaluate import greedy_accuracy, record_eval
from grpo.obs.progress import Progress
from grpo.obs.stages import mark as mark_stage
from grpo.sampler.heartbeat import hand_group, wait_send
from grpo.sampler.setup import build
from grpo.sampler.weights_client import AnswersRejected, RunMismatch
from grpo.sampler.workflow import stream_line
from grpo.wire import messages as M

log = logging.getLogger(__name__)


class Sampler:
    """One sampler: built by grpo.sampler.setup.build, run by run() until the learner says stop or
    --max-rounds."""

    def __init__(self, cfg: SamplerConfig, import_s: float | None = None):
        self.cfg = cfg
        # every part, built and wired (grpo.sampler.setup), with the start-up checks and lines
        # (`import_s`: the seconds its worker took to import it, grpo.workers)
        self.parts = build(cfg, import_s)
        self.counters = self.parts.counters   # loop's own: rounds, budget_wait_s, eval_*
        self.name = self.parts.name
        self._evaluated_at = -1
        self._sent_one = False       # 'first_group' marked
        self._last_wait_note = 0.0   # when _wait_for_room last said so

    @property
    def version(self) -> int:
        """The policy version this sampler runs (the weights client's)."""
        return self.parts.client.version

    @property
    def groups_sent(self) -> int:
        """Groups offered to the data socket, including those dropped at the HWM or filtered."""
        return self.counters.groups_sent

    # ------------------------------------------------------------------ send, status
    def _send(self, groups: list[M.Group]) -> None:
        # Groups filtered out as zero-signal are in groups_sent already (SamplerCounters.groups_sent).
        for group in groups:
            hand_group(self.parts.data, group, self.cfg.faults.on_full, self.cfg.faults.send_timeout_s, self.counters,
                       self._where)
        if self.groups_sent and not self._sent_one:   # its first round is out (sent, or filtered whole)
            self._sent_one = True
            mark_stage(self.cfg.run.run_dir, self.name, "first_group")

    def send_status(self, final: bool) -> None:
        if final:  # the learner's books need this one: wait for room, but not forever
            wait_send(self.parts.data, self.parts.statuses(True), self.cfg.faults.send_timeout_s or 600.0, self._where)
        else:  # like a heartbeat: if the queue is full now, the next one says the same, newer
            self.parts.data.send(self.parts.statuses(False), timeout_s=0)

    def _wait_for_room(self) -> None:
        """The learner has as many groups queued as it can train before they go stale, or as its
        steps left to --max-steps (or the time left to --max-time-s) train: wait a moment before asking again (a word every 10 s; the
        learner's answer bounds the wait)."""
        t0 = time.perf_counter()
        time.sleep(0.2)
        self.counters.add(budget_wait_s=time.perf_counter() - t0)
        if time.monotonic() - self._last_wait_note > 10.0:
            self._last_wait_note = time.monotonic()
            log.info("waiting: the learner's queue is full for version %d (budget 0: anything generated now would "
                     "be too stale when trained, or past its last step); asking again every 0.2 s (%.0f s waited "
                     "so far)", self.version, self.counters.budget_wait_s)

    def _round_ends(self) -> bool:
        """A streaming round takes no more prompts: an evaluation is due, or a version the learner
        announced waits for the sync between rounds."""
        return self.eval_due() or self.parts.client.round_sync_wanted()

    @property
    def _where(self) -> str:
        return f"{self.cfg.run.host}:{self.cfg.run.data_port}"

    def eval_due(self) -> bool:
        """Whether the policy now running is due for an evaluation (v0: the baseline; then every
        --eval-every versions). A streaming round ends for it (workflow.stream_round's `ends`)."""
        if self.parts.eval_set is None or self.version == self._evaluated_at:
            return False
        every = self.cfg.evaluation.eval_every
        return not (self._evaluated_at >= 0 and self.version // every == self._evaluated_at // every)

    def maybe_evaluate(self) -> None:
        """Between rounds: evaluate the policy now running if its version is due (eval_due)."""
        if not self.eval_due():
            return
        result = greedy_accuracy(self.parts.policy, self.parts.tok, self.parts.eval_set,
                                 self.cfg.rollout.max_new_tokens,
                                 self.cfg.evaluation.eval_batch_size, self.parts.device, engine=self.parts.engine)
        self._evaluated_at = self.version
        record_eval(self.cfg.run.run_dir, self.version, result, by=f"sampler{self.cfg.run.sampler_id}")
        # Reported to the learner with the next status, which puts it in metrics.jsonl.
        self.counters.put(eval_version=float(self.version), eval_accuracy=result["accuracy"],
                          eval_seconds=result["seconds"])

    # ------------------------------------------------------------------ main loop
    def run(self) -> dict:
        cfg, client, workflow = self.cfg, self.parts.client, self.parts.workflow
        rounds = chunks = 0
        t_start = time.perf_counter()
        bar = Progress(f"sampler{cfg.run.sampler_id} rounds", total=cfg.rollout.max_rounds or None, unit="round")
        self.parts.heartbeat.start()
        self.parts.profiler.mark(1)   # the first chunk begins (a learner step's groups; in fixed rounds, a round)
        try:
            while True:
                # shared: we read the learner's live weights, so it must not step during a round
                # (sync, evaluation, generation, old log-probs); sending needs no lock.
                with client.round_guard():
                    if not client.sync_weights() or (cfg.rollout.max_rounds and rounds >= cfg.rollout.max_rounds):
                        break
                    # Round 0 generated before the learner's first answer (sync_weights): version 0's
                    # evaluation waits until the round is out, for only then is it known that the
                    # learner is at version 0 (a resumed one is not: round 0 is then generated again).
                    early = client.awaiting_first
                    n = workflow.round_prompts()
                    if n:
                        if not early:
                            self.maybe_evaluate()
                        # One path, in flight or a fixed round (one batch, one chunk): each chunk
                        # leaves as soon as it is complete, inside the guard (with shared weights
                        # the learner waits for the round either way).
                        for chunk in workflow.stream_round(rounds, n, ends=self._round_ends):
                            self._send(chunk)
                            chunks += 1
                            self.parts.profiler.mark(chunks + 1)   # --profile-steps: chunk by chunk
                if (stop := client.stop) is not None:
                    log.info("learner says stop (%s) at version %d, in the middle of round %d: the round is "
                             "abandoned (what of it was not sent is not counted)", stop.reason, stop.version,
                             rounds)
                    break
                if client.holds_newer:   # round 0 abandoned: the learner is past version 0 (first_answer)
                    continue
                if not n:   # outside the round guard: with shared weights the learner must go on
                    self._wait_for_room()
                    continue
                if early:   # version 0's evaluation, put off above (the weights have not changed since)
                    with client.round_guard():
                        self.maybe_evaluate()
                rounds += 1
                self.counters.put(rounds=rounds)
                bar.update(1, version=self.version)
                self.send_status(final=False)
            self.parts.heartbeat.stop()  # no heartbeat may follow the final status
            self.send_status(final=True)
        except (AnswersRejected, RunMismatch, RewardBroken):
            # What was sent stays sent: the final status closes this sampler's books at the learner
            # (its data port still works), then the one line ends the process. A sampler that never
            # agreed with a learner sends nothing (a mismatch in the first answer).
            self.parts.heartbeat.stop()
            if client.run_facts is not None:
                self.send_status(final=True)
            raise
        finally:
            self.parts.profiler.close()
            bar.close()
            self.parts.heartbeat.stop()
            elapsed = time.perf_counter() - t_start
            log.info("sampler %d done: %d rounds, %d groups sent, %.1f samples/s, %.2f MB sent, "
                     "last version %d", cfg.run.sampler_id, rounds, self.groups_sent,
                     self.counters.samples / max(elapsed, 1e-9), self.parts.data.bytes_sent / 1e6, self.version)
            if (line := stream_line(self.counters.snapshot(), elapsed)):
                log.info("%s", line)
            self.parts.data.close()  # LINGER lets queued groups reach the learner
            self.parts.sync.close()
            if (close := getattr(self.parts.engine, "close", None)) is not None:
                close()   # vLLM's processes apart stopped while this one is whole (VllmEngine.close)
        return {"rounds": rounds, "groups_sent": self.groups_sent, "version": self.version,
                "config": flat(self.cfg), **self.counters.values()}
