"""The sampler: start up, then round after round wait for weights, run the rollout workflow, send
its groups, and report (heartbeat, status, evaluation).

  weights_client   the sync port: requests, the learner's first answer and its run facts, applying
                   a new version, the method fallbacks, the budget
  workflow         prompts in, scored groups out: generate (a fixed round or a stream), score,
                   filter zero-signal groups, old and reference log-probs, the wire's Groups
  heartbeat        liveness, backpressure (--on-full) and the sync inbox

Weights are swapped between rounds, and with --swap-in-flight also between decode steps of an
in-flight round (grpo.sampler.workflow says how groups then carry their versions). Round 0 is
generated before the learner's first answer and sent only after it (grpo.sampler.weights_client).
"""
from __future__ import annotations

import logging
import secrets
import time
from dataclasses import asdict

import torch

from grpo.config import SamplerConfig
from grpo.data.rewards import RewardBroken, reward_set_from_config
from grpo.evaluate import greedy_accuracy, record_eval, run_eval_problems
from grpo.generate.backend import old_logprob_source, resolve_backend
from grpo.generate.engine import RolloutEngine
from grpo.generate.stream import STREAM_COUNTS
from grpo.model import compute_dtype, eos_ids, load_causal_lm, load_tokenizer, pick_device, resolve_model, start_runtime
from grpo.obs.gpu import GpuMonitor, release_cached
from grpo.obs.profile import SpanProfiler
from grpo.obs.progress import Progress
from grpo.obs.stages import mark as mark_stage
from grpo.sampler.heartbeat import ON_FULL, Heartbeat, send_group, wait_send
from grpo.sampler.weights_client import AnswersRejected, RunMismatch, WeightsClient, start_receiver
from grpo.sampler.workflow import Prompts, RolloutWorkflow, stream_line, swaps_in_flight
from grpo.weights.methods import sampler_method
from grpo.wire import messages as M
from grpo.wire.curve import CLIENT, curve_for
from grpo.wire.transport import DataSender, SyncClient

log = logging.getLogger(__name__)


