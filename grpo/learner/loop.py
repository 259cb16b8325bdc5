"""The learner: rank 0 receives groups, every rank trains on its shard, rank 0 publishes weights.

One step:
  rank 0   collect train_batch_size/G fresh groups (grpo.learner.intake: stale ones dropped and counted)
  all      broadcast the batch; each rank keeps its token-balanced shard      (sync point)
  all      grpo.learner.step: micro-steps of forward + GRPO loss + backward (ZeRO-2 reduces grads),
           packed by tokens; optimizer step; the step's figures reduced by name; policy version = step count
  rank 0   snapshot the weights for the samplers; write metrics.jsonl
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from grpo.config import LearnerConfig, micro_token_budget, resolve_precision
from grpo.data.tasks import Curriculum
from grpo.generate.backend import resolve_backend
from grpo.learner.accounting import Books, MessageLedger, balance
from grpo.learner.batch import broadcast_batch, build_batch
from grpo.learner.checkpoint import (Checkpointer, TimedWeights, load_checkpoint, parse_save_schedule,
                                    resolve_resume)
from grpo.learner.engine import (CommunicatorWarmup, DeepSpeedEngine, TorchEngine, clear_build_locks, load_ds_config,
                                 resolve_ds_config)
from grpo.learner.intake import Intake
from grpo.learner.liveness import Liveness, SyncPeers
from grpo.learner.step import TrainStep
from grpo.learner.warmup import warm_up, warm_up_shape
from grpo.loss import LossConfig
from grpo.model import (compute_dtype, load_causal_lm, load_tokenizer, pick_device, resolve_model, start_runtime,
                        weights_checksum)
from grpo.obs.gpu import GpuMonitor, format_gpu, release_cached
from grpo.obs.metrics import MetricsWriter
from grpo.obs.profile import SpanProfiler
from grpo.obs.progress import Progress
from grpo.obs.rundir import make_run_dir, provenance
from grpo.obs.stages import first_step_s, history as stage_history, mark as mark_stage
from grpo.obs.tracking import Tracker, parse_report_to
from grpo.stats import ZERO_SIGNAL_ALARM_GROUPS, group_stats, zero_signal_alarm
from grpo.sync.answer import QueueView, SyncAnswer
from grpo.weights import make_publisher
from grpo.weights.methods import check_method
from grpo.wire import messages as M
from grpo.wire.curve import SERVER, curve_for, warn_if_exposed
from grpo.wire.transport import DataReceiver, SyncServer, free_port

log = logging.getLogger(__name__)


def check_loss_options(cfg: LearnerConfig) -> None:
    """Reject bad algorithm options with one line, before anything is loaded."""
    LossConfig.of(cfg).check()
    if cfg.ppo_minibatches < 1 or cfg.ppo_minibatches > cfg.train_batch_size // max(cfg.num_generations, 1):
        raise ValueError(f"--ppo-minibatches {cfg.ppo_minibatches}: must be between 1 and the groups per step "
                         f"(--train-batch-size / --num-generations = "
                         f"{cfg.train_batch_size // max(cfg.num_generations, 1)})")
    parse_report_to(cfg.report_to)


class Learner:
    def __init__(self, cfg: LearnerConfig):
        self.t_created = time.time()   # --save-weights-every-s counts from here
        self.cfg = cfg
        check_loss_options(cfg)
        if cfg.save_weights_every_s < 0 or (cfg.save_weights_every_s and cfg.lora_r):
            raise ValueError(f"--save-weights-every-s {cfg.save_weights_every_s}: must be >= 0 and needs full "
                             f"fine-tuning (with --lora-r the adapter is saved at the end); drop one of them")
        if cfg.save_weights_schedule:
            if not cfg.save_weights_every_s:
                raise ValueError("--save-weights-schedule needs --save-weights-every-s > 0 (which turns the saves on)")
            parse_save_schedule(cfg.save_weights_schedule)   # a bad spec fails here, before the model loads
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.profiler = SpanProfiler(cfg.profile_steps, cfg.run_dir, f"learner{self.rank}")   # a bad span fails now
        if cfg.no_deepspeed and self.world > 1:
            raise ValueError("--no-deepspeed runs one process; drop it or start a single rank")
        local = int(os.environ.get("LOCAL_RANK", "0"))
        t_device = time.perf_counter()   # on CUDA: torch's CUDA initialisation
        self.device = pick_device(cfg.device, cfg.gpu_id if cfg.gpu_id >= 0 else (local if cfg.device != "cpu" else -1))
        t_device = time.perf_counter() - t_device
        self.precision = resolve_precision(cfg.precision, self.device.type == "cuda", bool(cfg.lora_r),
                                           not cfg.no_deepspeed)
        check_method(cfg.weight_sync, self.device, bool(cfg.lora_r), self.precision == "bf16")
        resolve_backend(cfg.generation_backend, self.device)   # a bad name fails now, not after training
        self.curriculum = (Curriculum(cfg.dataset, cfg.curriculum_low, cfg.curriculum_high, cfg.curriculum_window)
                           if cfg.curriculum else None)   # a bad --dataset or threshold fails here, before loading
        self.run_dir = make_run_dir(cfg.run_dir)
        raw_ds = load_ds_config(cfg.deepspeed_config)
        self.ds_config, self.batch_size = resolve_ds_config(
            raw_ds, self.world, cfg.train_batch_size, cfg.num_generations, cfg.learning_rate,
            cuda=self.device.type == "cuda", source=cfg.deepspeed_config, precision=self.precision,
            token_micro_batches=cfg.micro_batch_tokens != -1)
        # --micro-batch-tokens: padded tokens per micro-batch (0 when off: gas fixed micro-batches)
        self.micro_tokens = micro_token_budget(cfg.micro_batch_tokens, self.ds_config["train_micro_batch_size_per_gpu"],
                                               cfg.max_prompt_tokens, cfg.max_new_tokens)
        self.groups_per_step = self.batch_size // cfg.num_generations

        path = resolve_model(cfg.model)  # a bad --model fails here, before ports or weights
        resume_dir = resolve_resume(cfg.resume, self.run_dir, cfg.max_steps)  # so does a bad --resume
        # Rank 0 binds both ports before loading the model, so samplers can connect and
        # queue while it loads; the ready file tells the launcher the ports are bound.
        self.receiver = self.server = None
        self.liveness = Liveness(cfg.heartbeat_timeout_s, cfg.max_samplers)
        self.books = Books(max_entries=4 * cfg.max_samplers)
        self.messages = MessageLedger(max_keys=16 * cfg.max_samplers)
        if self.rank == 0:
            curve = curve_for(cfg.curve_keys, SERVER)
            bind = cfg.bind_host or cfg.host  # loopback unless a flag says otherwise
            warn_if_exposed(bind, curve)
            self.server = SyncServer(bind, cfg.sync_port, curve=curve)
            self.receiver = DataReceiver(bind, cfg.data_port, M.Limits(group_size=cfg.num_generations),
                                         max_message_bytes=cfg.max_message_mb << 20, curve=curve)
            (self.run_dir / "learner.ready").write_text(json.dumps(
                {"host": cfg.host, "data_port": cfg.data_port, "sync_port": cfg.sync_port, "pid": os.getpid()}))
            log.info("learner bound data %s:%d and sync %s:%d%s; run dir %s", bind, cfg.data_port,
                     bind, cfg.sync_port, " (CURVE)" if curve else "", self.run_dir)
            mark_stage(self.run_dir, "learner0", "bound")

        t_dist = time.perf_counter()
        if not cfg.no_deepspeed:
            import deepspeed

            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(free_port()))
            os.environ.setdefault("RANK", "0")
            os.environ.setdefault("WORLD_SIZE", "1")
            os.environ.setdefault("LOCAL_RANK", str(self.device.index or 0))
            clear_build_locks()   # a build lock left by a stopped process would hang init silently
            deepspeed.init_distributed(dist_backend="nccl" if self.device.type == "cuda" else "gloo",
                                       timeout=timedelta(seconds=cfg.dist_timeout_s))
            comm_warmup = CommunicatorWarmup(self.device, cfg.dist_timeout_s)   # beside the model's loading
        t_model = time.perf_counter()
        load_times: dict[str, float] = {}   # the parts of 'model' in the start-up line
        start_runtime(self.device, load_times, cfg.cudnn_attention)
        t_tok = time.perf_counter()
        self.tok = load_tokenizer(path)
        load_times["tokenizer"] = time.perf_counter() - t_tok
        # bf16: DeepSpeed keeps fp32 master weights in its optimizer, so the module can be bf16.
        # autocast (and plain AdamW, which has no master copies): fp32 weights, bf16 matmuls.
        dtype = compute_dtype(self.device) if self.precision == "bf16" else torch.float32
        model = load_causal_lm(path, self.device, dtype, times=load_times)
        model.config.use_cache = False
        if cfg.lora_r:
            from grpo.learner.lora import wrap_lora  # peft is imported only in LoRA mode

            model = wrap_lora(model, cfg.lora_r, cfg.lora_alpha, cfg.lora_target_modules, cfg.lora_dropout)
        self.vocab_size = model.get_input_embeddings().weight.shape[0]
        if self.receiver is not None:
            self.receiver.limits = M.Limits(group_size=cfg.num_generations, vocab_size=self.vocab_size)
        t_engine = time.perf_counter()
        comm_s = None if cfg.no_deepspeed else comm_warmup.wait()
        self.engine = (TorchEngine(model, self.ds_config, self.device) if cfg.no_deepspeed
                       else DeepSpeedEngine(model, self.ds_config))
        log.info("start-up: device %.1f s, DeepSpeed import and process group %.1f s, model %.1f s (%s), optimizer "
                 "engine %.1f s%s", t_device, t_model - t_dist, t_engine - t_model,
                 ", ".join(f"{k} {v:.1f} s" for k, v in load_times.items()), time.perf_counter() - t_engine,
                 "" if comm_s is None else f" (the communicator's first collective: {comm_s:.2f} s, beside the model)")
        mark_stage(self.run_dir, f"learner{self.rank}", "engine_ready")
        self.autocast = self.precision == "autocast"
        log.info("precision %s: %s", self.precision,
                 {"autocast": "float32 weights and optimizer state, bf16 matmuls under torch.autocast",
                  "bf16": "bf16 weights, fp32 master copies in DeepSpeed's optimizer",
                  "fp32": "float32 throughout"}[self.precision])
        run = M.RunFacts(schema=M.SCHEMA_VERSION, model=cfg.model, vocab_size=self.vocab_size,
                         dtype=str(compute_dtype(self.device)).removeprefix("torch."),
                         num_generations=cfg.num_generations, max_new_tokens=cfg.max_new_tokens,
                         max_prompt_tokens=cfg.max_prompt_tokens, temperature=cfg.temperature,
                         needs_ref_logprobs=cfg.beta > 0, max_staleness=cfg.max_staleness,
                         groups_per_step=self.groups_per_step)
        # The control fields of every answer on the sync port (facts, levels, budget): rank 0's publisher asks it.
        self.answers = SyncAnswer(run)
        self.publisher = (make_publisher(cfg.weight_sync, self.server, self.engine.module, self.device,
                                         compute_dtype(self.device), cfg.host, cfg.sync_port,
                                         cfg.ipc_ack_timeout_s, cfg.nccl_timeout_s, self.answers)
                          if self.rank == 0 else None)
        if self.publisher is not None:
            self.publisher.peers = SyncPeers(self.liveness, max_peers=4 * cfg.max_samplers)
            self.publisher.on_reject = self._sync_rejected
            if self.curriculum is not None:
                self.answers.levels = dict(self.curriculum.levels)
            self.server.on_reject = lambda exc, peer: self._sync_rejected(exc.reason, peer)
        self.fingerprints = None
        if cfg.verify_weight_sync and self.rank == 0:
            if cfg.lora_r:  # samplers get merged weights, not the module's: nothing to compare
                log.warning("--verify-weight-sync is not supported with LoRA; not verifying")
            else:
                from grpo.weights.verify import PublishedFingerprints

                self.fingerprints = PublishedFingerprints()
        self.metrics = MetricsWriter(self.run_dir) if self.rank == 0 else None
        self.tracker = Tracker(self.run_dir, cfg.report_to, dataclasses.asdict(cfg)) if self.rank == 0 else None
        self._zero_signal_mark = (0, 0)   # the books' (sent, zero-signal) when the alarm last looked
        self.gpu = GpuMonitor(self.device)
        self.version = 0
        self.checkpointer = Checkpointer(self.run_dir, cfg.save_every, cfg.keep_checkpoints, self.rank, self.world)
        self.timed_weights = TimedWeights(self.run_dir / "weights", cfg.save_weights_every_s, self.t_created,
                                          cfg.save_weights_schedule)
        if resume_dir is not None:
            t_load = time.perf_counter()
            self.resumed = load_checkpoint(self.engine, resume_dir, self.rank, self.world)
            self.version = self.checkpointer.last_saved = int(self.resumed["step"])
            log.info("resumed from %s in %.2f s: continuing at step %d", resume_dir,
                     time.perf_counter() - t_load, self.version + 1)
        if self.publisher is not None:
            # The starting version (0, or the resumed one) is published before any step: a client
            # with no weights (have_version -1) gets them, and resumed samplers get the resumed ones.
            self.publisher.publish(self.version, self.engine.module)
            if self.fingerprints is not None:
                self.fingerprints.record(self.version, self.engine.module, compute_dtype(self.device))
            mark_stage(self.run_dir, "learner0", "weights_published")
        release_cached(self.device)   # what start-up cached, for the other process on this GPU
        self.intake = (Intake(cfg, self.receiver, self.liveness, self.books, self.messages, self.fingerprints)
                       if self.rank == 0 else None)
        if self.publisher is not None:   # each answer tells its sampler how much it may generate
            self.answers.queue_view = QueueView(queued=lambda: len(self.intake.queue),
                                                received=lambda sid: self.intake.received_by.get(sid, 0),
                                                samplers=lambda: max(1, self.liveness.count_alive()),
                                                training=lambda: self.intake.taken)
        if resume_dir is not None and self.rank == 0:
            lost = self.books.restore(self.resumed.get("books", []), self.resumed.get("groups", {}),
                                      self.intake.counts)
            self.messages.restore(self.resumed.get("messages", []))
            log.info("books carried over from step %d (%d groups queued then are lost with the old learner)",
                     self.version, lost)
        self.version_at_start = self.version
        self.step = TrainStep(cfg, self.engine, self.tok.pad_token_id, self.device, self.rank, self.world,
                              self.micro_tokens, self.autocast)
        log.info("learner rank %d/%d on %s: batch %d completions (%d groups of %d) per step, %s",
                 self.rank, self.world, self.device, self.batch_size, self.groups_per_step,
                 cfg.num_generations, f"micro-batches of at most {self.micro_tokens} padded tokens"
                 if self.micro_tokens else f"gas {self.engine.gas}")

    def _sync_rejected(self, reason: str, peer: bytes | None) -> None:
        """A refused message on the sync port (the publisher's thread): the message ledger only."""
        sid = self.publisher.peers.bound(peer) if peer is not None and self.publisher.peers else None
        self.messages.reject("sync", reason, None if sid is None else str(sid))

    # ------------------------------------------------------------------ main loop
    def run(self) -> dict:
        if self.cfg.warm_up and self.device.type == "cuda":
            # Round 0 is still being generated (3-4 s on an H200): the first step's one-time costs go here.
            rows, length = warm_up_shape(min(self.ds_config["train_micro_batch_size_per_gpu"],
                                             -(-self.batch_size // self.world)),
                                         self.cfg.max_prompt_tokens, self.cfg.max_new_tokens)
            dt = warm_up(self.engine.module, self.vocab_size, rows, length, self.device, self.step.amp(),
                         self.cfg.temperature)
            log.info("warm-up pass (%d x %d made-up tokens, forward and backward, no update): %.2f s", rows, length,
                     dt)
        t_start = time.perf_counter()
        trained_samples = 0
        bar = (Progress("learner steps", total=self.cfg.max_steps - self.version, unit="step")
               if self.rank == 0 else None)
        for step in range(self.version + 1, self.cfg.max_steps + 1):
            with self.profiler.around(step):
                t0 = time.perf_counter()
                batch = groups = None
                if self.rank == 0:
                    left = (self.cfg.max_time_s - (t0 - t_start)) if self.cfg.max_time_s else None
                    groups = self.intake.collect(self.groups_per_step, self.version, within_s=left)
                    batch = build_batch(groups, self.cfg.num_generations, self.cfg.scale_rewards) if groups else None
                t_data = time.perf_counter()
                # Rank 0 out of time before a step's data came: every rank leaves the loop together.
                batch, out_of_time = broadcast_batch(batch, self.rank == 0 and batch is None, self.device)
                if out_of_time:
                    # The time ran out between steps: the last trained step is the run's last, so it is
                    # saved as such (every rank: a checkpoint is collective), as a step that ends on
                    # the clock is; the final evaluation then scores the weights of the last save.
                    self._save_due(self.version, last=True)
                    break
                # shared: the sampler reads these very weights; it waits while we step and publish.
                with self.publisher.guard() if self.rank == 0 else contextlib.nullcontext():
                    stats = self.step(batch)
                    self.version = step
                    t_train = time.perf_counter()
                    stall = self.publisher.publish(self.version, self.engine.module) if self.rank == 0 else 0.0
                    if self.fingerprints is not None:
                        self.fingerprints.record(self.version, self.engine.module, compute_dtype(self.device))
                if step == self.version_at_start + 1:
                    mark_stage(self.run_dir, f"learner{self.rank}", "first_step")
                if self.rank == 0:
                    self.intake.taken = 0   # the step is trained and its version published
                    self.intake.counts["trained"] += len(groups)
                    trained_samples += batch.size
                    self._curriculum_step(step)
                    self._log_step(step, groups, batch, stats, t0, t_data, t_train, stall, trained_samples, t_start)
                    bar.update(1, loss=stats["loss"], reward=float(batch.scalars[:, 1].mean()))
                elif gpu := self.gpu.sample():  # other ranks: their own GPU use, one line per step
                    log.info("step %d%s", step, format_gpu(gpu))
                time_up = bool(self.cfg.max_time_s) and self._time_up(t_start)
                self._save_due(step, last=step == self.cfg.max_steps or time_up)
                if time_up:
                    break
        if bar is not None:
            bar.close()
        broadcast_batch(None, True, self.device)
        checksums = self._rank_checksums()
        if self.rank == 0:
            if self.cfg.lora_r:
                from grpo.learner.lora import save_adapter

                log.info("LoRA adapter saved to %s", save_adapter(self.engine.module, self.run_dir / "lora_adapter"))
            self.publisher.stop_samplers()   # they stop at their next sync while we evaluate
            final_eval = self._final_eval() if self.cfg.eval_every > 0 else None
            return self.shutdown(time.perf_counter() - t_start, checksums, final_eval)
        return {}

    def _save_due(self, step: int, last: bool) -> None:
        """The checkpoint (every rank) and the timed weights (rank 0) due after `step`; none before the first."""
        if step <= self.version_at_start:
            return
        if self.checkpointer.due(step, last=last):
            self.checkpointer.save(self.engine, self.tok, step, self._checkpoint_extra())
        if self.rank == 0 and self.timed_weights.due(time.time(), last=last):
            # in the samplers' dtype: what they generate with is what gets scored (autocast's
            # float32 weights would double the bytes written while the learner waits)
            self.timed_weights.save(self.engine.module, self.tok, step, dtype=compute_dtype(self.device))

    def _curriculum_step(self, step: int) -> None:
        """--curriculum: move task levels on the samplers' latest reports; tell the samplers."""
        if self.curriculum is None:
            return
        reports = [e.status.stats for e in self.books.latest().values() if e.status is not None]
        for c in self.curriculum.update(reports, step):
            log.info("curriculum: %s level %d -> %d after step %d (success rate %.3f over %d groups)",
                     c["task"], c["from"], c["to"], step, c["rate"], c["groups"])
        self.answers.levels = dict(self.curriculum.levels)   # a new map: the sync thread reads it

    def _final_eval(self) -> dict:
        """Greedy pass@1 of the final weights, on rank 0 after training (nothing left to stall)."""
        from grpo.evaluate import evaluate_module, record_eval

        result = evaluate_module(self.engine.module, self.tok, self.cfg, self.device, self.autocast)
        record_eval(str(self.run_dir), self.version, result, by="learner")
        return {"version": self.version, **result}

    def _sampler_busy(self, elapsed: float) -> dict[str, float]:
        """Each sampler's busy seconds (generating, log-prob passes, scoring) over `elapsed`, at most 1:
        its counts start with its own process, a little before the learner's loop."""
        out = {}
        for sid, e in self.books.latest().items():
            stats = e.status.stats if e.status is not None else {}
            busy = sum(float(stats.get(k, 0.0)) for k in ("gen_s", "logprob_s", "reward_s"))
            out[str(sid)] = round(min(1.0, busy / elapsed), 3) if elapsed > 0 else 0.0
        return out

    def _time_up(self, t_start: float) -> bool:
        """--max-time-s reached? Rank 0's clock decides for all, so every rank leaves the loop together."""
        flag = torch.tensor([float(time.perf_counter() - t_start >= self.cfg.max_time_s)], device=self.device)
        if dist.is_initialized() and self.world > 1:
            dist.broadcast(flag, 0)
        if flag.item() and self.rank == 0:
            log.info("--max-time-s %.0f reached after step %d", self.cfg.max_time_s, self.version)
        return bool(flag.item())

    def _rank_checksums(self) -> list[str]:
        """Every rank's fingerprint of its full (bf16 on GPU) module weights: ZeRO-2 must keep them equal."""
        mine = weights_checksum(self.engine.module)
        if not (dist.is_initialized() and self.world > 1):
            return [mine]
        t = torch.tensor([int(mine, 16)], dtype=torch.int64, device=self.device)
        parts = [torch.empty_like(t) for _ in range(self.world)]
        dist.all_gather(parts, t)
        return [f"{int(p.item()):016x}" for p in parts]

    def _log_step(self, step, groups, batch, stats, t0, t_data, t_train, stall, trained_samples, t_start) -> None:
        rewards = batch.scalars[:, 1]
        now = time.perf_counter()
        rec = {"step": step, "policy_version": self.version, **stats,
               "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()) if batch.size > 1 else 0.0,
               "completion_len_mean": float(batch.meta[:, 1].float().mean()),
               "step_time_s": now - t0, "data_wait_s": t_data - t0, "train_s": t_train - t_data,
               # each role's busy share: the learner's of this step; each sampler's since the loop began
               # (generation, log-prob passes, scoring), from its latest status
               "learner_busy_share": (t_train - t_data) / (now - t0) if now > t0 else 0.0,
               "sampler_busy_share": self._sampler_busy(now - t_start),
               "sync_publish_s": stall, "samples_per_s": trained_samples / (now - t_start),
               "groups": self.intake.accounting(), "sampler_versions": dict(self.publisher.sampler_versions),
               "eval": self._latest_eval(), "sync_method": self.publisher.method,
               "samplers_alive": len(self.intake.alive(self.version)), "samplers_gone": len(self.liveness.gone),
               "sync_bytes_served": self.publisher.bytes_served, "data_bytes_received": self.receiver.bytes,
               "time_s": now - t_start, **group_stats(groups, self.version)}
        if self.curriculum is not None:
            rec.update({f"curriculum/{t}": lv for t, lv in self.curriculum.levels.items()})
            rec["curriculum_changes"] = [c for c in self.curriculum.changes if c["step"] == step]
        if gpu := self.gpu.sample():
            rec["gpu"] = gpu
        if alarm := self._zero_signal_alarm(rec["groups"]):
            rec["zero_signal_alarm"] = alarm
            log.warning("learner: %s", alarm)
        self.metrics.write(rec)
        self.tracker.log(rec, step)
        log.info("step %d v%d: loss %.4f reward %.3f acc %.3f kl %s clip %.3f | %d tok, %.2f s "
                 "(wait %.2f, train %.2f, publish %.3f) | %.1f samples/s | samplers at %s | groups %s | "
                 "%d msgs / %.1f MB in, %.1f MB weights out%s",
                 step, self.version, stats["loss"], rec["reward_mean"], rec["accuracy"],
                 "-" if stats["kl"] is None else f"{stats['kl']:.4f}",
                 stats["clip_frac"], stats["tokens"], rec["step_time_s"], rec["data_wait_s"], rec["train_s"],
                 stall, rec["samples_per_s"], rec["sampler_versions"], rec["groups"], self.receiver.messages,
                 self.receiver.bytes / 1e6, self.publisher.bytes_served / 1e6, format_gpu(gpu))

    def _zero_signal_alarm(self, books: dict) -> str | None:
        """grpo.stats.zero_signal_alarm over the groups sent since the last look; the look moves
        on once it has seen enough groups to judge, so a spinning run is named about once every
        ZERO_SIGNAL_ALARM_GROUPS groups, not at every step."""
        sent, zero = int(books.get("sent") or 0), int(books.get("dropped", {}).get("sampler_zero_signal", 0))
        sent0, zero0 = self._zero_signal_mark
        if sent < sent0 or zero < zero0:   # books restored from a checkpoint: start again
            self._zero_signal_mark, sent0, zero0 = (sent, zero), sent, zero
        if sent - sent0 < ZERO_SIGNAL_ALARM_GROUPS:
            return None
        self._zero_signal_mark = (sent, zero)
        return zero_signal_alarm(sent - sent0, zero - zero0)

    def _latest_eval(self) -> dict | None:
        """The newest evaluation a sampler has reported (version, greedy pass@1), if any."""
        evals = [e.status.stats for e in self.books.latest().values()
                 if e.status is not None and e.status.stats.get("eval_version", -1) >= 0]
        if not evals:
            return None
        best = max(evals, key=lambda st: st["eval_version"])
        return {"version": int(best["eval_version"]), "accuracy": best["eval_accuracy"]}

    def _checkpoint_extra(self) -> dict:
        """What rank 0 records beside the weights: the samplers' last reported position, counts."""
        if self.rank != 0:
            return {}
        return {"samplers": {i: {"version": e.status.policy_version, "groups_sent": e.status.groups_sent,
                                 "rounds": int(e.status.stats.get("rounds", 0))}
                             for i, e in self.books.latest().items() if e.status is not None},
                "groups": self.intake.accounting(), "books": self.books.dump(), "messages": self.messages.dump(),
                "seed": self.cfg.seed}

    def shutdown(self, elapsed: float, checksums: list[str] | None = None, final_eval: dict | None = None) -> dict:
        """Tell samplers to stop, wait for their final status, and account for every group."""
        self.publisher.stop_samplers()
        log.info("finished %d steps; stopping samplers %s (waiting up to %.0f s for their final status; "
                 "gone ones are not waited for)", self.version, sorted(self.intake.alive(self.version)),
                 self.cfg.shutdown_timeout_s)
        self.intake.wait_for_finals(self.cfg.shutdown_timeout_s, self.version)
        acc = self.intake.accounting()
        books_say = balance(acc, self.books, self.messages)   # names what a gap is, if there is one
        stages = stage_history(self.run_dir)
        latest = self.books.latest()
        missing = sorted(i for i, e in latest.items() if not e.final)
        dropped_total = sum(acc["dropped"].values())
        summary = {"steps": self.version, "optimizer_updates": self.engine.updates, "elapsed_s": elapsed,
                   "groups": acc, "balance": books_say,
                   "stages": stages, "first_step_s": first_step_s(stages, os.getpid()),
                   "samplers": {i: {"version": e.status.policy_version, "groups_sent": e.status.groups_sent,
                                    "final": e.final, "stats": e.status.stats}
                                for i, e in sorted(latest.items()) if e.status is not None},
                   "incarnations": self.books.report(), "liveness": self.liveness.snapshot(),
                   "samplers_without_final_status": missing,
                   "sync": {"bytes_served": self.publisher.bytes_served, **self.publisher.replies},
                   "messages": self.messages.report(self.books),
                   "final_eval": final_eval,
                   "curriculum": ({"levels": dict(self.curriculum.levels), "changes": self.curriculum.changes}
                                  if self.curriculum is not None else None),
                   "weight_sync_verified": self.fingerprints.report() if self.fingerprints is not None else None,
                   "rank_weight_checksums": checksums or [],
                   "ranks_identical": len(set(checksums or [])) == 1,
                   "peak_mem_gb": (torch.cuda.max_memory_allocated(self.device) / 2**30
                                   if self.device.type == "cuda" else None)}
        if self.cfg.lora_r:
            from grpo.learner.lora import lora_stats

            summary["lora"] = lora_stats(self.engine)
        (self.run_dir / "summary.json").write_text(json.dumps({**summary, **provenance()}, indent=2) + "\n")
        self.metrics.write({"final": True, **summary})
        log.info("accounting: sent %d = trained %d + dropped %d %s + queued %d -> %s%s", acc["sent"],
                 acc["trained"], dropped_total, acc["dropped"], acc["queued"], books_say["text"],
                 f" (no final status from samplers {missing})" if missing else "")
        self.publisher.close()
        self.receiver.close()
        self.metrics.close()
        self.tracker.close()
        with contextlib.suppress(FileNotFoundError):
            (self.run_dir / "learner.ready").unlink()
        return summary
