"""run_distributed.py: parse the launcher's flags and each role's into a RunPlan (grpo.launch.runplan),
check what can be checked before anything starts (GPUs, ports, --reward, --resume), resolve the
launcher's choices on the plan (the split of --gpus, the CPU sizes, rows in flight, the staleness
bound, the memory plan) and hand its processes to the supervisor, argv written only then.

Up to the start of the workers nothing here imports torch, transformers, numpy or zmq: every
second the launcher spends importing comes before the first worker starts, and the workers import
them anyway. An rg: --dataset is checked against reasoning-gym's task registry, whose import takes
about 5 s on a GPU machine (sympy, matplotlib): that check runs on a thread beside the workers'
start-up (a Future the supervisor reads), and a bad task still ends the run with its one line.
"""
from __future__ import annotations

import json
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from grpo.config import LearnerConfig, SamplerConfig, flat, from_flat
from grpo.flags import parse_config
from grpo.launch import cpusize, memfit, nodes, probe, supervisor
from grpo.launch.checks import (bytecode_warning, check_model, check_resume, check_tensor_parallel_model,
                                missing_bytecode, sampler_problem, sampler_tasks_problem)
from grpo.launch.ending import resume_command
from grpo.launch.inflight import resolve_in_flight
from grpo.launch.memfit import check_memory, memory_inputs
from grpo.launch.plan import (LaunchError, check_gpus_flags, check_tensor_parallel, choose_gpus, instance_argv, parse,
                              passthrough_flags, place, plan_instances, specs)
from grpo.launch.runplan import Placement, RunPlan, changed_flags, from_flags, given_names, with_launch, with_placement
from grpo.obs.rundir import COMMIT_ENV, code_commit, create_run_dir, remove_created, save_config
from grpo.rules import layout, memory
from grpo.wire.ports import busy_ports_line, free_port, port_in_use


def cuda_device_count() -> int:
    """The GPUs the CUDA driver sees; 0 when there is no driver or no GPU, as
    torch.cuda.is_available() False gave before (grpo.launch.probe.cuda_driver: no torch)."""
    driver = probe.cuda_driver()
    return driver[1] if driver else 0


def check_ports(host: str, ports: list[tuple[int, str]]) -> None:
    """(port, flag) for each port the learner will bind: all are tried, then one line names every
    one taken (grpo.wire.ports), so a second busy port is not learnt of only after the first is freed."""
    if busy := [(port, flag) for port, flag in ports if port_in_use(host, port)]:
        raise LaunchError(busy_ports_line(host, busy))


def check_role_flags(procs: list) -> None:
    """Each process's argv parsed as its worker will parse it: a value out of its range or type is
    one line and exit code 2 here, not a worker that fails after the launch."""
    for p in procs:
        parse_config(LearnerConfig if p.role == "learner" else SamplerConfig, p.flags, "run_distributed.py")


def check_sampler_flags(flags: list[str]) -> str | None:
    """sampler_problem for a sampler started with `flags`."""
    return sampler_problem(parse_config(SamplerConfig, flags, "sampling_worker.py"))


def layout_costs(rp: RunPlan) -> tuple[int | None, int]:
    """What --gpus costs a split by, besides the launcher's own flags: the model's parameters (read as
    the memory plan reads its shape; None where that is not here yet) and the learner's
    --train-batch-size."""
    shape, _ = probe.read_shape(rp.launch.run.model)
    return (shape.params if shape else None), rp.learner.training.train_batch_size


def layout_inputs(cfg, learner_flags: list[str]) -> tuple[int | None, int]:
    """layout_costs of the run of the launcher's config and these learner flags."""
    return layout_costs(from_flags(cfg, [], learner_flags))


def memory_plan(cfg, learner_flags: list[str], sampler_flags: list[str], ranks: int, samplers: int) -> dict | None:
    """The memory plan of the run whose learner ranks and samplers get these worker flags (bench/scale.py)."""
    rp = RunPlan(cfg, parse_config(SamplerConfig, sampler_flags, "sampling_worker.py"),
                 parse_config(LearnerConfig, learner_flags, "training_worker.py"))
    inputs = memory_inputs(rp, ranks, samplers)
    return None if inputs is None else memory.plan(*inputs)


def read_rates(run_dir: str) -> layout.Rates | None:
    """--layout-from: an earlier run's measured rates (grpo.rules.layout.rates_from_run) from its
    metrics.jsonl, summary.json, config_launch.json and config_learner.json; None without the flag."""
    if not run_dir:
        return None
    folder = Path(run_dir)
    try:
        metrics = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines() if x.strip()]
        summary, launch, learner = (json.loads((folder / name).read_text())
                                    for name in ("summary.json", "config_launch.json", "config_learner.json"))
        return layout.rates_from_run(metrics, summary, launch, learner, run_dir)
    except OSError as exc:
        raise LaunchError(f"--layout-from {run_dir}: cannot read {Path(exc.filename or run_dir).name} there; give "
                          f"a finished run's folder, or drop --layout-from") from None
    except (ValueError, KeyError, TypeError) as exc:
        reason = str(exc) if isinstance(exc, ValueError) else f"no {exc} in its files"
        raise LaunchError(f"--layout-from {run_dir}: {reason}; give another run's folder, or drop --layout-from") \
            from None


