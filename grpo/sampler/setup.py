"""Building the sampler, apart from running it (grpo.sampler.loop runs what this builds).

build(cfg), in start-up order (each stage a function of its own where it is more than a few lines):
  check     every flag that can be wrong fails here, with one line, before the model loads:
            --on-full, the CURVE keys, the profiled spans, the device and generation backend (vllm:
            installed, on CUDA),
            --in-flight-rows, --old-logprobs, --swap-in-flight (check_decoding), --reward
  prompts   this sampler's shard (at the curriculum's levels), and one probe of the rewards on it
  load      tokenizer and policy; the weight receiver (ipc/nccl move the parameters into flat
            buckets, so before the engine, which reads them where they live); the rollout engine
            (ours, or vLLM's, which copies the policy's weights), or Hugging Face generate when our
            engine cannot serve the architecture (load_rollout, make_engine)
  connect   the data and sync sockets, the evaluation set (sampler 0), the GPU monitor, the
            counters, the weights client, the rollout workflow, the statuses and the heartbeat
            (connect), then the sampler's start-up line (say_parts)
"""
from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass

import torch

from grpo.config import SamplerConfig
from grpo.data.rewards import reward_set_from_config
from grpo.evaluate import run_eval_problems
from grpo.generate.backend import old_logprob_source, resolve_backend
from grpo.generate.engine import RolloutEngine
from grpo.generate.vllm_engine import VLLM, VllmEngine, check_vllm, plan_share, vllm_installed
from grpo.model.load import (compute_dtype, eos_ids, load_causal_lm, load_tokenizer, pick_device, said_imports,
                             start_runtime)
from grpo.model.zoo import resolve_model
from grpo.obs.gpu import GpuMonitor, release_cached
from grpo.obs.profile import SpanProfiler
from grpo.obs.stages import mark as mark_stage
from grpo.rules.backend import auto_engine
from grpo.rules.tensor_parallel import tensor_parallel_problem
from grpo.rules.screening import screen_problem
from grpo.sampler.counters import SamplerCounters
from grpo.sampler.heartbeat import ON_FULL, Heartbeat, Statuses
from grpo.sampler.weights_client import WeightsClient, start_receiver
from grpo.sampler.workflow import Prompts, RolloutModel, RolloutWorkflow, swaps_in_flight
from grpo.weights.methods import sampler_method
from grpo.wire import messages as M
from grpo.wire.curve import CLIENT, curve_for
from grpo.wire.transport import DataSender, SyncClient

log = logging.getLogger(__name__)


@dataclass
class SamplerParts:
    """Everything a sampler runs with, built and wired by build()."""
    cfg: SamplerConfig
    name: str                   # 'sampler<id>': its stages and its log
    profiler: SpanProfiler
    prompts: Prompts            # this sampler's shard, at the curriculum's levels
    rewards: object             # grpo.data.rewards' reward set
    rollout: RolloutModel       # tokenizer, policy, engine, device, backend, old log-prob source, swaps
    vocab_size: int
    incarnation: int            # this process's random id: a restart under the same --sampler-id is another
    data: DataSender            # groups and statuses to the learner's data port
    sync: SyncClient            # the learner's sync port
    eval_set: list | None       # sampler 0 with --eval-every: the held-out problems
    gpu: GpuMonitor
    counters: SamplerCounters   # the counts every status carries, one owner per field
    client: WeightsClient
    workflow: RolloutWorkflow
    statuses: Statuses          # statuses(final): a SamplerStatus of the counters at one instant
    heartbeat: Heartbeat

    # the rollout model's parts, by their own names
    device = property(lambda self: self.rollout.device)
    tok = property(lambda self: self.rollout.tok)
    policy = property(lambda self: self.rollout.policy)
    engine = property(lambda self: self.rollout.engine)
    eos_ids = property(lambda self: self.rollout.eos_ids)
    model_path = property(lambda self: self.rollout.path)
    backend = property(lambda self: self.rollout.backend)       # 'fast' (our engine), 'hf' (Hugging Face generate), 'vllm'
    old_source = property(lambda self: self.rollout.old_source)  # old log-probs from 'sampling' or a 'pass'
    swaps = property(lambda self: self.rollout.swaps)           # weights swapped between decode steps


def check_on_full(cfg: SamplerConfig) -> None:
    if cfg.faults.on_full not in ON_FULL:
        raise ValueError(f"--on-full {cfg.faults.on_full}: choose one of {', '.join(ON_FULL)}")


