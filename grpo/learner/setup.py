"""Building the learner, apart from running it (grpo.learner.loop runs what this builds).

build(cfg), in start-up order:
  check     every flag that can be wrong fails here, with one line, before ports or weights
  bind      rank 0 binds the data and sync ports first: samplers connect and queue while it loads
  group     the process group (DeepSpeed), its first collective on a thread beside the model's loading
  load      tokenizer and model (LoRA-wrapped with --lora-r), then the optimizer engine (start_engine:
            group and load, timed for the start-up line)
  publish   rank 0: the sync answer, the intake (rank 0's receive side) wired into its budget
            (QueueView), and the weight publisher (its thread answers at once, so it is wired to the
            message ledger and liveness here, before it serves any weights, and its first answer
            carries a budget)
  record    metrics, tracking, checkpoints, timed weight saves
  resume    --resume: the engine's state and the step, then the books
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from grpo.config import LearnerConfig, flat, micro_token_budget, resolve_precision
from grpo.data.tasks import Curriculum
from grpo.generate.backend import resolve_backend
from grpo.learner.accounting import Books, MessageLedger
from grpo.learner.checkpoint import Checkpointer, TimedWeights, load_checkpoint, parse_save_schedule, resolve_resume
from grpo.learner.engine import (CommunicatorWarmup, DeepSpeedEngine, TorchEngine, clear_build_locks,
                                 init_process_group, load_ds_config, resolve_ds_config)
from grpo.learner.intake import Intake
from grpo.learner.liveness import Liveness, SyncPeers
from grpo.learner.kernels import fuse_layers
from grpo.learner.lora import wrap_lora
from grpo.learner.timelimit import TimeLimit
from grpo.learner.step import TrainStep
from grpo.loss import LossConfig
from grpo.model.liger import liger_choice, liger_installed
from grpo.model.load import (compute_dtype, load_causal_lm, load_tokenizer, pick_device, said_imports,
                             start_runtime)
from grpo.model.packed import packable
from grpo.model.zoo import resolve_model
from grpo.obs.gpu import GpuMonitor, release_cached
from grpo.obs.metrics import MetricsWriter
from grpo.obs.profile import SpanProfiler
from grpo.obs.rundir import make_run_dir
from grpo.obs.stages import mark as mark_stage
from grpo.obs.tracking import Tracker, parse_report_to
from grpo.sync.answer import QueueView, SyncAnswer
from grpo.weights import make_publisher
from grpo.weights.methods import check_method
from grpo.weights.verify import PublishedFingerprints
from grpo.wire import messages as M
from grpo.wire.curve import SERVER, curve_for, warn_if_exposed
from grpo.wire.ports import free_port
from grpo.wire.transport import DataReceiver, SyncServer, bind_each

log = logging.getLogger(__name__)


def check_loss_options(cfg: LearnerConfig) -> None:
    """Reject bad algorithm options with one line, before anything is loaded."""
    LossConfig.of(cfg).check()
    groups = cfg.training.train_batch_size // max(cfg.rollout.num_generations, 1)
    if cfg.training.ppo_minibatches < 1 or cfg.training.ppo_minibatches > groups:
        raise ValueError(f"--ppo-minibatches {cfg.training.ppo_minibatches}: must be between 1 and the groups per step "
                         f"(--train-batch-size / --num-generations = "
                         f"{cfg.training.train_batch_size // max(cfg.rollout.num_generations, 1)})")
    parse_report_to(cfg.observability.report_to)


def check_save_options(cfg: LearnerConfig) -> None:
    """--save-weights-every-s and its schedule: one line each, before the model loads."""
    if cfg.checkpoints.save_weights_every_s < 0 or (cfg.checkpoints.save_weights_every_s and cfg.training.lora_r):
        raise ValueError(f"--save-weights-every-s {cfg.checkpoints.save_weights_every_s}: must be >= 0 and needs full "
                         f"fine-tuning (with --lora-r the adapter is saved at the end); drop one of them")
    if cfg.checkpoints.save_weights_schedule:
        if not cfg.checkpoints.save_weights_every_s:
            raise ValueError("--save-weights-schedule needs --save-weights-every-s > 0 (which turns the saves on)")
        parse_save_schedule(cfg.checkpoints.save_weights_schedule)   # a bad spec fails here, before the model loads


@dataclass
class Placement:
    """What the flags and the environment decide before ports or weights; building it checks them."""
    rank: int
    world: int
    device: torch.device
    device_s: float             # picking the device (on CUDA: torch's CUDA initialisation)
    precision: str              # grpo.config.resolve_precision: bf16, autocast or fp32
    run_dir: Path
    ds_config: dict             # the resolved DeepSpeed config (also the --no-deepspeed engine's)
    batch_size: int             # completions per step
    micro_tokens: int           # --micro-batch-tokens: tokens per micro-batch (0 when off: gas fixed ones)
    groups_per_step: int
    profiler: SpanProfiler
    curriculum: Curriculum | None
    model_path: str             # --model resolved
    resume_dir: Path | None     # --resume resolved


def place(cfg: LearnerConfig) -> Placement:
    """Rank, device, precision, run dir, DeepSpeed config and batch plan, the model and the resume
    point: a bad flag fails here, before ports or weights."""
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    profiler = SpanProfiler(cfg.observability.profile_steps, cfg.run.run_dir, f"learner{rank}")   # a bad span fails now
    if cfg.training.no_deepspeed and world > 1:
        raise ValueError("--no-deepspeed runs one process; drop it or start a single rank")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    t_device = time.perf_counter()   # on CUDA: torch's CUDA initialisation
    device = pick_device(cfg.run.device,
                         cfg.run.gpu_id if cfg.run.gpu_id >= 0 else (local if cfg.run.device != "cpu" else -1))
    t_device = time.perf_counter() - t_device
    precision = resolve_precision(cfg.training.precision, device.type == "cuda", bool(cfg.training.lora_r),
                                  not cfg.training.no_deepspeed)
    check_method(cfg.weight_sync.weight_sync, device.type, bool(cfg.training.lora_r), precision == "bf16")
    resolve_backend(cfg.rollout.generation_backend, device)   # a bad name fails now, not after training
    liger_choice(cfg.training.liger_kernel, device.type == "cuda", liger_installed(), supported=True)   # and 'on' where it cannot run
    curriculum = (Curriculum(cfg.data.dataset, cfg.data.curriculum_low, cfg.data.curriculum_high,
                             cfg.data.curriculum_window)
                  if cfg.data.curriculum else None)   # a bad --dataset or threshold fails here, before loading
    run_dir = make_run_dir(cfg.run.run_dir)
    raw_ds = load_ds_config(cfg.training.deepspeed_config)
    ds_config, batch_size = resolve_ds_config(
        raw_ds, world, cfg.training.train_batch_size, cfg.rollout.num_generations, cfg.training.learning_rate,
        cuda=device.type == "cuda", source=cfg.training.deepspeed_config, precision=precision,
        token_micro_batches=cfg.training.micro_batch_tokens != -1)
    micro_tokens = micro_token_budget(cfg.training.micro_batch_tokens, ds_config["train_micro_batch_size_per_gpu"],
                                      cfg.faults.max_prompt_tokens, cfg.rollout.max_new_tokens)
    path = resolve_model(cfg.run.model)  # a bad --model fails here, before ports or weights
    resume_dir = resolve_resume(cfg.checkpoints.resume, run_dir, cfg.training.max_steps)  # so does a bad --resume
    return Placement(rank, world, device, t_device, precision, run_dir, ds_config, batch_size, micro_tokens,
                     batch_size // cfg.rollout.num_generations, profiler, curriculum, path, resume_dir)


def bind_ports(cfg: LearnerConfig, run_dir: Path) -> tuple[SyncServer, DataReceiver]:
    """Rank 0 binds both ports before loading the model, so samplers can connect and queue while
    it loads; the ready file tells the launcher the ports are bound."""
    curve = curve_for(cfg.faults.curve_keys, SERVER)
    bind = cfg.faults.bind_host or cfg.run.host  # loopback unless a flag says otherwise
    warn_if_exposed(bind, curve)
    # both tried before either is refused: one line names every taken port
    receiver, server = bind_each(
        lambda: DataReceiver(bind, cfg.run.data_port, M.Limits(group_size=cfg.rollout.num_generations),
                             max_message_bytes=cfg.faults.max_message_mb << 20, curve=curve),
        lambda: SyncServer(bind, cfg.run.sync_port, curve=curve))
    (run_dir / "learner.ready").write_text(json.dumps(
        {"host": cfg.run.host, "data_port": cfg.run.data_port, "sync_port": cfg.run.sync_port, "pid": os.getpid()}))
    log.info("learner bound data %s:%d and sync %s:%d%s; run dir %s", bind, cfg.run.data_port,
             bind, cfg.run.sync_port, " (CURVE)" if curve else "", run_dir)
    mark_stage(run_dir, "learner0", "bound")
    return server, receiver


def start_process_group(cfg: LearnerConfig, device: torch.device) -> CommunicatorWarmup:
    """DeepSpeed's process group (nccl on CUDA, gloo on CPU); its first collective then runs on a
    thread beside the model's loading (wait() on what this returns)."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", str(device.index or 0))
    clear_build_locks()   # a build lock left by a stopped process would hang init silently
    init_process_group(device, cfg.faults.dist_timeout_s)
    return CommunicatorWarmup(device, cfg.faults.dist_timeout_s)


