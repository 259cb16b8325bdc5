"""The sampler: generate G completions per prompt, score them, compute behaviour and
reference log-probs with a teacher-forced pass, and send whole groups to the learner.

Weights are swapped only between rounds (never while a round generates), so every token
of a round was sampled by one policy version, which is the version the groups carry.

The first round does not wait for the learner (which may still be loading): the sampler loaded
the run's checkpoint itself, so its own weights are version 0. It sends its first weights
request and generates round 0 at once; the learner's answer, which carries the run's facts, is
waited for before anything of the round is scored or sent (see Sampler._first_answer).
"""
from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import secrets
import time
from dataclasses import asdict, fields

import numpy as np
import torch

from grpo.config import SamplerConfig
from grpo.data.prompts import PromptStream, problem_prompt
from grpo.data.rewards import reward_set_from_config
from grpo.data.sources import load_problems, shard
from grpo.data.tasks import SuccessWindow, start_levels
from grpo.evaluate import greedy_accuracy, record_eval, run_eval_problems
from grpo.generate.backend import hf_generate, old_logprob_source, resolve_backend
from grpo.generate.engine import RolloutEngine
from grpo.loss import has_signal
from grpo.model import (compute_dtype, eos_ids, load_causal_lm, load_tokenizer, pick_device, resolve_model, right_pad,
                        start_runtime, token_logprobs)
from grpo.obs.gpu import GpuMonitor, format_gpu, release_cached
from grpo.obs.profile import SpanProfiler
from grpo.obs.progress import Progress
from grpo.obs.stages import mark as mark_stage
from grpo.sampler.heartbeat import ON_FULL, Heartbeat, SyncInbox, send_group, wait_send
from grpo.sync.client import ask, await_answer
from grpo.sync.staleness import FIRST_STEP_GROUPS, bucket_prompts, next_round_prompts, signal_share
from grpo.weights import make_receiver
from grpo.weights.methods import acknowledges, fallback, sampler_method
from grpo.weights.tcp import apply_weights
from grpo.wire import messages as M
from grpo.wire.curve import CLIENT, curve_for
from grpo.wire.transport import DataSender, SyncClient

log = logging.getLogger(__name__)


# The first weights request of a sampler with weights of its own waits this long for its answer
# (the answer of a learner that is up comes in milliseconds: a sampler restarted mid-run then
# starts at the learner's version, as before) before round 0 is generated without it.
FIRST_GRACE_S = 0.25
SIGNAL_ROUNDS = 4   # the rounds whose groups give the share of groups with signal


class RunMismatch(ValueError):
    """This sampler disagrees with the learner on a setting both must share (one line, with the fix)."""


class NoFirstAnswer(RuntimeError):
    """The learner never answered the first weights request within --first-answer-timeout-s (one line)."""


class AnswersRejected(RuntimeError):
    """The learner's answers on the sync port keep failing this sampler's checks (one line): the two
    sides do not speak the same messages, and this sampler would generate with old weights for ever."""


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


def run_mismatches(facts: M.RunFacts, cfg: SamplerConfig, vocab_size: int) -> list[str]:
    """What this sampler and the learner's run facts disagree on, each as 'flag: here vs learner'."""
    out = []
    if facts.vocab_size != vocab_size:
        out.append(f"vocabulary: {vocab_size} here, {facts.vocab_size} at the learner (--model {cfg.model} "
                   f"here, {facts.model} there)")
    for flag, mine, theirs in (("--num-generations", cfg.num_generations, facts.num_generations),
                               ("--max-new-tokens", cfg.max_new_tokens, facts.max_new_tokens),
                               ("--temperature", cfg.temperature, facts.temperature)):
        if mine != theirs:
            out.append(f"{flag}: {mine} here, {theirs} at the learner")
    return out