def build(cfg: SamplerConfig, import_s: float | None = None) -> SamplerParts:
    """Every part of this sampler, built and wired in start-up order (the module's docstring), with
    its start-up lines (`import_s`: the worker's import of its role, grpo.workers, said first)."""
    check_on_full(cfg)
    curve = curve_for(cfg.faults.curve_keys, CLIENT)  # bad keys fail here, before the model loads
    profiler = SpanProfiler(cfg.observability.profile_steps, cfg.run.run_dir,
                            f"sampler{cfg.run.sampler_id}")   # so does a bad span
    times = {} if import_s is None else {"imports": import_s}
    times["device"] = time.perf_counter()
    device = pick_device(cfg.run.device, cfg.run.gpu_id)   # on CUDA: torch's CUDA initialisation
    times["device"] = time.perf_counter() - times["device"]
    decoding = check_decoding(cfg, device)
    torch.manual_seed(cfg.run.seed + 1000 * cfg.run.sampler_id)
    rewards = reward_set_from_config(cfg)  # a bad --reward fails here, before any model loads
    t0 = time.perf_counter()
    prompts = Prompts(cfg)   # this sampler's shard, at the curriculum's levels (--curriculum)
    t_problems = time.perf_counter()
    rewards.probe(prompts.mine[0])
    times.update(problems=t_problems - t0, probe=time.perf_counter() - t_problems)
    rollout, receiver, method = load_rollout(cfg, device, decoding, times)
    parts = connect(cfg, curve, profiler, prompts, rewards, rollout, receiver, method)
    say_parts(parts)
    release_cached(device)   # what start-up cached, for the other process on this GPU
    mark_stage(cfg.run.run_dir, parts.name, "model_loaded")
    return parts


@dataclass
class Decoding:
    """How rounds are decoded, as the flags ask (check_decoding); the engine may still fall back."""
    backend: str      # 'fast', 'hf' or 'vllm'
    old_source: str   # old log-probs from 'sampling' or a 'pass'
    swaps: bool       # weights swapped in flight (swaps_in_flight)


def check_decoding(cfg: SamplerConfig, device: torch.device) -> Decoding:
    """The generation backend, the old log-probs' source and in-flight swaps, from the flags: a bad
    choice or combination fails here, in one line, before any loading."""
    backend = resolve_backend(cfg.rollout.generation_backend, device)  # a bad name fails before any loading
    tp = cfg.rollout.vllm_tensor_parallel_size
    # the launcher's refusals again, for a sampler started by hand (grpo.rules.tensor_parallel)
    if problem := tensor_parallel_problem(tp, cfg.rollout.generation_backend, device.type, cfg.weight_sync.weight_sync):
        raise ValueError(problem)
    if backend == VLLM:
        # installed (the optional extra), on CUDA, its first visible GPU, and as many visible as it spreads over
        check_vllm(device.type, device.index, tp, torch.cuda.device_count() if device.type == "cuda" else None)
    if cfg.rollout.in_flight_rows and backend not in ("fast", VLLM):   # a negative count is refused with the flag
        raise ValueError(f"--in-flight-rows {cfg.rollout.in_flight_rows}: needs --generation-backend fast (here it is "
                         f"{backend}); or 0 for fixed rounds")
    if problem := screen_problem(cfg.rollout.screen_generations, cfg.rollout.num_generations):
        raise ValueError(problem)
    # a bad choice fails before any loading too
    old_source = old_logprob_source(cfg.rollout.old_logprobs, backend, compute_dtype(device))
    # (so does --old-logprobs pass with --swap-in-flight)
    swaps = swaps_in_flight(cfg.rollout.swap_in_flight, cfg.rollout.in_flight_rows,
                            sampler_method(cfg.weight_sync.weight_sync, device.type),
                            cfg.rollout.old_logprobs)
    return Decoding(backend, old_source, swaps)