def load_model(cfg: LearnerConfig, path: str, device: torch.device, precision: str,
               times: dict[str, float]) -> tuple:
    """(tokenizer, model, fused layers or None) in training form; `times` gets the parts of the load by name."""
    start_runtime(device, times, cfg.run.cudnn_attention, cfg.run.fused_logprobs)
    t_tok = time.perf_counter()
    tok = load_tokenizer(path)
    times["tokenizer"] = time.perf_counter() - t_tok
    # bf16: DeepSpeed keeps fp32 master weights in its optimizer, so the module can be bf16.
    # autocast (and plain AdamW, which has no master copies): fp32 weights, bf16 matmuls.
    dtype = compute_dtype(device) if precision == "bf16" else torch.float32
    model = load_causal_lm(path, device, dtype, times=times)
    model.config.use_cache = False
    fused = fuse_layers(model, cfg.training.liger_kernel, device.type == "cuda")   # before LoRA wraps its linears
    why = packable(model) if cfg.training.padding_free else "--no-padding-free"
    log.info("learner passes: %s", f"right-padded rows ({why})" if why else
             "padding-free, over each micro-batch's real tokens only (--no-padding-free: right-padded rows)")
    if cfg.training.lora_r:
        model = wrap_lora(model, cfg.training.lora_r, cfg.training.lora_alpha, cfg.training.lora_target_modules,
                          cfg.training.lora_dropout)
    return tok, model, fused