class Sampler:
    _inbox: SyncInbox | None = None   # made on first use around self.sync (see inbox)
    # Round 0 goes out before the learner's first answer (sync_weights, _first_answer):
    _heard = False                    # any answer from the learner yet
    _first_request: int | None = None   # the first request's id while its answer is awaited
    _first_asked = 0.0                # when it was sent (time.monotonic())
    _held: M.WeightsAnnounce | None = None   # newer weights in that answer, applied by the next sync_weights
    _rejected_streak = 0              # requests in a row answered only by rejected messages (rejected_streak)
    _rejected_seen = 0                # the sync socket's rejections counted so far

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
        if cfg.in_flight_rows < 0 or (cfg.in_flight_rows and self.backend != "fast"):
            raise ValueError(f"--in-flight-rows {cfg.in_flight_rows}: needs --generation-backend fast (and a count "
                             f">= 1); or 0 for fixed rounds")
        # a bad choice fails before any loading too
        self.old_source = old_logprob_source(cfg.old_logprobs, self.backend, compute_dtype(self.device))
        torch.manual_seed(cfg.seed + 1000 * cfg.sampler_id)
        self.rewards = reward_set_from_config(cfg)  # a bad --reward fails here, before any model loads
        # --curriculum: every task starts at level 0; the learner's answers move the levels.
        self.levels = start_levels(cfg.dataset) if cfg.curriculum else None
        self.window = SuccessWindow(cfg.curriculum_window)
        t0 = time.perf_counter()
        mine = self._load_prompts()
        t_problems = time.perf_counter()
        self.rewards.probe(mine[0])
        t_prompts = time.perf_counter()
        path = resolve_model(cfg.model)
        load_times: dict[str, float] = {}   # the parts of 'model' in the start-up line
        start_runtime(self.device, load_times, cfg.cudnn_attention)
        t_tok = time.perf_counter()
        self.tok = load_tokenizer(path)
        load_times["tokenizer"] = time.perf_counter() - t_tok
        dtype = compute_dtype(self.device)
        self.policy = load_causal_lm(path, self.device, dtype, times=load_times).eval()
        t_model = time.perf_counter()
        # The frozen reference model is loaded only once the learner says the run needs its
        # log-probs (beta > 0; RunFacts.needs_ref_logprobs), or if it never says.
        self._model_path, self.ref = path, None
        self.vocab_size = self.policy.get_input_embeddings().weight.shape[0]
        # ipc/nccl: the policy's parameters move into flat buckets so that a version is one copy.
        self.receiver, self.sync_method = None, M.TCP
        if (method := sampler_method(cfg.weight_sync, self.device)) != M.TCP:
            self._use(method, dtype)
        # Every id that ends a completion: the tokenizer's EOS and the generation config's (Llama 3 and
        # Qwen2.5 list several).
        self.eos_ids = eos_ids(self.tok, self.policy)
        self.engine = (RolloutEngine(self.policy, self.eos_ids, self.tok.pad_token_id,
                                     cuda_graphs=cfg.cuda_graphs and self.device.type == "cuda",
                                     compile_decode=cfg.compile_decode, attend_chunk=cfg.attend_chunk or None)
                       if self.backend == "fast" else None)
        if self.engine is not None and self.engine.fallback is not None:
            # An architecture the engine cannot serve (its warning said why): Hugging Face generate,
            # old log-probs from a pass. In flight, the engine stays: it streams fixed batches through
            # generate.
            self.backend = "hf"
            self.old_source = "pass"
            if not cfg.in_flight_rows:
                self.engine = None
        log.info("start-up: device %.1f s, problems %.1f s, reward probe %.1f s, model %.1f s (%s), weight receiver "
                 "and engine %.1f s", t_device, t_problems - t0, t_prompts - t_problems, t_model - t_prompts,
                 ", ".join(f"{k} {v:.1f} s" for k, v in load_times.items()), time.perf_counter() - t_model)
        self.version = 0
        self._signal: collections.deque[tuple[int, int]] = collections.deque(maxlen=SIGNAL_ROUNDS)  # (kept, groups)
        self._request_id = 0
        self.groups_sent = 0  # groups offered to the data socket, including those dropped at the HWM
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
        # A fixed key set: the heartbeat thread reads this dict while the main thread updates it.
        self.stats = {"samples": 0.0, "tokens": 0.0, "gen_s": 0.0, "logprob_s": 0.0, "reward_s": 0.0,
                      "sync_s": 0.0, "weight_bytes": 0.0, "weight_syncs": 0.0, "apply_s": 0.0, "rounds": 0.0,
                      "dropped_full": 0.0, "dropped_send_timeout": 0.0, "dropped_zero_signal": 0.0,
                      "peak_mem_gb": 0.0, "peak_reserved_gb": 0.0,   # GiB, the run's largest (all rounds)
                      "eval_version": -1.0, "eval_accuracy": 0.0, "eval_seconds": 0.0,
                      "verified_version": -1.0, "verified_checksum": 0.0,  # --verify-weight-sync
                      "budget_wait_s": 0.0,   # waiting for the learner's queue to have room
                      **self.window.stats()}   # --curriculum: per task, level, groups and rate
        self.heartbeat = Heartbeat(DataSender(cfg.host, cfg.data_port, hwm=2, curve=curve),
                                   cfg.heartbeat_interval_s, lambda: self._status(final=False))
        self.name = f"sampler{cfg.sampler_id}"
        self.budget = -1   # groups the learner's last answer let us generate (-1: no limit said)
        self._sent_one = False
        self._last_wait_note = 0.0   # (groups_sent counts filtered groups too, so it cannot tell)
        self.run_facts: M.RunFacts | None = None   # the learner's, from its first answer
        log.info("sampler %d/%d on %s: %d prompts in its shard, model %s, G=%d, %s prompts per round, "
                 "%s generation%s, old log-probs from %s", cfg.sampler_id, cfg.num_samplers, self.device, len(mine),
                 path, cfg.num_generations,
                 cfg.prompts_per_round or f"a step's worth of groups with signal (at most {cfg.max_prompts_per_round})",
                 self.backend,
                 f", in flight on {cfg.in_flight_rows} rows" if cfg.in_flight_rows else "",
                 "the sampling pass" if self.old_source == "sampling" else "a teacher-forced pass")
        release_cached(self.device)   # what start-up cached, for the other process on this GPU
        mark_stage(cfg.run_dir, self.name, "model_loaded")

    def _load_prompts(self) -> list:
        """This sampler's shard of the train split (at the curriculum's levels), as its prompt stream."""
        cfg = self.cfg
        problems = load_problems(cfg.dataset, "train", limit=cfg.dataset_limit or None, seed=cfg.seed,
                                 transform=cfg.dataset_transform, levels=self.levels)
        mine = shard(problems, cfg.sampler_id, cfg.num_samplers)
        if not mine:
            raise ValueError(f"sampler {cfg.sampler_id} of {cfg.num_samplers} got no prompts "
                             f"from {len(problems)} problems; use fewer samplers or more data")
        for task, level in (self.levels or {}).items():
            self.window.set_level(task, level)
        self.prompts = PromptStream(mine, seed=cfg.seed + cfg.sampler_id)
        return mine

    def _set_levels(self, levels: dict[str, int]) -> None:
        """The learner moved the curriculum: from the next round, prompts come from the new levels."""
        if self.levels is None or levels == self.levels:
            return
        moved = ", ".join(f"{t} {self.levels.get(t)} -> {lv}" for t, lv in levels.items() if self.levels.get(t) != lv)
        self.levels = {t: int(levels.get(t, lv)) for t, lv in self.levels.items()}
        self._load_prompts()
        log.info("curriculum: %s (prompts regenerated at the new levels)", moved)

    def _on_answer(self, msg: M.Message) -> None:
        """Every answer on the sync channel: the run's facts (first), curriculum levels, the budget."""
        self._heard = True
        if getattr(msg, "run", None) is not None:
            self._check_run(msg.run)
        if getattr(msg, "levels", None) is not None:
            self._set_levels(msg.levels)
        if isinstance(msg, (M.WeightsAnnounce, M.NoUpdate)):
            self.budget = msg.budget   # -1: the learner set no limit

    def _handed(self) -> int:
        """Groups this process has handed to its data socket (made, minus those it dropped itself)."""
        st = self.stats
        return self.groups_sent - int(st["dropped_zero_signal"] + st["dropped_full"] + st["dropped_send_timeout"])

    def _round_prompts(self) -> int:
        """Prompts for the next round: --prompts-per-round, or fewer when the learner's queue is so
        long that more groups would reach it too stale to train on (the budget in its answer).
        --prompts-per-round 0: enough that the groups with signal fill one learner step, within the
        budget (grpo.sync.staleness.next_round_prompts)."""
        step = self.run_facts.groups_per_step if self.run_facts is not None else 0   # 0: not said yet
        return next_round_prompts(self.cfg.prompts_per_round, self.budget, step, self._signal_share(),
                                  self.cfg.max_prompts_per_round, self._bucket_prompts())

    def _first_round_prompts(self) -> int:
        """Round 0's prompts, before the learner has said its step's size (FIRST_STEP_GROUPS assumed)."""
        return next_round_prompts(0, -1, 0, self._signal_share(), self.cfg.max_prompts_per_round,
                                  self._bucket_prompts())

    def _bucket_prompts(self) -> int:
        """grpo.sync.staleness.bucket_prompts for this sampler's engine (a round of a small step's worth,
        2 groups with the defaults, takes as long as this many)."""
        return bucket_prompts(self.engine.buckets if self.engine is not None else (), self.cfg.num_generations)

    def _signal_share(self) -> float:
        """The share of the last SIGNAL_ROUNDS rounds' groups that had signal (grpo.sync.staleness.signal_share)."""
        return signal_share(self._signal, self.cfg.filter_zero_signal)

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
            mark_stage(self.cfg.run_dir, self.name, "connected")
            if not facts.needs_ref_logprobs:
                log.info("reference log-probs: not used by this run (the learner's beta is 0): no reference model, "
                         "no reference pass; groups carry none")
        self.run_facts = facts

    # ------------------------------------------------------------------ weights
    def sync_weights(self) -> bool:
        """Ask for newer weights and apply the newest answer; False when the learner says stop.

        Waits (up to sync_timeout_s) for the answer to *this* request, recognised by its
        request id; answers to earlier requests that arrive meanwhile are used too if they
        carry newer weights, but never mistaken for this one.

        The first request, before the learner has ever answered, waits only FIRST_GRACE_S when
        this sampler has weights of its own (every method but shared, whose sampler uses the
        learner's): unanswered by then, round 0 is generated with version 0, the checkpoint this
        sampler loaded, while the answer is on its way, and _first_answer waits for it before
        anything of the round is scored or sent. A shared sampler waits sync_timeout_s first, and
        then does the same. Either way nothing is sent before the learner's facts are checked.
        """
        t0 = time.perf_counter()
        if (held := self._held) is not None:   # the first answer's newer weights (see _first_answer)
            self._held = None
            self._apply(held)   # the request below acknowledges them (ipc, nccl) and asks for anything newer
        # ipc: after applying, ask once more at once. That request acknowledges the version
        # (the learner may then reuse its slot) and picks up anything newer; a copy spoiled
        # by a slot rewrite (stamp changed) is retried the same way.
        for _attempt in range(3):
            first = not self._heard
            self._request_id += 1
            ask(self.inbox, self.cfg.sampler_id, self.version, self._request_id, self.sync_method,
                sent=self._handed())
            asked = time.monotonic()
            wait = self.cfg.sync_timeout_s
            if first and self.sync_method != M.SHARED:
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
                         self.cfg.host, self.cfg.sync_port, wait, self.version)
                break
            if not answered:
                log.info("no answer from the learner at %s:%d within %.1f s; generating with version %d",
                         self.cfg.host, self.cfg.sync_port, self.cfg.sync_timeout_s, self.version)
            if newest is None or not self._apply(newest):
                break
        self.stats["sync_s"] += time.perf_counter() - t0
        return True

    def _first_answer(self) -> bool:
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
            if waited >= cfg.first_answer_timeout_s:
                raise NoFirstAnswer(f"no answer from the learner at {cfg.host}:{cfg.sync_port} within "
                                    f"{cfg.first_answer_timeout_s:g} s of this sampler's first weights request "
                                    f"(--first-answer-timeout-s); nothing was sent. Is the learner running, on "
                                    f"this --host and --sync-port?")
            window = min(max(cfg.sync_timeout_s, 0.1), cfg.first_answer_timeout_s - waited)
            answered, got, stop = await_answer(self.inbox, self.version, rid, window, on_answer=self._on_answer)
            self._count_rejections(answered)
            if got is not None and (newest is None or got.version > newest.version):
                newest = got
            if answered:
                break
            log.info("no answer from the learner at %s:%d yet (%.0f s); round 0 is generated and waits for the run's "
                     "facts before anything is sent", cfg.host, cfg.sync_port, time.monotonic() - self._first_asked)
        self._first_request = None
        self.stats["sync_s"] += time.perf_counter() - t0
        if stop is not None:
            self.inbox.stop = stop   # run() abandons the round and ends
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
                f"the warning above gives the first one's detail): the learner at {self.cfg.host}:{self.cfg.sync_port} "
                f"sends messages this code does not accept, so this sampler would go on generating with version "
                f"{self.version}; run the same version of this code on both sides, or another --weight-sync")

    def _ends_round_0(self, msg: M.Message) -> bool:
        """Whether the learner's first answer, read during round 0, makes _first_answer abandon the
        round or end the sampler anyway (newer weights, facts we disagree with): then generation
        stops at once instead of finishing the round first."""
        if isinstance(msg, M.WeightsAnnounce) and msg.version > self.version:
            return True
        run = getattr(msg, "run", None)
        return run is not None and bool(run_mismatches(run, self.cfg, self.vocab_size))

    @property
    def inbox(self) -> SyncInbox:
        """The sync socket as the main thread reads it: answers, and the learner's stop mid-round."""
        if self._inbox is None:
            self._inbox = SyncInbox(self.sync)
        return self._inbox

    def _stop_said(self) -> bool:
        """Between decode chunks: has the learner said stop? (then the round is abandoned) Or, in
        round 0 before the learner's first answer, has that answer come and ends the round?"""
        if self.inbox.stopped():
            return True
        return self._first_request is not None and any(self._ends_round_0(m) for m in self.inbox.peek())

    def _apply(self, newest: M.WeightsAnnounce) -> bool:
        """Apply one announced version; True if a follow-up request should be sent (ipc)."""
        t_apply = time.perf_counter()
        if newest.method in (M.IPC, M.NCCL, M.SHARED):
            try:
                ok = self.receiver.apply(newest)
            except RuntimeError as exc:
                self._fall_back(str(exc))
                return True   # ask again, the new way
            if not ok:
                log.info("%s transfer of version %d did not complete (slot rewritten or peer gone); asking again",
                         newest.method, newest.version)
                return True
        else:
            apply_weights(self.policy, newest)
            if self.device.type == "cuda":
                torch.cuda.synchronize()  # count the copy, not just its launch
        dt = time.perf_counter() - t_apply
        self.stats["apply_s"] += dt
        self.stats["weight_syncs"] += 1
        self.version = newest.version
        self.stats["weight_bytes"] += sum(newest.bucket_nbytes)
        if self.cfg.verify_weight_sync:  # after the apply's timing: not part of apply_s
            from grpo.weights.verify import fingerprint

            self.stats["verified_checksum"] = fingerprint(self.policy, compute_dtype(self.device))
            self.stats["verified_version"] = float(self.version)
        log.info("now running policy version %d (%.1f MB by %s applied in %.4f s)", self.version,
                 sum(newest.bucket_nbytes) / 1e6, newest.method, dt)
        return acknowledges(newest.method)   # the follow-up request acknowledges the version

    def _round_guard(self):
        return self.receiver.guard() if self.sync_method == M.SHARED else contextlib.nullcontext()

    def _use(self, method: str, dtype: torch.dtype) -> None:
        self.receiver = make_receiver(method, self.policy, dtype, self.cfg.sync_port, self.cfg.sync_timeout_s * 12)
        self.sync_method = method
        log.info("weight sync: %s (--weight-sync %s)", method, self.cfg.weight_sync)

    def _fall_back(self, why: str) -> None:
        """The current method proved impossible here: step down by the rule both sides share."""
        method = fallback(self.sync_method, self.cfg.weight_sync)
        log.warning("%s unavailable (%s); asking for weights by %s from now on%s", self.sync_method, why, method,
                    " (auto: the learner is on another host)" if method == M.NCCL else "")
        if method == M.TCP:
            self.sync_method = M.TCP
        else:
            self._use(method, compute_dtype(self.device))

    def maybe_evaluate(self) -> None:
        """Between rounds: evaluate the policy now running if its version is due (v0: the baseline)."""
        if self.eval_set is None or self.version == self._evaluated_at:
            return
        every = self.cfg.eval_every
        if self._evaluated_at >= 0 and self.version // every == self._evaluated_at // every:
            return
        result = greedy_accuracy(self.policy, self.tok, self.eval_set, self.cfg.max_new_tokens,
                                 self.cfg.eval_batch_size, self.device, engine=self.engine)
        self._evaluated_at = self.version
        record_eval(self.cfg.run_dir, self.version, result, by=f"sampler{self.cfg.sampler_id}")
        # Reported to the learner with the next status, which puts it in metrics.jsonl.
        self.stats.update(eval_version=float(self.version), eval_accuracy=result["accuracy"],
                          eval_seconds=result["seconds"])

    # ------------------------------------------------------------------ one round
    @torch.no_grad()
    def generate_round(self, round_idx: int, n_prompts: int | None = None) -> list[M.Group]:
        """One round as one fixed batch: every prompt's G rows decode until the longest ends."""
        cfg, tok = self.cfg, self.tok
        problems, prompts, prompt_ids = self._round_problems(n_prompts)
        G = cfg.num_generations
        t0 = time.perf_counter()
        rows = [p for p in prompt_ids for _ in range(G)]
        sampled_lp = None
        if self.engine is not None:
            out = self.engine.generate(rows, cfg.max_new_tokens, cfg.temperature, should_stop=self._stop_said)
            completions, sampled_lp = list(zip(out.token_ids, out.finished)), out.logprobs
        else:
            completions = list(zip(*hf_generate(self.policy, rows, cfg.max_new_tokens, cfg.temperature, False,
                                                self.eos_ids, tok.pad_token_id, should_stop=self._stop_said)))
        gen_s = time.perf_counter() - t0
        # Round 0 before the learner's first answer: the answer (the run's facts) before anything is scored or sent.
        if not self._first_answer() or self.inbox.stop is not None:
            return []   # cut short or abandoned: nothing of this round is scored, counted or sent
        return self._finish(round_idx, problems, prompts, prompt_ids, list(range(len(problems))), completions,
                            gen_s, sampled_lp)

    @torch.no_grad()
    def stream_round(self, round_idx: int, n_prompts: int):
        """One round through in-flight batching (--in-flight-rows): yields lists of finished groups,
        scored and with their log-probs, as soon as a learner step's worth has ended (or the round
        has), while the engine gives the rows their samples freed to the round's next samples.
        Weights do not change during a round, so every token of every group is sampled by self.version."""
        cfg = self.cfg
        problems, prompts, prompt_ids = self._round_problems(n_prompts)
        G = cfg.num_generations
        def chunk() -> int:   # (round 0 may learn the run's facts, and so the step's size, as it goes)
            return max(1, self.run_facts.groups_per_step if self.run_facts is not None
                       else cfg.prompts_per_round or FIRST_STEP_GROUPS)
        queue = iter(enumerate(prompt_ids))
        gis: list[int] = []
        completions: list[tuple[list[int], bool]] = []
        sampled_lp: list[np.ndarray] = []
        t0 = time.perf_counter()
        stream = self.engine.stream(lambda: next(queue, None), G, cfg.max_new_tokens, cfg.temperature,
                                    rows=cfg.in_flight_rows, should_stop=self._stop_said)
        for fg in itertools.chain(stream, [None]):   # None: the round has ended, send what is left
            if fg is not None:
                gis.append(fg.key)
                completions.extend(zip(fg.token_ids, fg.finished))
                sampled_lp.extend(fg.logprobs)
            # Round 0 before the learner's first answer: the answer is taken as soon as it has come,
            # and waited for before anything is finished (scored, sent) and at the round's end.
            if self._first_request is not None and (
                    fg is None or len(gis) >= chunk() or self.inbox.peek()):
                t_wait = time.perf_counter()
                if not self._first_answer():
                    return   # abandoned: nothing of this round was or is sent
                t0 += time.perf_counter() - t_wait   # (waiting is not generating)
            if fg is None and self.inbox.stop is not None:
                return   # cut short: the groups not yet sent are not scored, counted or sent
            if gis and (fg is None or len(gis) >= chunk()):
                yield self._finish(round_idx, problems, prompts, prompt_ids, gis, completions, time.perf_counter() - t0,
                                   sampled_lp)
                gis, completions, sampled_lp, t0 = [], [], [], time.perf_counter()

    def _round_problems(self, n_prompts: int | None):
        if n_prompts is None:
            n_prompts = self.cfg.prompts_per_round or self._first_round_prompts()
        problems = self.prompts.next_batch(n_prompts)
        prompts = [problem_prompt(self.tok, p) for p in problems]
        return problems, prompts, [self.tok(p, add_special_tokens=False)["input_ids"] for p in prompts]

    def _finish(self, round_idx: int, problems: list, prompts: list[str], prompt_ids: list[list[int]],
                gis: list[int], completions: list[tuple[list[int], bool]], gen_s: float,
                sampled_lp: list[np.ndarray] | None = None) -> list[M.Group]:
        """Groups gis of the round (G rows each, in `completions`): score, count for the curriculum,
        drop zero-signal ones (--filter-zero-signal), take or compute old (and compute reference)
        log-probs, build. sampled_lp: the engine's log-prob of each sampled token, per completion."""
        cfg, tok = self.cfg, self.tok
        G = cfg.num_generations
        whole = [prompt_ids[gis[k // G]] + c for k, (c, _) in enumerate(completions)]
        t1 = time.perf_counter()
        texts = [tok.decode(c, skip_special_tokens=True) for c, _ in completions]
        scores = self.rewards.score([problems[gis[k // G]] for k in range(len(completions))], texts,
                                    [c for c, _ in completions])
        if self.levels is not None:   # every group counts for its task, before any filter
            for j, gi in enumerate(gis):
                self.window.add(problems[gi].columns.get("rg_task", ""),
                                sum(sc.info.get("correct", 0.0) for sc in scores[j * G:(j + 1) * G]), G)
            self.stats.update(self.window.stats())
        # Scored before the log-prob passes, so that with --filter-zero-signal a group whose
        # rewards are all equal (zero advantage: the learner would drop it) costs no passes and
        # is not sent; it still counts as offered, and the learner's books see it as dropped.
        keep = [j for j in range(len(gis))
                if not cfg.filter_zero_signal or has_signal([sc.reward for sc in scores[j * G:(j + 1) * G]])]
        rows_kept = [k for j in keep for k in range(j * G, (j + 1) * G)]
        t2 = time.perf_counter()
        kept_whole = [whole[k] for k in rows_kept]
        kept_plens = [len(prompt_ids[gis[k // G]]) for k in rows_kept]
        if self.old_source == "sampling" and sampled_lp is not None:   # --old-logprobs: exact, or asked for
            old_lp = {k: sampled_lp[k] for k in rows_kept}
        else:
            old_lp = dict(zip(rows_kept, self._logprobs(self.policy, kept_whole, kept_plens)))
        if self.run_facts is None or self.run_facts.needs_ref_logprobs:
            if self.ref is None:
                self.ref = load_causal_lm(self._model_path, self.device, compute_dtype(self.device)).eval()
            ref_lp = dict(zip(rows_kept, self._logprobs(self.ref, kept_whole, kept_plens)))
        else:   # not needed: the reference pass is skipped and the group carries none
            ref_lp = {k: np.zeros(0, np.float32) for k in rows_kept}
        reward_s, logprob_s = t2 - t1, time.perf_counter() - t2   # (_logprobs ends in .cpu(): done by now)
        # A filtered group was offered and dropped here: both counts move together, so every status
        # (a heartbeat may read them at any moment) has sent >= what it says it dropped, and a round
        # filtered whole is counted although nothing of it reaches _send.
        self.groups_sent += len(gis) - len(keep)
        self.stats["dropped_zero_signal"] += len(gis) - len(keep)
        self._signal.append((len(keep), len(gis)))
        groups = []
        for j in keep:
            gi = gis[j]
            problem, prompt, pids = problems[gi], prompts[gi], prompt_ids[gi]
            comps = []
            for k in range(j * G, (j + 1) * G):
                gen_ids, finished = completions[k]
                text, scored = texts[k], scores[k]
                comps.append(M.Completion(
                    generated_token_ids=np.asarray(gen_ids, dtype=np.int32),
                    old_policy_log_probs=old_lp[k], ref_policy_log_probs=ref_lp[k],
                    whole_token_ids=np.asarray(whole[k], dtype=np.int32), text=text,
                    reward=float(scored.reward), reward_info=dict(scored.info), is_finished=finished))
            groups.append(M.Group(
                sampler_id=cfg.sampler_id, group_id=f"s{cfg.sampler_id}-r{round_idx}-g{gi}",
                policy_version=self.version, prefix=prompt,
                prefix_tokens=tok.convert_ids_to_tokens(pids), prefix_token_ids=np.asarray(pids, dtype=np.int32),
                completions=comps, meta={"answer": problem.answer.split("####")[-1].strip()[:64],
                                         **({"task": problem.columns["rg_task"]} if "rg_task" in problem.columns
                                            else {})},
                incarnation=self.incarnation))
        n_tokens = sum(len(c) for c, _ in completions)
        self.stats["samples"] += len(completions)
        self.stats["tokens"] += n_tokens
        self.stats["gen_s"] += gen_s
        self.stats["logprob_s"] += logprob_s
        self.stats["reward_s"] += reward_s
        if self.device.type == "cuda":
            # torch's peak counters cover the time since the last self.gpu.sample() (it resets them,
            # below): one round. The run's peak is the largest of them.
            self.stats["peak_mem_gb"] = max(self.stats["peak_mem_gb"], torch.cuda.max_memory_allocated(self.device) / 2**30)
            self.stats["peak_reserved_gb"] = max(self.stats["peak_reserved_gb"],
                                                 torch.cuda.max_memory_reserved(self.device) / 2**30)
        rewards = [sc.reward for sc in scores]   # every completion, filtered or not: the train reward
        dropped = (f", {len(gis) - len(keep)} of {len(gis)} groups zero-signal"
                   if cfg.filter_zero_signal else "")
        log.info("round %d (v%d): %d completions, %d tokens in %.2f s (%.0f tok/s); log-probs %.2f s, "
                 "rewards %.2f s; reward mean %.3f%s%s", round_idx, self.version, len(completions), n_tokens, gen_s,
                 n_tokens / max(gen_s, 1e-9), logprob_s, reward_s, float(np.mean(rewards)), dropped,
                 format_gpu(self.gpu.sample()))
        return groups

    @torch.no_grad()
    def _logprobs(self, model, whole: list[list[int]], prompt_lens: list[int]) -> list[np.ndarray]:
        """Per generated token log-probs from a teacher-forced pass, in micro-batches of
        similar lengths (sorted first, so each pads only to its own longest sequence)."""
        out: list[np.ndarray | None] = [None] * len(whole)
        order = sorted(range(len(whole)), key=lambda i: len(whole[i]))
        bs = self.cfg.logprob_batch_size
        for s in range(0, len(order), bs):
            idx = order[s:s + bs]
            ids, mask = right_pad([whole[i] for i in idx], self.tok.pad_token_id, self.device)
            lp = token_logprobs(model, ids, mask, self.cfg.temperature).cpu()   # [b, L-1]
            for j, i in enumerate(idx):
                p = prompt_lens[i]
                # token t (t >= p) is predicted at position t-1
                out[i] = lp[j, p - 1:len(whole[i]) - 1].numpy().astype(np.float32)
        return out

    # ------------------------------------------------------------------ main loop
    def _status(self, final: bool) -> M.SamplerStatus:
        return M.SamplerStatus(sampler_id=self.cfg.sampler_id, policy_version=self.version,
                               groups_sent=self.groups_sent, final=final,
                               stats={k: float(v) for k, v in list(self.stats.items())},
                               incarnation=self.incarnation)

    def _send(self, groups: list[M.Group]) -> None:
        # Groups filtered out as zero-signal were counted as offered by _finish already.
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

    @property
    def _where(self) -> str:
        return f"{self.cfg.host}:{self.cfg.data_port}"

    def run(self) -> dict:
        rounds = 0
        t_start = time.perf_counter()
        bar = Progress(f"sampler{self.cfg.sampler_id} rounds", total=self.cfg.max_rounds or None, unit="round")
        self.heartbeat.start()
        try:
            while True:
                with self.profiler.around(rounds):
                    # shared: we read the learner's live weights, so it must not step during a round
                    # (sync, evaluation, generation, old log-probs); sending needs no lock.
                    with self._round_guard():
                        if not self.sync_weights() or (self.cfg.max_rounds and rounds >= self.cfg.max_rounds):
                            break
                        # Round 0 generated before the learner's first answer (sync_weights): version 0's
                        # evaluation waits until the round is out, for only then is it known that the
                        # learner is at version 0 (a resumed one is not: round 0 is then generated again).
                        early = self._first_request is not None
                        n = self._round_prompts()
                        groups = []
                        if n:
                            if not early:
                                self.maybe_evaluate()
                            if self.cfg.in_flight_rows:
                                # Each chunk leaves as soon as it is complete, inside the guard (with
                                # shared weights the learner waits for the round either way).
                                for chunk in self.stream_round(rounds, n):
                                    self._send(chunk)
                            else:
                                groups = self.generate_round(rounds, n)
                    if (stop := self.inbox.stop) is not None:
                        log.info("learner says stop (%s) at version %d, in the middle of round %d: the round is "
                                 "abandoned (what of it was not sent is not counted)", stop.reason, stop.version,
                                 rounds)
                        break
                    if self._held is not None:   # round 0 abandoned: the learner is past version 0 (_first_answer)
                        continue
                    if not n:   # outside the round guard: with shared weights the learner must go on
                        self._wait_for_room()
                        continue
                    self._send(groups)
                    if early:   # version 0's evaluation, put off above (the weights have not changed since)
                        with self._round_guard():
                            self.maybe_evaluate()
                    rounds += 1
                    self.stats["rounds"] = rounds
                    bar.update(1, version=self.version)
                    self.send_status(final=False)
            self.heartbeat.stop()  # no heartbeat may follow the final status
            self.send_status(final=True)
        except (AnswersRejected, RunMismatch):
            # What was sent stays sent: the final status closes this sampler's books at the learner
            # (its data port still works), then the one line ends the process. A sampler that never
            # agreed with a learner sends nothing (a mismatch in the first answer).
            self.heartbeat.stop()
            if self.run_facts is not None:
                self.send_status(final=True)
            raise
        finally:
            bar.close()
            self.heartbeat.stop()
            elapsed = time.perf_counter() - t_start
            log.info("sampler %d done: %d rounds, %d groups sent, %.1f samples/s, %.2f MB sent, "
                     "last version %d", self.cfg.sampler_id, rounds, self.groups_sent,
                     self.stats["samples"] / max(elapsed, 1e-9), self.data.bytes_sent / 1e6, self.version)
            self.data.close()  # LINGER lets queued groups reach the learner
            self.sync.close()
        return {"rounds": rounds, "groups_sent": self.groups_sent, "version": self.version,
                "config": asdict(self.cfg), **self.stats}