def load_rollout(cfg: SamplerConfig, device: torch.device, decoding: Decoding, times: dict[str, float]):
    """The tokenizer, the policy, the weight receiver and the decoder: (RolloutModel, receiver, the
    weights method), with the start-up line of where the seconds went (`times`: imports when a
    worker timed them, device, problems, probe so far)."""
    t_load = time.perf_counter()
    path = resolve_model(cfg.run.model)
    load_times: dict[str, float] = {}   # the parts of 'model' in the start-up line
    start_runtime(device, load_times, cfg.run.cudnn_attention, cfg.run.fused_logprobs)
    t_tok = time.perf_counter()
    tok = load_tokenizer(path)
    load_times["tokenizer"] = time.perf_counter() - t_tok
    policy = load_causal_lm(path, device, compute_dtype(device), times=load_times).eval()
    t_model = time.perf_counter()
    # ipc/nccl: the policy's parameters move into flat buckets so that a version is one copy
    # (before the engine, which reads them where they live).
    receiver, method = start_receiver(cfg, policy, device)
    # Every id that ends a completion: the tokenizer's EOS and the generation config's (Llama 3 and
    # Qwen2.5 list several).
    eos = eos_ids(tok, policy)
    engine, decoding = make_engine(cfg, policy, eos, tok.pad_token_id, device, decoding, path)
    log.info("start-up: %sdevice %.1f s, problems %.1f s, reward probe %.1f s, model %.1f s (%s), weight receiver "
             "and engine %.1f s", said_imports(times.get("imports")), times["device"], times["problems"], times["probe"],
             t_model - t_load,
             ", ".join(f"{k} {v:.1f} s" for k, v in load_times.items()), time.perf_counter() - t_model)
    rollout = RolloutModel(tok=tok, policy=policy, engine=engine, eos_ids=eos, device=device, path=path,
                           backend=decoding.backend, old_source=decoding.old_source, swaps=decoding.swaps)
    return rollout, receiver, method


def make_engine(cfg: SamplerConfig, policy, eos: list[int], pad_id: int, device: torch.device,
                decoding: Decoding, path: str = "") -> tuple[RolloutEngine | VllmEngine | None, Decoding]:
    """Our engine for the 'fast' backend (None for 'hf'; vLLM's for 'vllm', on the model folder `path`),
    and the decoding as it then is: on a model our engine cannot serve, Hugging Face generate with old
    log-probs from a pass."""
    backend, old_source, swaps = decoding.backend, decoding.old_source, decoding.swaps
    if cfg.rollout.generation_backend == "auto" and device.type == "cuda":
        # The launcher planned auto as our engine (grpo.rules.backend.backend_for); the measured rule
        # says which is faster at this model's size, and where it says vLLM the sampler says so
        # without switching: the plan's memory and rows were made for ours.
        name, why = auto_engine(sum(p.numel() for p in policy.parameters()), vllm_installed())
        log.info("%s%s", why, "" if name == backend else f"; this run keeps {backend}, as planned: pass "
                 f"--generation-backend {name} to use it")
    if backend == VLLM:
        engine = VllmEngine.build(path, policy, eos, compute_dtype(device), vllm_memory_share(cfg, policy, device),
                                  cfg.run.seed + 1000 * cfg.run.sampler_id, rows=cfg.rollout.in_flight_rows,
                                  tensor_parallel=cfg.rollout.vllm_tensor_parallel_size,
                                  cuda_graphs=cfg.rollout.cuda_graphs, engine_process=cfg.rollout.vllm_engine_process)
        if swaps and old_source != "sampling":
            log.info("--swap-in-flight: old log-probs from the sampling pass (--old-logprobs %s would choose a pass "
                     "with the weights at each group's end)", cfg.rollout.old_logprobs)
            old_source = "sampling"
        return engine, Decoding(backend, old_source, swaps)
    engine = (RolloutEngine(policy, eos, pad_id, cuda_graphs=cfg.rollout.cuda_graphs and device.type == "cuda",
                            compile_decode=cfg.rollout.compile_decode, attend_chunk=cfg.rollout.attend_chunk or None,
                            compile_ring=cfg.rollout.compile_ring and cfg.rollout.in_flight_rows > 0,
                            refill_behind=cfg.rollout.refill_behind, fused_sampling=cfg.rollout.fused_sampling,
                            liger_layers=cfg.rollout.liger_decode, fused_attention=cfg.rollout.fused_attention)
              if backend == "fast" else None)
    if engine is not None and engine.fallback is not None:
        # An architecture the engine cannot serve (its warning said why): Hugging Face generate,
        # old log-probs from a pass. In flight, the engine stays: it streams fixed batches through
        # generate.
        backend = "hf"
        old_source = "pass"
        if not cfg.rollout.in_flight_rows:
            engine = None
    if swaps and old_source != "sampling":
        # Each token's log-prob as drawn is under the version that drew it (on the fallback, a
        # pass over each batch before the next swap); a pass at the group's end is not.
        log.info("--swap-in-flight: old log-probs from the sampling pass (--old-logprobs %s would choose a pass "
                 "with the weights at each group's end)", cfg.rollout.old_logprobs)
        old_source = "sampling"
    return engine, Decoding(backend, old_source, swaps)