def run_facts(cfg: LearnerConfig, vocab_size: int, device: torch.device, groups_per_step: int) -> M.RunFacts:
    """The facts every sampler must agree with, sent in its first answer."""
    return M.RunFacts(schema=M.SCHEMA_VERSION, model=cfg.run.model, vocab_size=vocab_size,
                      dtype=str(compute_dtype(device)).removeprefix("torch."),
                      num_generations=cfg.rollout.num_generations, max_new_tokens=cfg.rollout.max_new_tokens,
                      max_prompt_tokens=cfg.faults.max_prompt_tokens, temperature=cfg.rollout.temperature,
                      needs_ref_logprobs=cfg.loss.beta > 0, max_staleness=cfg.training.max_staleness,
                      groups_per_step=groups_per_step)


def wire_publisher(publisher, server: SyncServer, answers: SyncAnswer, liveness: Liveness, messages: MessageLedger,
                   curriculum: Curriculum | None, max_samplers: int) -> None:
    """Rank 0's publisher to the parts it reports to: who may speak for which sampler id, refused
    sync messages into the message ledger, the curriculum's starting levels."""
    publisher.peers = SyncPeers(liveness, max_peers=4 * max_samplers)

    def rejected(reason: str, peer: bytes | None) -> None:
        """A refused message on the sync port (the publisher's thread): the message ledger only."""
        sid = publisher.peers.bound(peer) if peer is not None and publisher.peers else None
        messages.reject("sync", reason, None if sid is None else str(sid))

    publisher.on_reject = rejected
    if curriculum is not None:
        answers.levels = dict(curriculum.levels)
    server.on_reject = lambda exc, peer: rejected(exc.reason, peer)


def wire_queue_view(answers: SyncAnswer, intake: Intake, liveness: Liveness, max_steps: int,
                    time_limit: TimeLimit | None = None) -> None:
    """Each answer tells its sampler how much it may generate: the budget reads the intake's queue,
    and stops at the groups the steps left to `max_steps` train, or those `time_limit` leaves time for."""
    answers.queue_view = QueueView(queued=lambda: len(intake.queue),
                                   arrived=intake.arrived,
                                   samplers=lambda: max(1, liveness.count_alive()),
                                   training=lambda: intake.taken, max_steps=max_steps,
                                   waiting_since=lambda: intake.waiting_since,
                                   time_steps_left=time_limit.steps_left if time_limit else lambda: -1)