class Sampler:
    def __init__(self, cfg: SamplerConfig):
        self.cfg = cfg
        if cfg.on_full not in ON_FULL:
            raise ValueError(f"--on-full {cfg.on_full}: choose one of {', '.join(ON_FULL)}")
        curve = curve_for(cfg.curve_keys, CLIENT)  # bad keys fail here, before the model loads
        self.profiler = SpanProfiler(cfg.profile_steps, cfg.run_dir, f"sampler{cfg.sampler_id}")   # so does a bad span
        t_device = time.perf_counter()
        self.device = pick_device(cfg.device, cfg.gpu_id)   # on CUDA: torch's CUDA initialisation
        t_device = time.perf_counter() - t_device
        self.backend = resolve_backend(cfg.generation_backend, self.device)  # a bad name fails before any loading
        if cfg.in_flight_rows and self.backend != "fast":   # a negative count is refused with the flag
            raise ValueError(f"--in-flight-rows {cfg.in_flight_rows}: needs --generation-backend fast (here it is "
                             f"{self.backend}); or 0 for fixed rounds")
        # a bad choice fails before any loading too
        self.old_source = old_logprob_source(cfg.old_logprobs, self.backend, compute_dtype(self.device))
        # (so does --old-logprobs pass with --swap-in-flight)
        self.swaps = swaps_in_flight(cfg.swap_in_flight, cfg.in_flight_rows, sampler_method(cfg.weight_sync, self.device.type),
                                     cfg.old_logprobs)
        torch.manual_seed(cfg.seed + 1000 * cfg.sampler_id)
        rewards = reward_set_from_config(cfg)  # a bad --reward fails here, before any model loads
        t0 = time.perf_counter()
        prompts = Prompts(cfg)   # this sampler's shard, at the curriculum's levels (--curriculum)
        t_problems = time.perf_counter()
        rewards.probe(prompts.mine[0])
        t_prompts = time.perf_counter()
        path = resolve_model(cfg.model)
        load_times: dict[str, float] = {}   # the parts of 'model' in the start-up line
        start_runtime(self.device, load_times, cfg.cudnn_attention)
        t_tok = time.perf_counter()
        self.tok = load_tokenizer(path)
        load_times["tokenizer"] = time.perf_counter() - t_tok
        self.policy = load_causal_lm(path, self.device, compute_dtype(self.device), times=load_times).eval()
        t_model = time.perf_counter()
        self.vocab_size = self.policy.get_input_embeddings().weight.shape[0]
        # ipc/nccl: the policy's parameters move into flat buckets so that a version is one copy
        # (before the engine, which reads them where they live).
        receiver, method = start_receiver(cfg, self.policy, self.device)
        # Every id that ends a completion: the tokenizer's EOS and the generation config's (Llama 3 and
        # Qwen2.5 list several).
        self.eos_ids = eos_ids(self.tok, self.policy)
        self.engine = (RolloutEngine(self.policy, self.eos_ids, self.tok.pad_token_id,
                                     cuda_graphs=cfg.cuda_graphs and self.device.type == "cuda",
                                     compile_decode=cfg.compile_decode, attend_chunk=cfg.attend_chunk or None,
                                     compile_ring=cfg.compile_ring and cfg.in_flight_rows > 0,
                                     refill_behind=cfg.refill_behind)
                       if self.backend == "fast" else None)
        if self.engine is not None and self.engine.fallback is not None:
            # An architecture the engine cannot serve (its warning said why): Hugging Face generate,
            # old log-probs from a pass. In flight, the engine stays: it streams fixed batches through
            # generate.
            self.backend = "hf"
            self.old_source = "pass"
            if not cfg.in_flight_rows:
                self.engine = None
        if self.swaps and self.old_source != "sampling":
            # Each token's log-prob as drawn is under the version that drew it (on the fallback, a
            # pass over each batch before the next swap); a pass at the group's end is not.
            log.info("--swap-in-flight: old log-probs from the sampling pass (--old-logprobs %s would choose a pass "
                     "with the weights at each group's end)", cfg.old_logprobs)
            self.old_source = "sampling"
        log.info("start-up: device %.1f s, problems %.1f s, reward probe %.1f s, model %.1f s (%s), weight receiver "
                 "and engine %.1f s", t_device, t_problems - t0, t_prompts - t_problems, t_model - t_prompts,
                 ", ".join(f"{k} {v:.1f} s" for k, v in load_times.items()), time.perf_counter() - t_model)
        self.groups_sent = 0  # groups offered to the data socket, including those dropped at the HWM or filtered
        # A restart under the same --sampler-id is a new process with fresh counts: the
        # learner's books tell the two apart by this random id.
        self.incarnation = secrets.randbits(48)
        self.data = DataSender(cfg.host, cfg.data_port, hwm=cfg.send_hwm, curve=curve)
        # Accept weights up to float32 size whatever our own dtype: a learner may publish fp32.
        total = sum(p.numel() * 4 for p in self.policy.parameters())
        self.sync = SyncClient(cfg.host, cfg.sync_port, M.weights_limits(total + (64 << 20)), curve=curve)
        # Sampler 0 evaluates (greedy pass@1) at version 0 and at every multiple of --eval-every.
        self.eval_set = run_eval_problems(cfg) if cfg.eval_every > 0 and cfg.sampler_id == 0 else None
        self._evaluated_at = -1
        self.gpu = GpuMonitor(self.device)
        # A fixed key set, but for reward_failures/<reward>/<type> (grpo.data.faults): the heartbeat
        # thread copies this dict (list(items()), one step under the GIL) while the main thread updates it.
        self.stats = {"samples": 0.0, "tokens": 0.0, "gen_s": 0.0, "logprob_s": 0.0, "reward_s": 0.0,
                      "sync_s": 0.0, "weight_bytes": 0.0, "weight_syncs": 0.0, "apply_s": 0.0, "rounds": 0.0,
                      "dropped_full": 0.0, "dropped_send_timeout": 0.0, "dropped_zero_signal": 0.0,
                      "peak_mem_gb": 0.0, "peak_reserved_gb": 0.0,   # GiB, the run's largest (all rounds)
                      "eval_version": -1.0, "eval_accuracy": 0.0, "eval_seconds": 0.0,
                      "verified_version": -1.0, "verified_checksum": 0.0,  # --verify-weight-sync
                      "budget_wait_s": 0.0,   # waiting for the learner's queue to have room
                      "swaps": 0.0,   # versions applied between decode steps (--swap-in-flight)
                      "reward_failures": 0.0,   # completions a reward could not score (their failure value counted)
                      "prompts_deferred": 0.0,   # --defer-zero-signal: train prompts passed over once
                      # --in-flight-rows: the engine's stream_counts (grpo.generate.stream.STREAM_COUNTS)
                      **{f"stream_{k}": 0.0 for k in STREAM_COUNTS},
                      **prompts.window.stats()}   # --curriculum: per task, level, groups and rate
        self.client = WeightsClient(cfg, self.sync, self.policy, self.device, self.vocab_size, receiver, method,
                                    self.stats, handed=self._handed, on_levels=prompts.set_levels)
        self.workflow = RolloutWorkflow(cfg, prompts, rewards, self.tok, self.policy, self.engine, self.eos_ids,
                                        self.old_source, self.device, path, self.client, self.stats, self.gpu,
                                        self.incarnation, on_filtered=self._filtered, swaps=self.swaps)
        self.heartbeat = Heartbeat(DataSender(cfg.host, cfg.data_port, hwm=2, curve=curve),
                                   cfg.heartbeat_interval_s, lambda: self._status(final=False))
        self.name = f"sampler{cfg.sampler_id}"
        self._sent_one = False       # 'first_group' marked
        self._last_wait_note = 0.0   # when _wait_for_room last said so
        self._t_started = time.perf_counter()   # the clock of its statuses (clock_s)
        log.info("sampler %d/%d on %s: %d prompts in its shard, model %s, G=%d, %s prompts per round, "
                 "%s generation%s, old log-probs from %s", cfg.sampler_id, cfg.num_samplers, self.device,
                 len(prompts.mine), path, cfg.num_generations,
                 cfg.prompts_per_round or ("no fixed number of" if self.swaps else
                                           f"a step's worth of groups with signal (at most {cfg.max_prompts_per_round})"),
                 self.backend,
                 (f", in flight on {cfg.in_flight_rows} rows" + (", weights swapped in flight, prompts started as "
                                                                  "the learner's budget allows" if self.swaps else ""))
                 if cfg.in_flight_rows else "",
                 "the sampling pass" if self.old_source == "sampling" else "a teacher-forced pass")
        release_cached(self.device)   # what start-up cached, for the other process on this GPU
        mark_stage(cfg.run_dir, self.name, "model_loaded")

    @property
    def version(self) -> int:
        """The policy version this sampler runs (the weights client's)."""
        return self.client.version

    # ------------------------------------------------------------------ counts, send, status
    def _handed(self) -> int:
        """Groups this process has handed to its data socket (made, minus those it dropped itself)."""
        st = self.stats
        return self.groups_sent - int(st["dropped_zero_signal"] + st["dropped_full"] + st["dropped_send_timeout"])

    def _filtered(self, n: int) -> None:
        """n groups were made and filtered as zero-signal (the workflow): offered and dropped here. Sent
        first, so that every status (a heartbeat may read them at any moment) has sent >= dropped."""
        self.groups_sent += n
        self.stats["dropped_zero_signal"] += n

    def _status(self, final: bool) -> M.SamplerStatus:
        return M.SamplerStatus(sampler_id=self.cfg.sampler_id, policy_version=self.version,
                               groups_sent=self.groups_sent, final=final,
                               # clock_s: this sampler's own seconds, so the learner can turn its busy
                               # seconds into a rate between two statuses (grpo.stats.busy_rate)
                               stats={**{k: float(v) for k, v in list(self.stats.items())},
                                      "clock_s": time.perf_counter() - self._t_started},
                               incarnation=self.incarnation)

    def _send(self, groups: list[M.Group]) -> None:
        # Groups filtered out as zero-signal were counted as offered by _filtered already.
        for group in groups:
            self.groups_sent += 1  # offered: a group dropped at the HWM is counted too
            send_group(self.data, group, self.cfg.on_full, self.cfg.send_timeout_s, self.stats,
                       self._where, f"group {self.groups_sent}")
        if self.groups_sent and not self._sent_one:   # its first round is out (sent, or filtered whole)
            self._sent_one = True
            mark_stage(self.cfg.run_dir, self.name, "first_group")

    def send_status(self, final: bool) -> None:
        if final:  # the learner's books need this one: wait for room, but not forever
            wait_send(self.data, self._status(True), self.cfg.send_timeout_s or 600.0, self._where)
        else:  # like a heartbeat: if the queue is full now, the next one says the same, newer
            self.data.send(self._status(False), timeout_s=0)

    def _wait_for_room(self) -> None:
        """The learner has as many groups queued as it can train before they go stale: wait a
        moment before asking again (a word every 10 s; the learner's answer bounds the wait)."""
        t0 = time.perf_counter()
        time.sleep(0.2)
        self.stats["budget_wait_s"] += time.perf_counter() - t0
        if time.monotonic() - self._last_wait_note > 10.0:
            self._last_wait_note = time.monotonic()
            log.info("waiting: the learner's queue is full for version %d (budget 0: anything generated now would "
                     "be too stale when trained); asking again every 0.2 s (%.0f s waited so far)", self.version,
                     self.stats["budget_wait_s"])

    def _round_ends(self) -> bool:
        """A streaming round takes no more prompts: an evaluation is due, or a version the learner
        announced waits for the sync between rounds."""
        return self.eval_due() or self.client.round_sync_wanted()

    @property
    def _where(self) -> str:
        return f"{self.cfg.host}:{self.cfg.data_port}"

    def eval_due(self) -> bool:
        """Whether the policy now running is due for an evaluation (v0: the baseline; then every
        --eval-every versions). A streaming round ends for it (workflow.stream_round's `ends`)."""
        if self.eval_set is None or self.version == self._evaluated_at:
            return False
        every = self.cfg.eval_every
        return not (self._evaluated_at >= 0 and self.version // every == self._evaluated_at // every)

    def maybe_evaluate(self) -> None:
        """Between rounds: evaluate the policy now running if its version is due (eval_due)."""
        if not self.eval_due():
            return
        result = greedy_accuracy(self.policy, self.tok, self.eval_set, self.cfg.max_new_tokens,
                                 self.cfg.eval_batch_size, self.device, engine=self.engine)
        self._evaluated_at = self.version
        record_eval(self.cfg.run_dir, self.version, result, by=f"sampler{self.cfg.sampler_id}")
        # Reported to the learner with the next status, which puts it in metrics.jsonl.
        self.stats.update(eval_version=float(self.version), eval_accuracy=result["accuracy"],
                          eval_seconds=result["seconds"])

    # ------------------------------------------------------------------ main loop
    def run(self) -> dict:
        cfg, client, workflow = self.cfg, self.client, self.workflow
        rounds = 0
        t_start = time.perf_counter()
        bar = Progress(f"sampler{cfg.sampler_id} rounds", total=cfg.max_rounds or None, unit="round")
        self.heartbeat.start()
        try:
            while True:
                with self.profiler.around(rounds):
                    # shared: we read the learner's live weights, so it must not step during a round
                    # (sync, evaluation, generation, old log-probs); sending needs no lock.
                    with client.round_guard():
                        if not client.sync_weights() or (cfg.max_rounds and rounds >= cfg.max_rounds):
                            break
                        # Round 0 generated before the learner's first answer (sync_weights): version 0's
                        # evaluation waits until the round is out, for only then is it known that the
                        # learner is at version 0 (a resumed one is not: round 0 is then generated again).
                        early = client.awaiting_first
                        n = workflow.round_prompts()
                        groups = []
                        if n:
                            if not early:
                                self.maybe_evaluate()
                            if cfg.in_flight_rows:
                                # Each chunk leaves as soon as it is complete, inside the guard (with
                                # shared weights the learner waits for the round either way).
                                for chunk in workflow.stream_round(rounds, n, ends=self._round_ends):
                                    self._send(chunk)
                            else:
                                groups = workflow.generate_round(rounds, n)
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
                    self._send(groups)
                    if early:   # version 0's evaluation, put off above (the weights have not changed since)
                        with client.round_guard():
                            self.maybe_evaluate()
                    rounds += 1
                    self.stats["rounds"] = rounds
                    bar.update(1, version=self.version)
                    self.send_status(final=False)
            self.heartbeat.stop()  # no heartbeat may follow the final status
            self.send_status(final=True)
        except (AnswersRejected, RunMismatch, RewardBroken):
            # What was sent stays sent: the final status closes this sampler's books at the learner
            # (its data port still works), then the one line ends the process. A sampler that never
            # agreed with a learner sends nothing (a mismatch in the first answer).
            self.heartbeat.stop()
            if client.run_facts is not None:
                self.send_status(final=True)
            raise
        finally:
            bar.close()
            self.heartbeat.stop()
            elapsed = time.perf_counter() - t_start
            log.info("sampler %d done: %d rounds, %d groups sent, %.1f samples/s, %.2f MB sent, "
                     "last version %d", cfg.sampler_id, rounds, self.groups_sent,
                     self.stats["samples"] / max(elapsed, 1e-9), self.data.bytes_sent / 1e6, self.version)
            if (line := stream_line(self.stats, elapsed)):
                log.info("%s", line)
            self.data.close()  # LINGER lets queued groups reach the learner
            self.sync.close()
        return {"rounds": rounds, "groups_sent": self.groups_sent, "version": self.version,
                "config": asdict(self.cfg), **self.stats}