def vllm_memory_share(cfg: SamplerConfig, policy, device: torch.device) -> float:
    """vLLM's gpu_memory_utilization: --vllm-gpu-memory-utilization when set, else the memory plan's
    share for vLLM's items (grpo.rules.memory.vllm_items: its weights, the KV cache of this sampler's
    rows at the plan's prompt length, its workspace) of this GPU (vllm_gpu_fraction); over several
    GPUs (--vllm-tensor-parallel-size), each GPU's share of them, of the smallest of its GPUs."""
    given = cfg.rollout.vllm_gpu_memory_utilization
    if given:
        return given
    r = cfg.rollout
    rows = r.in_flight_rows or (r.prompts_per_round or r.max_prompts_per_round) * r.num_generations
    tp = r.vllm_tensor_parallel_size
    share, items = plan_share(policy, device, rows, r.max_new_tokens, tp)
    log.info("vLLM's memory share: %.2f of %s (%s; the memory plan's rule)", share,
             "this GPU" if tp == 1 else f"each of its {tp} GPUs", ", ".join(f"{k} {b / 2**30:.2f} GiB" for k, b in items))
    return share


def connect(cfg: SamplerConfig, curve, profiler: SpanProfiler, prompts: Prompts, rewards, rollout: RolloutModel,
            receiver, method: str) -> SamplerParts:
    """The sockets, the evaluation set, the GPU monitor, the counters, the weights client, the
    rollout workflow, the statuses and the heartbeat, wired to the loaded parts."""
    policy, device = rollout.policy, rollout.device
    # A restart under the same --sampler-id is a new process with fresh counts: the
    # learner's books tell the two apart by this random id.
    incarnation = secrets.randbits(48)
    data = DataSender(cfg.run.host, cfg.run.data_port, hwm=cfg.faults.send_hwm, curve=curve)
    # Accept weights up to float32 size whatever our own dtype: a learner may publish fp32.
    total = sum(p.numel() * 4 for p in policy.parameters())
    sync = SyncClient(cfg.run.host, cfg.run.sync_port, M.weights_limits(total + (64 << 20)), curve=curve)
    # Sampler 0 evaluates (greedy pass@1) at version 0 and at every multiple of --eval-every.
    eval_set = run_eval_problems(cfg) if cfg.evaluation.eval_every > 0 and cfg.run.sampler_id == 0 else None
    gpu = GpuMonitor(device)
    # What every status carries (a snapshot under its lock for the heartbeat thread); the curriculum's
    # per-task entries from the start (--curriculum: per task, level, groups and rate).
    counters = SamplerCounters(curriculum=prompts.window.stats())
    vocab_size = policy.get_input_embeddings().weight.shape[0]
    client = WeightsClient(cfg, sync, policy, device, vocab_size, receiver, method, counters,
                           on_levels=prompts.set_levels, incarnation=incarnation)
    if isinstance(rollout.engine, VllmEngine):
        rollout.engine.version_of = lambda: client.version   # a stream or batch first takes the policy's version
    workflow = RolloutWorkflow(cfg, prompts, rewards, rollout, client, counters, gpu, incarnation)
    statuses = Statuses(cfg.run.sampler_id, incarnation, counters, lambda: client.version)
    heartbeat = Heartbeat(DataSender(cfg.run.host, cfg.run.data_port, hwm=2, curve=curve),
                          cfg.faults.heartbeat_interval_s,
                          lambda: statuses(False))
    return SamplerParts(cfg=cfg, name=f"sampler{cfg.run.sampler_id}", profiler=profiler, prompts=prompts,
                        rewards=rewards, rollout=rollout, vocab_size=vocab_size, incarnation=incarnation, data=data,
                        sync=sync, eval_set=eval_set, gpu=gpu, counters=counters, client=client, workflow=workflow,
                        statuses=statuses, heartbeat=heartbeat)


def say_parts(parts: SamplerParts) -> None:
    """The sampler's start-up line: its shard, model, group size, round size and decoding."""
    cfg, swaps = parts.cfg, parts.swaps
    log.info("sampler %d/%d on %s: %d prompts in its shard, model %s, G=%d, %s prompts per round, "
             "%s generation%s, old log-probs from %s", cfg.run.sampler_id, cfg.run.num_samplers, parts.device,
             len(parts.prompts.mine), parts.model_path, cfg.rollout.num_generations,
             cfg.rollout.prompts_per_round or ("no fixed number of" if swaps else
                                       f"a step's worth of groups with signal (at most {cfg.rollout.max_prompts_per_round})"),
             parts.backend,
             (f", in flight on {cfg.rollout.in_flight_rows} rows" + (", weights swapped in flight, prompts started as "
                                                              "the learner's budget allows" if swaps else ""))
             if cfg.rollout.in_flight_rows else "",
             "the sampling pass" if parts.old_source == "sampling" else "a teacher-forced pass")