def start_engine(cfg: LearnerConfig, p: Placement, receiver: DataReceiver | None,
                 import_s: float | None = None) -> tuple:
    """(tokenizer, vocabulary size, optimizer engine, fused layers or None): the process group, the model and the engine,
    timed for the start-up line (which says `import_s` first: the worker's import of its role,
    grpo.workers). A job of build's of its own: its clock readings and the
    communicator's warm-up (beside the model's loading) begin and end here."""
    t_dist = time.perf_counter()
    comm_warmup = None if cfg.training.no_deepspeed else start_process_group(cfg, p.device)
    t_model = time.perf_counter()
    load_times: dict[str, float] = {}   # the parts of 'model' in the start-up line
    tok, model, fused = load_model(cfg, p.model_path, p.device, p.precision, load_times)
    vocab_size = model.get_input_embeddings().weight.shape[0]
    if receiver is not None:
        receiver.limits = M.Limits(group_size=cfg.rollout.num_generations, vocab_size=vocab_size)
    t_engine = time.perf_counter()
    comm_s = None if comm_warmup is None else comm_warmup.wait()
    engine = TorchEngine(model, p.ds_config, p.device) if cfg.training.no_deepspeed else DeepSpeedEngine(model,
                                                                                                         p.ds_config)
    log.info("start-up: %sdevice %.1f s, DeepSpeed import and process group %.1f s, model %.1f s (%s), optimizer "
             "engine %.1f s%s", said_imports(import_s), p.device_s, t_model - t_dist, t_engine - t_model,
             ", ".join(f"{k} {v:.1f} s" for k, v in load_times.items()), time.perf_counter() - t_engine,
             "" if comm_s is None else f" (the communicator's first collective: {comm_s:.2f} s, beside the model)")
    mark_stage(p.run_dir, f"learner{p.rank}", "engine_ready")
    log.info("precision %s: %s", p.precision,
             {"autocast": "float32 weights and optimizer state, bf16 matmuls under torch.autocast",
              "bf16": "bf16 weights, fp32 master copies in DeepSpeed's optimizer",
              "fp32": "float32 throughout"}[p.precision])
    return tok, vocab_size, engine, fused


@dataclass
class LearnerParts:
    """Everything a learner rank runs with. Rank 0 only (None on the other ranks): server, receiver,
    publisher, intake, metrics, tracker; fingerprints with --verify-weight-sync."""
    cfg: LearnerConfig
    rank: int
    world: int
    device: torch.device
    run_dir: Path
    ds_config: dict
    batch_size: int             # completions per step
    groups_per_step: int
    profiler: SpanProfiler
    curriculum: Curriculum | None
    tok: object
    vocab_size: int
    engine: DeepSpeedEngine | TorchEngine
    step: TrainStep
    liveness: Liveness
    books: Books
    messages: MessageLedger
    answers: SyncAnswer
    gpu: GpuMonitor
    checkpointer: Checkpointer
    timed_weights: TimedWeights
    version: int                # the starting version: 0, or the resumed step
    server: SyncServer | None
    receiver: DataReceiver | None
    publisher: object | None
    fingerprints: object | None
    intake: Intake | None
    metrics: MetricsWriter | None
    tracker: Tracker | None
    time_limit: TimeLimit | None = None