def node_in_flight(rp: RunPlan, mp: nodes.MultiNodePlan) -> tuple[RunPlan, nodes.MultiNodePlan]:
    """--nodes: resolve_in_flight, the one-host rule, on a CUDA plan's processes: (the plan resolved,
    the node plan again with its choices on the commands, or the same node plan)."""
    placed = with_placement(rp, Placement(mp.cuda, len(mp.procs("learner")), len(mp.procs("sampler"))))
    if not mp.cuda:
        return placed, mp
    resolved = resolve_in_flight(placed, placed.placement.samplers, True)
    more_s, more_l = changed_flags(placed.sampler, resolved.sampler), changed_flags(placed.learner, resolved.learner)
    if more_s or more_l:   # printed commands: the flags as typed, then the launcher's choices
        mp = nodes.plan_nodes(rp.launch, [*rp.sampler_flags, *more_s], [*rp.learner_flags, *more_l])
    return resolved, mp


def print_node_plan(rp: RunPlan) -> int:
    """--nodes: print each node's processes, commands and memory (grpo.launch.nodes); start nothing."""
    try:
        rp, mp = node_in_flight(rp, nodes.plan_nodes(rp.launch, list(rp.sampler_flags), list(rp.learner_flags)))
        if problem := sampler_problem(rp.sampler):
            raise LaunchError(problem)
    except LaunchError as exc:
        return refuse(exc)
    totals = None
    if mp.cuda and (p := memfit.memory_plan(rp, rp.placement.ranks, rp.placement.samplers)) is not None:
        print(memory.format_plan(p))
        totals = memory.gpu_totals(p, {q.name: (q.node, q.gpu) for q in mp.procs()})
    print(nodes.format_plan(mp, totals, rp.launch.placement.share_gpus))
    return 0


def size_for_cpu(rp: RunPlan, argv: list[str], cuda_count: int) -> tuple[RunPlan, cpusize.CpuSizing | None]:
    """A run whose processes all run on CPU (--device cpu, or auto with no GPU here) at a CPU's size
    (grpo.launch.cpusize; say_cpu_sizing says it): (the plan, the sizing; None for a CUDA run, which
    is left as it is)."""
    cfg = rp.launch
    gpus = cfg.placement.sampling_gpus or cfg.placement.training_gpus
    if cfg.run.device == "cuda" or (cfg.run.device == "auto" and (cuda_count or gpus)):
        return rp, None
    sizing, learner, sampler = cpusize.cpu_sizes(
        given_names(argv, cfg.run.config), cfg.rollout.num_generations, rp.learner.training.train_batch_size,
        cfg.rollout.max_new_tokens, rp.learner.loss.beta, rp.sampler.rollout.prompts_per_round, cfg.training.max_steps,
        rp.learner.training.max_time_s, cfg.placement.num_samplers)
    # the sizes come by flag name, each role's in whichever section it keeps them
    rp = replace(rp, sampler=from_flat(SamplerConfig, flat(rp.sampler), **sampler),
                 learner=from_flat(LearnerConfig, flat(rp.learner), **learner))
    return with_launch(rp, cpusize.apply(cfg, sizing)), sizing


def say_cpu_sizing(sizing: cpusize.CpuSizing | None, model: str) -> str | None:
    """The CPU sizing's line (stdout, with the launcher's other choices), once the launch checks
    passed; returns the slow-run warning, for the supervisor to say once the run is sure to start
    (the sampler's task check runs beside the start-up): a refused launch says its mistake alone."""
    if sizing is None:
        return None
    if line := cpusize.sizing_line(sizing):
        print(line, flush=True)
    if shape := probe.read_shape(model)[0]:
        return cpusize.slow_warning(shape.params, sizing)
    return None


def tensor_parallel(rp: RunPlan) -> int:
    """GPUs per sampler: the samplers' --vllm-tensor-parallel-size (grpo.rules.tensor_parallel)."""
    return rp.sampler.rollout.vllm_tensor_parallel_size


def choose_layout(rp: RunPlan, cuda_count: int) -> RunPlan:
    """--gpus: the split chosen (grpo.rules.layout) and said; from here on the plan is the run of the
    explicit flags the choice stands for."""
    cfg, line = choose_gpus(rp.launch, cuda_count, *layout_costs(rp), read_rates(rp.launch.placement.layout_from),
                            tensor_parallel(rp))
    print(f"[launcher] {line}", flush=True)
    return with_launch(rp, cfg)


