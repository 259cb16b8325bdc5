"""The learner's loop: rank 0 receives groups, every rank trains on its shard, rank 0 publishes weights.

One step:
  rank 0   receive: collect train_batch_size/G fresh groups (grpo.learner.intake: stale ones dropped and counted)
  all      broadcast the batch; each rank keeps its token-balanced shard      (sync point)
  all      train: grpo.learner.step (micro-steps of forward + GRPO loss + backward, ZeRO-2 reduces
           grads; optimizer step; the step's figures reduced by name); policy version = step count
  rank 0   publish: snapshot the weights for the samplers; write metrics.jsonl
  all      the checkpoint and timed weights due; at the end, rank 0's evaluation and summary.json
grpo.learner.setup builds what this runs (ports, process group, model, engine, publisher, intake).
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import time

import torch
import torch.distributed as dist

from grpo.config import LearnerConfig
from grpo.data.faults import reported_failures
from grpo.evaluate import evaluate_module, record_eval
from grpo.learner.accounting import balance
from grpo.learner.batch import Batch, broadcast_batch, build_batch
from grpo.learner.checkpoint import list_checkpoints
from grpo.learner.lora import lora_stats, save_adapter
from grpo.learner.setup import build
from grpo.learner.stop import StopRequest
from grpo.learner.warmup import warm_up, warm_up_shape
from grpo.model.load import compute_dtype, weights_checksum
from grpo.obs.gpu import format_gpu
from grpo.obs.progress import Progress
from grpo.obs.rundir import provenance
from grpo.obs.stages import first_step_s, history as stage_history, mark as mark_stage
from grpo.rules.staleness import staleness_advice
from grpo.stats import (ZERO_SIGNAL_ALARM_GROUPS, bf16_peak_share, bf16_peak_tflops, both_busy_share, busy_rate,
                        group_stats, sampler_busy_s, zero_signal_alarm)

log = logging.getLogger(__name__)


class Learner:
    """One learner rank: built by grpo.learner.setup.build, run by run() until --max-steps or
    --max-time-s; rank 0 then evaluates and writes summary.json."""

    def __init__(self, cfg: LearnerConfig, import_s: float | None = None):
        self.cfg = cfg
        # every part, built and wired (grpo.learner.setup); resumed with --resume (`import_s`: the
        # seconds its worker took to import it, grpo.workers, in the start-up line)
        self.parts = build(cfg, import_s)
        self.rank = self.parts.rank
        self.version = self.version_at_start = self.parts.version   # policy version = optimizer steps taken
        if self.parts.intake is not None:   # rank 0
            self.parts.intake.start_version = self.version_at_start
        self.stop = StopRequest()   # Ctrl+C / SIGTERM: rank 0 reads it (grpo.learner.stop)
        self.ended_by = "max_steps"   # rank 0: what ended the loop (max_steps, max_time_s, SIGINT, SIGTERM)
        self._zero_signal_mark = (0, 0)   # the books' (sent, zero-signal) when the alarm last looked
        # per sampler: its status's (clock_s, busy s) at the last step's record, and its busy rate then
        self._busy_seen: dict[str, tuple[tuple[float, float], float | None]] = {}
        # what a step's share of the GPUs' bf16 peak is computed from (grpo.stats.bf16_peak_share)
        self._params = sum(q.numel() for q in self.parts.engine.module.parameters())
        self._peak = (bf16_peak_tflops(torch.cuda.get_device_name(self.parts.device))
                      if self.parts.device.type == "cuda" else None)

    def run(self) -> dict:
        p, cfg = self.parts, self.cfg
        # From here on a stop keeps the work (grpo.learner.stop); before, there is none to keep and
        # the signal's default action ends the process.
        self.stop.install()
        self._warm_up()
        t_start = time.perf_counter()
        if p.time_limit is not None:
            p.time_limit.start(t_start)
        trained_samples = 0
        bar = Progress("learner steps", total=cfg.training.max_steps - self.version,
                       unit="step") if self.rank == 0 else None
        for step in range(self.version + 1, cfg.training.max_steps + 1):
            with p.profiler.around(step):
                t0 = time.perf_counter()
                groups, batch = self._receive(t0 - t_start) if self.rank == 0 else (None, None)
                t_data = time.perf_counter()
                # Rank 0 out of time, or asked to stop, before a step's data came: every rank leaves
                # the loop together (the stop rides this broadcast: grpo.learner.stop).
                batch, ended = broadcast_batch(batch, self.rank == 0 and batch is None, p.device)
                if ended:
                    if self.rank == 0:
                        self._stopping(step)
                    # The last trained step is the run's last, so it is saved as such (every rank: a
                    # checkpoint is collective), as a step that ends on the clock is; the final
                    # evaluation then scores the weights of the last save, and a stopped run resumes
                    # from it.
                    self._save_due(self.version, last=True)
                    break
                # shared: the sampler reads these very weights; it waits while we step and publish.
                with p.publisher.guard() if self.rank == 0 else contextlib.nullcontext():
                    stats = p.step(batch)
                    self.version = step
                    t_train = time.perf_counter()
                    stall = self._publish()
                if step == self.version_at_start + 1:
                    mark_stage(p.run_dir, f"learner{self.rank}", "first_step")
                if self.rank == 0:
                    p.intake.taken = 0   # the step is trained and its version published
                    p.intake.counts["trained"] += len(groups)
                    trained_samples += batch.size
                    self._curriculum_step(step)
                    self._log_step(step, groups, batch, stats, t0, t_data, t_train, stall, trained_samples, t_start)
                    if p.time_limit is not None:
                        p.time_limit.record(time.perf_counter() - t0)
                    bar.update(1, loss=stats["loss"], reward=float(batch.scalars[:, 1].mean()))
                elif gpu := p.gpu.sample():  # other ranks: their own GPU use, one line per step
                    log.info("step %d%s", step, format_gpu(gpu))
                time_up = bool(cfg.training.max_time_s) and self._time_up(t_start)
                if time_up:
                    self.ended_by = "max_time_s"
                self._save_due(step, last=step == cfg.training.max_steps or time_up)
                if time_up:
                    break
        if bar is not None:
            bar.close()
        broadcast_batch(None, True, p.device)
        checksums = self._rank_checksums()
        if self.rank == 0:
            if cfg.training.lora_r:
                log.info("LoRA adapter saved to %s", save_adapter(p.engine.module, p.run_dir / "lora_adapter"))
            p.publisher.stop_samplers()   # they stop at their next sync while we evaluate
            final_eval = None
            if cfg.evaluation.eval_every > 0 and self.stop.requested():
                # whoever stopped the run wants it to end: the evaluation of a large set can take minutes
                log.info("final evaluation skipped (stopped by %s); python -m grpo.evaluate --model "
                         "<checkpoint>/hf scores the saved weights", self.stop.name)
            elif cfg.evaluation.eval_every > 0:
                final_eval = self._final_eval()
            return self.shutdown(time.perf_counter() - t_start, checksums, final_eval)
        return {}

    def _stopping(self, step: int) -> None:
        """Rank 0, leaving the loop before `step` (a stop asked for, or --max-time-s): says why, and
        on a stop tells the samplers at once, so that they send their final counts while we save."""
        if not self.stop.requested():
            self.ended_by = "max_time_s"
            return
        self.ended_by = self.stop.name
        log.info("%s: stopping after step %d (step %d not started); saving step %d, then summary.json "
                 "(another SIGINT or SIGTERM ends this process at once, without saving)",
                 self.stop.name, self.version, step, self.version)
        self.parts.publisher.stop_samplers()

    def _warm_up(self) -> None:
        """--warm-up on CUDA: round 0 is still being generated, so the first step's one-time costs
        go here."""
        p, cfg = self.parts, self.cfg
        if not (cfg.training.warm_up and p.device.type == "cuda"):
            return
        rows, length = warm_up_shape(min(p.ds_config["train_micro_batch_size_per_gpu"], -(-p.batch_size // p.world)),
                                     cfg.faults.max_prompt_tokens, cfg.rollout.max_new_tokens)
        dt = warm_up(p.engine.module, p.vocab_size, rows, length, p.device, p.step.amp(), cfg.rollout.temperature,
                     cfg.training.padding_free)
        log.info("warm-up pass (%d x %d made-up tokens, forward and backward, no update): %.2f s", rows, length, dt)

    def _receive(self, elapsed: float) -> tuple[list | None, Batch | None]:
        """Rank 0: the step's groups and their batch; no batch when --max-time-s ran out while
        waiting for them (`elapsed`: seconds since the loop began)."""
        cfg = self.cfg
        left = (cfg.training.max_time_s - elapsed) if cfg.training.max_time_s else None
        groups = self.parts.intake.collect(self.parts.groups_per_step, self.version, within_s=left,
                                           stop=self.stop.requested)
        batch = build_batch(groups, cfg.rollout.num_generations, cfg.loss.scale_rewards) if groups else None
        return groups, batch

    def _publish(self) -> float:
        """Rank 0: the new version's weights to the samplers (and its fingerprint with
        --verify-weight-sync); the seconds the publisher stalled the step. 0 on other ranks."""
        p = self.parts
        if self.rank != 0:
            return 0.0
        stall = p.publisher.publish(self.version, p.engine.module)
        if p.fingerprints is not None:
            p.fingerprints.record(self.version, p.engine.module, compute_dtype(p.device))
        return stall

    def _save_due(self, step: int, last: bool) -> None:
        """The checkpoint (every rank) and the timed weights (rank 0) due after `step`; none before the first."""
        p = self.parts
        if step <= self.version_at_start:
            return
        if p.checkpointer.due(step, last=last):
            p.checkpointer.save(p.engine, p.tok, step, self._checkpoint_extra())
        if self.rank == 0 and p.timed_weights.due(time.time(), last=last):
            # in the samplers' dtype: what they generate with is what gets scored (autocast's
            # float32 weights would double the bytes written while the learner waits)
            p.timed_weights.save(p.engine.module, p.tok, step, dtype=compute_dtype(p.device))

    def _curriculum_step(self, step: int) -> None:
        """--curriculum: move task levels on the samplers' latest reports; tell the samplers."""
        p = self.parts
        if p.curriculum is None:
            return
        reports = [e.status.stats for e in p.books.latest().values() if e.status is not None]
        for c in p.curriculum.update(reports, step):
            log.info("curriculum: %s level %d -> %d after step %d (success rate %.3f over %d groups)",
                     c["task"], c["from"], c["to"], step, c["rate"], c["groups"])
        p.answers.levels = dict(p.curriculum.levels)   # a new map: the sync thread reads it

    def _final_eval(self) -> dict:
        """Greedy pass@1 of the final weights, on rank 0 after training (nothing left to stall)."""
        p = self.parts
        result = evaluate_module(p.engine.module, p.tok, self.cfg, p.device, p.step.autocast)
        record_eval(str(p.run_dir), self.version, result, by="learner")
        return {"version": self.version, **result}

    def _sampler_shares(self, elapsed: float, step_s: float, train_s: float) -> tuple[dict, dict]:
        """Per sampler, from its latest status: its busy share since the loop began (generating,
        log-prob passes, scoring, over `elapsed`, at most 1: its counts start with its own process, a
        little before the learner's loop); and the least share of this step in which it and the
        learner were both busy (grpo.stats.both_busy_share), its busy rate taken between the statuses
        seen at the last step and at this one (None until it has sent two). On one shared GPU the
        second is the overlap that rows in flight buy: both processes had work queued at once."""
        busy_share, both = {}, {}
        for sid, e in self.parts.books.latest().items():
            stats = e.status.stats if e.status is not None else {}
            busy = sampler_busy_s(stats)
            busy_share[str(sid)] = round(min(1.0, busy / elapsed), 3) if elapsed > 0 else 0.0
            if "clock_s" not in stats:
                continue
            now = (float(stats["clock_s"]), busy)
            before, last = self._busy_seen.get(str(sid), (None, None))
            rate = busy_rate(before, now, last)
            self._busy_seen[str(sid)] = (now, rate)
            both[str(sid)] = None if rate is None else round(both_busy_share(step_s, train_s, rate), 3)
        return busy_share, both

    def _time_up(self, t_start: float) -> bool:
        """--max-time-s reached? Rank 0's clock decides for all, so every rank leaves the loop together."""
        p = self.parts
        flag = torch.tensor([float(time.perf_counter() - t_start >= self.cfg.training.max_time_s)], device=p.device)
        if dist.is_initialized() and p.world > 1:
            dist.broadcast(flag, 0)
        if flag.item() and self.rank == 0:
            log.info("--max-time-s %.0f reached after step %d", self.cfg.training.max_time_s, self.version)
        return bool(flag.item())

    def _rank_checksums(self) -> list[str]:
        """Every rank's fingerprint of its full (bf16 on GPU) module weights: ZeRO-2 must keep them equal."""
        p = self.parts
        mine = weights_checksum(p.engine.module)
        if not (dist.is_initialized() and p.world > 1):
            return [mine]
        t = torch.tensor([int(mine, 16)], dtype=torch.int64, device=p.device)
        gathered = [torch.empty_like(t) for _ in range(p.world)]
        dist.all_gather(gathered, t)
        return [f"{int(g.item()):016x}" for g in gathered]

    def _log_step(self, step, groups, batch, stats, t0, t_data, t_train, stall, trained_samples, t_start) -> None:
        p = self.parts
        rewards = batch.scalars[:, 1]
        now = time.perf_counter()
        busy_share, both = self._sampler_shares(now - t_start, now - t0, t_train - t_data)
        rec = {"step": step, "policy_version": self.version, **stats,
               "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()) if batch.size > 1 else 0.0,
               "completion_len_mean": float(batch.meta[:, 1].float().mean()),
               "step_time_s": now - t0, "data_wait_s": t_data - t0, "train_s": t_train - t_data,
               # each role's busy share: the learner's of this step; each sampler's since the loop began
               # (generation, log-prob passes, scoring), from its latest status
               "learner_busy_share": (t_train - t_data) / (now - t0) if now > t0 else 0.0,
               "sampler_busy_share": busy_share, "both_busy_share": both,
               "sync_publish_s": stall, "samples_per_s": trained_samples / (now - t_start),
               "groups": p.intake.accounting(), "sampler_versions": dict(p.publisher.sampler_versions),
               "eval": self._latest_eval(), "sync_method": p.publisher.method,
               "samplers_alive": len(p.intake.alive(self.version)), "samplers_gone": len(p.liveness.gone),
               "sync_bytes_served": p.publisher.bytes_served, "data_bytes_received": p.receiver.bytes,
               "time_s": now - t_start, **group_stats(groups, self.version)}
        # every rank's tokens over the step's training time on all of them, against their bf16 peak
        rec["bf16_peak_share"] = bf16_peak_share(self._params, stats["model_tokens"], rec["train_s"], p.world,
                                                 self._peak, lora=bool(self.cfg.training.lora_r))
        if failures := reported_failures([e.status.stats for e in p.books.latest().values() if e.status is not None]):
            rec["reward_failures"] = failures   # so far, by '<reward>/<exception type>'
        if p.curriculum is not None:
            rec.update({f"curriculum/{t}": lv for t, lv in p.curriculum.levels.items()})
            rec["curriculum_changes"] = [c for c in p.curriculum.changes if c["step"] == step]
        if gpu := p.gpu.sample():
            rec["gpu"] = gpu
        if alarm := self._zero_signal_alarm(rec["groups"]):
            rec["zero_signal_alarm"] = alarm
            log.warning("learner: %s", alarm)
        p.metrics.write(rec)
        p.tracker.log(rec, step)
        log.info("step %d v%d: loss %.4f reward %.3f acc %.3f kl %s clip %.3f | %d tok, %.2f s "
                 "(wait %.2f, train %.2f, publish %.3f) | %.1f samples/s | samplers at %s | groups %s | "
                 "%d msgs / %.1f MB in, %.1f MB weights out%s%s",
                 step, self.version, stats["loss"], rec["reward_mean"], rec["accuracy"],
                 "-" if stats["kl"] is None else f"{stats['kl']:.4f}",
                 stats["clip_frac"], stats["tokens"], rec["step_time_s"], rec["data_wait_s"], rec["train_s"],
                 stall, rec["samples_per_s"], rec["sampler_versions"], rec["groups"], p.receiver.messages,
                 p.receiver.bytes / 1e6, p.publisher.bytes_served / 1e6, format_gpu(gpu),
                 "" if rec["bf16_peak_share"] is None else f" | training at {rec['bf16_peak_share']:.1%} of bf16 peak")

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
        evals = [e.status.stats for e in self.parts.books.latest().values()
                 if e.status is not None and e.status.stats.get("eval_version", -1) >= 0]
        if not evals:
            return None
        best = max(evals, key=lambda st: st["eval_version"])
        return {"version": int(best["eval_version"]), "accuracy": best["eval_accuracy"]}

    def _checkpoint_extra(self) -> dict:
        """What rank 0 records beside the weights: the samplers' last reported position, counts."""
        p = self.parts
        if self.rank != 0:
            return {}
        return {"samplers": {i: {"version": e.status.policy_version, "groups_sent": e.status.groups_sent,
                                 "rounds": int(e.status.stats.get("rounds", 0))}
                             for i, e in p.books.latest().items() if e.status is not None},
                "groups": p.intake.accounting(), "books": p.books.dump(), "messages": p.messages.dump(),
                "seed": self.cfg.run.seed}

    def _newest_checkpoint(self) -> dict | None:
        """The newest complete checkpoint under the run folder ({"step", "path"}), this run's or the
        one it resumed from; None when there is none."""
        found = list_checkpoints(self.parts.checkpointer.root)
        return {"step": found[-1][0], "path": str(found[-1][1])} if found else None

    def shutdown(self, elapsed: float, checksums: list[str] | None = None, final_eval: dict | None = None) -> dict:
        """Tell samplers to stop, wait for their final status, and account for every group."""
        p = self.parts
        p.publisher.stop_samplers()
        log.info("finished %d steps; stopping samplers %s (waiting up to %.0f s for their final status; "
                 "gone ones are not waited for)", self.version, sorted(p.intake.alive(self.version)),
                 self.cfg.faults.shutdown_timeout_s)
        p.intake.wait_for_finals(self.cfg.faults.shutdown_timeout_s, self.version)
        acc = p.intake.accounting()
        books_say = balance(acc, p.books, p.messages)   # names what a gap is, if there is one
        stages = stage_history(p.run_dir)
        latest = p.books.latest()
        missing = sorted(i for i, e in latest.items() if not e.final)
        dropped_total = sum(acc["dropped"].values())
        failures = reported_failures([e.status.stats for e in latest.values() if e.status is not None])
        queued = [g.policy_version for g in p.intake.queue]
        summary = {"steps": self.version, "optimizer_updates": p.engine.updates, "elapsed_s": elapsed,
                   "steps_at_start": self.version_at_start, "ended_by": self.ended_by,
                   "max_steps": self.cfg.training.max_steps,
                   "checkpoint": self._newest_checkpoint(),
                   "groups": acc, "balance": books_say, "ages": dict(sorted(p.intake.ages.items())),
                   "ages_before_start": dict(sorted(p.intake.ages_before_start.items())),
                   # the versions that generated the groups still queued (oldest token's), for the run's
                   # last lines: what the queued groups were
                   "queued_versions": [min(queued), max(queued)] if queued else None,
                   "staleness_note": staleness_advice(p.intake.ages, self.cfg.training.max_staleness),
                   "stages": stages, "first_step_s": first_step_s(stages, os.getpid()),
                   "samplers": {i: {"version": e.status.policy_version, "groups_sent": e.status.groups_sent,
                                    "final": e.final, "stats": e.status.stats}
                                for i, e in sorted(latest.items()) if e.status is not None},
                   "incarnations": p.books.report(), "liveness": p.liveness.snapshot(),
                   "samplers_without_final_status": missing,
                   "sync": {"bytes_served": p.publisher.bytes_served, **p.publisher.replies},
                   "messages": p.messages.report(p.books),
                   "final_eval": final_eval,
                   "reward_failures": failures,
                   "curriculum": ({"levels": dict(p.curriculum.levels), "changes": p.curriculum.changes}
                                  if p.curriculum is not None else None),
                   "weight_sync_verified": p.fingerprints.report() if p.fingerprints is not None else None,
                   "rank_weight_checksums": checksums or [],
                   "ranks_identical": len(set(checksums or [])) == 1,
                   "peak_mem_gb": (torch.cuda.max_memory_allocated(p.device) / 2**30
                                   if p.device.type == "cuda" else None)}
        if self.cfg.training.lora_r:
            summary["lora"] = lora_stats(p.engine)
        (p.run_dir / "summary.json").write_text(json.dumps({**summary, **provenance()}, indent=2) + "\n")
        p.metrics.write({"final": True, **summary})
        log.info("accounting: sent %d = trained %d + dropped %d %s + queued %d -> %s%s", acc["sent"],
                 acc["trained"], dropped_total, acc["dropped"], acc["queued"], books_say["text"],
                 f" (no final status from samplers {missing})" if missing else "")
        if summary["staleness_note"]:
            log.info("%s", summary["staleness_note"])
        if failures:
            log.info("reward failures: %d completions scored their reward's failure value (%s); each kind's first "
                     "example is in the samplers' logs", sum(failures.values()),
                     ", ".join(f"{k.replace('/', ' ')} {n}" for k, n in failures.items()))
        p.publisher.close()
        p.receiver.close()
        p.metrics.close()
        p.tracker.close()
        with contextlib.suppress(FileNotFoundError):
            (p.run_dir / "learner.ready").unlink()
        return summary