def build(cfg: LearnerConfig, import_s: float | None = None) -> LearnerParts:
    """Every part of this learner rank, built and wired in start-up order (the module's docstring);
    `import_s`: the worker's import of its role (grpo.workers), for the start-up line."""
    t_created = time.time()   # --save-weights-every-s counts from here
    check_loss_options(cfg)
    check_save_options(cfg)
    p = place(cfg)
    rank, device = p.rank, p.device
    liveness = Liveness(cfg.faults.heartbeat_timeout_s, cfg.faults.max_samplers)
    books = Books(max_entries=4 * cfg.faults.max_samplers)
    messages = MessageLedger(max_keys=16 * cfg.faults.max_samplers)
    server, receiver = bind_ports(cfg, p.run_dir) if rank == 0 else (None, None)
    tok, vocab_size, engine, fused = start_engine(cfg, p, receiver, import_s)

    # The control fields of every answer on the sync port (facts, levels, budget): rank 0's publisher asks it.
    # groups counted on their way that have not come while the learner waits this long are counted lost
    answers = SyncAnswer(run_facts(cfg, vocab_size, device, p.groups_per_step), lost_after_s=cfg.faults.data_timeout_s)
    fingerprints = None
    if cfg.weight_sync.verify_weight_sync and rank == 0:
        if cfg.training.lora_r:  # samplers get merged weights, not the module's: nothing to compare
            log.warning("--verify-weight-sync is not supported with LoRA; not verifying")
        else:
            fingerprints = PublishedFingerprints()
    intake = None
    publisher = None
    time_limit = TimeLimit(cfg.training.max_time_s)   # the loop's clock; the budget reads its steps left
    if rank == 0:
        # The intake is wired into the answers before the publisher's thread exists: that thread answers
        # at once the requests that queued while the model loaded. An answer without the queue view
        # carries no budget and sets no gap floor (grpo.sync.flow), so the sampler's next request, sent
        # while its round 0 was still on the way, had those groups taken as lost: the budget ignored
        # them and let it make more of version 0 than the learner trains before they go stale.
        intake = Intake(cfg, receiver, liveness, books, messages, fingerprints)
        wire_queue_view(answers, intake, liveness, cfg.training.max_steps, time_limit)
        publisher = make_publisher(cfg.weight_sync.weight_sync, server, engine.module, device, compute_dtype(device),
                                   cfg.run.host,
                                   cfg.run.sync_port, cfg.weight_sync.ipc_ack_timeout_s,
                                   cfg.weight_sync.nccl_timeout_s, answers)
        wire_publisher(publisher, server, answers, liveness, messages, p.curriculum, cfg.faults.max_samplers)
    metrics = MetricsWriter(p.run_dir) if rank == 0 else None
    tracker = Tracker(p.run_dir, cfg.observability.report_to, flat(cfg)) if rank == 0 else None
    gpu = GpuMonitor(device)
    checkpointer = Checkpointer(p.run_dir, cfg.checkpoints.save_every, cfg.checkpoints.keep_checkpoints, rank, p.world)
    timed_weights = TimedWeights(p.run_dir / "weights", cfg.checkpoints.save_weights_every_s, t_created,
                                 cfg.checkpoints.save_weights_schedule)

    version, resumed = 0, None
    if p.resume_dir is not None:
        t_load = time.perf_counter()
        resumed = load_checkpoint(engine, p.resume_dir, rank, p.world)
        version = checkpointer.last_saved = int(resumed["step"])
        log.info("resumed from %s in %.2f s: continuing at step %d", p.resume_dir,
                 time.perf_counter() - t_load, version + 1)
    if publisher is not None:
        # The starting version (0, or the resumed one) is published before any step: a client
        # with no weights (have_version -1) gets them, and resumed samplers get the resumed ones.
        publisher.publish(version, engine.module)
        if fingerprints is not None:
            fingerprints.record(version, engine.module, compute_dtype(device))
        mark_stage(p.run_dir, "learner0", "weights_published")
    release_cached(device)   # what start-up cached, for the other process on this GPU

    if resumed is not None and rank == 0:
        lost = books.restore(resumed.get("books", []), resumed.get("groups", {}), intake.counts)
        messages.restore(resumed.get("messages", []))
        log.info("books carried over from step %d (%d groups queued then are lost with the old learner)",
                 version, lost)
    step = TrainStep(cfg, engine, tok.pad_token_id, device, rank, p.world, p.micro_tokens,
                     autocast=p.precision == "autocast", fused=fused)
    log.info("learner rank %d/%d on %s: batch %d completions (%d groups of %d) per step, %s",
             rank, p.world, device, p.batch_size, p.groups_per_step, cfg.rollout.num_generations,
             f"micro-batches of at most {p.micro_tokens} {'real' if step.packed else 'padded'} tokens"
             if p.micro_tokens else f"gas {engine.gas}")
    return LearnerParts(cfg=cfg, rank=rank, world=p.world, device=device, run_dir=p.run_dir, ds_config=p.ds_config,
                        batch_size=p.batch_size, groups_per_step=p.groups_per_step, profiler=p.profiler,
                        curriculum=p.curriculum, tok=tok, vocab_size=vocab_size, engine=engine, step=step,
                        liveness=liveness, books=books, messages=messages, answers=answers, gpu=gpu,
                        checkpointer=checkpointer, timed_weights=timed_weights, version=version, server=server,
                        receiver=receiver, publisher=publisher, fingerprints=fingerprints, intake=intake,
                        metrics=metrics, tracker=tracker, time_limit=time_limit)