def resolve(rp: RunPlan, cuda_count: int) -> RunPlan:
    """One host's run: placed, checked, and every choice the launcher makes on it made, in order."""
    rp = with_placement(rp, place(rp.launch, cuda_count, tensor_parallel(rp)))
    check_tensor_parallel_model(rp)   # the model's widths against the GPUs a sampler spreads over
    if problem := sampler_problem(rp.sampler):   # a bad --reward fails before any model loads
        raise LaunchError(problem)
    check_resume(rp)
    rp = check_memory(resolve_in_flight(rp, rp.placement.samplers, rp.placement.cuda))
    cfg = rp.launch
    if cfg.run.data_port == cfg.run.sync_port:
        raise LaunchError("--data-port and --sync-port are equal; give them different ports")
    check_ports(cfg.run.host, [(cfg.run.data_port, "--data-port"), (cfg.run.sync_port, "--sync-port")])
    return rp


def refuse(exc: LaunchError) -> int:
    print(f"run_distributed.py: error: {exc}", file=sys.stderr)
    return 2


def start_instances(rp: RunPlan, instances: list, argv: list[str], sizing, slow: str | None) -> int:
    """Seeded instances: one child launcher each, with the CPU sizes chosen here as flags, so that it
    keeps them as given."""
    cfg = rp.launch
    if slow:
        print(f"run_distributed.py: warning: {slow}", file=sys.stderr)
    passthrough = passthrough_flags(argv) + (cpusize.worker_flags(sizing) if sizing else [])
    for inst in instances:
        inst.run_dir = inst.run_dir.resolve()   # the child launchers run in the repo root
    base = Path(cfg.run.run_dir or "runs").resolve()
    return supervisor.run_instances(cfg, instances, [instance_argv(cfg, inst, passthrough) for inst in instances],
                                    base)


def in_background(check, *args) -> Future:
    """`check(*args)` on a thread of its own: the supervisor reads it while the workers start (a run
    that ends before it, on an early failure, still waits for it at exit: seconds, its import)."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="launch-check")
    future = pool.submit(check, *args)
    pool.shutdown(wait=False)
    return future


def start(rp: RunPlan, argv: list[str], slow: str | None) -> int:
    """The run folder, each process's argv and environment, and the supervisor."""
    run_dir, made = create_run_dir(rp.launch.run.run_dir)   # made: the outermost folder this run made
    run_dir = run_dir.resolve()
    run = rp.launch.run
    procs = specs(rp, free_port(avoid=(run.data_port, run.sync_port)), str(run_dir))   # the rendezvous port
    if commit := code_commit():   # asked of git once; the workers' run files record it from their environment
        for p in procs:
            p.env.setdefault(COMMIT_ENV, commit)
    save_config(run_dir, "launch", rp.launch)
    tasks_check = in_background(sampler_tasks_problem, rp.sampler)
    resume = resume_command(argv, run_dir, bool(rp.launch.run.run_dir))
    rc = supervisor.run(rp.launch, procs, run_dir, tasks_check, resume, warnings=(slow,) if slow else ())
    if rc == 2:
        # refused (a worker's or a launch check's one-line mistake, said already): nothing is left
        # behind, as for the mistakes found before the run folder was made; a folder that existed is kept
        remove_created(run_dir, made)
    return rc


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    cfg, to_s, to_l = parse(argv)
    rp = from_flags(cfg, to_s, to_l,
                    chosen=bool(cfg.placement.gpus))   # --gpus: how samplers decode is ours to choose too
    try:
        check_gpus_flags(cfg)
        if cfg.nodes.nodes:
            check_tensor_parallel(cfg, tensor_parallel(rp), cfg.run.device != "cpu")
        if cfg.nodes.nodes and cfg.placement.gpus:
            split, line = nodes.choose_nodes_split(cfg, *layout_costs(rp), read_rates(cfg.placement.layout_from))
            print(line, flush=True)
            rp = with_launch(rp, split)
    except LaunchError as exc:
        return refuse(exc)
    if cfg.nodes.nodes:
        return print_node_plan(rp)
    instances = None
    try:
        check_model(cfg.run.model)
        cuda_count = 0 if cfg.run.device == "cpu" else cuda_device_count()
        rp = choose_layout(rp, cuda_count) if cfg.placement.gpus else rp
        rp, sizing = size_for_cpu(rp, argv, cuda_count)
        if cfg.instances.instances != 1 or cfg.instances.seeds:
            instances = plan_instances(rp.launch, cuda_count, tensor_parallel(rp))
        else:
            rp = resolve(rp, cuda_count)
    except LaunchError as exc:
        return refuse(exc)
    if note := bytecode_warning(sys.dont_write_bytecode, missing_bytecode()):
        print(f"run_distributed.py: warning: {note}", file=sys.stderr)
    slow = say_cpu_sizing(sizing, rp.launch.run.model)
    return start(rp, argv, slow) if instances is None else start_instances(rp, instances, argv, sizing, slow)
