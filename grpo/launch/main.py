"""run_distributed.py: parse the launcher's flags, check what can be checked before anything starts
(GPUs, ports, --reward, --resume), choose the split of --gpus (grpo.rules.layout), plan the
processes and hand them to the supervisor.

Up to the start of the workers nothing here imports torch, transformers, numpy or zmq: every
second the launcher spends importing comes before the first worker starts, and the workers import
them anyway. An rg: --dataset is checked against reasoning-gym's task registry, whose import takes
about 5 s on a GPU machine (sympy, matplotlib): that check runs on a thread beside the workers'
start-up (a Future the supervisor reads), and a bad task still ends the run with its one line.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from grpo.config import ROW_BUCKETS, CommonConfig, LaunchConfig, LearnerConfig, SamplerConfig
from grpo.data import tasks
from grpo.data.formats import load_transform
from grpo.data.plugins import PluginError
from grpo.data.rewards import RewardError, reward_set_from_config
from grpo.data.sources import DatasetUnavailable, load_problems, local_file
from grpo.flags import parse_config, to_flags
from grpo.launch import cpusize, nodes, probe, supervisor
from grpo.launch.ending import resume_command
from grpo.launch.plan import (LaunchError, check_gpus_flags, choose_gpus, instance_argv, parse, passthrough_flags,
                              plan, plan_instances)
from grpo.learner.resume import resolve_resume
from grpo.model.gguf.header import ModelUnavailable, gguf_model_file
from grpo.model.hub import check_hub_model
from grpo.obs.rundir import COMMIT_ENV, code_commit, create_run_dir, remove_created, save_config
from grpo.rules import layout, memory
from grpo.rules.backend import backend_for
from grpo.rules.staleness import IN_FLIGHT_SPAN, Staleness, bucket_prompts, first_round_groups
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


def check_resume(cfg: LaunchConfig, learner_flags: list[str]) -> None:
    """A --resume that cannot work is a one-line mistake here, not a learner crash later."""
    spec = ""
    for i, tok in enumerate(learner_flags):
        if tok == "--resume" and i + 1 < len(learner_flags):
            spec = learner_flags[i + 1]
        elif tok.startswith("--resume="):
            spec = tok.partition("=")[2]
    if not spec:
        return
    if spec == "latest" and not cfg.run_dir:
        raise LaunchError("--resume latest needs the --run-dir of the run to resume")

    try:
        resolve_resume(spec, Path(cfg.run_dir), cfg.max_steps)
    except ValueError as exc:
        raise LaunchError(str(exc)) from None


def check_model(model: str) -> None:
    """A --model path that is neither a model folder nor a GGUF file, or a hub id that can be neither
    fetched nor read from the cache, is a one-line mistake here, before any run folder or worker exists
    (grpo.model.gguf.header.gguf_model_file and grpo.model.hub.check_hub_model: the workers' own checks,
    torch-free)."""
    if model in probe.BUILT_FOLDERS:
        return

    try:
        hub_id = gguf_model_file(model) is None and not Path(model).expanduser().is_dir()
        # a hub id: the workers' check (grpo.model.zoo.resolve_model) here first, so a hub that does
        # not answer is one line now; when it turns offline mode on for a cached copy, the workers
        # inherit HF_HUB_OFFLINE=1 (the plan copies this environment) and load it at once
        if hub_id and (note := check_hub_model(model)):
            print(f"run_distributed.py: {note}", file=sys.stderr)
    except ModelUnavailable as exc:
        raise LaunchError(str(exc)) from None


def check_role_flags(specs: list) -> None:
    """Each role's flags parsed as its worker will parse them, before anything starts: a value out
    of its range (grpo.config.bounds) or of its type is one line and exit code 2 here, rather than
    a worker that fails after the launch, or a run that waits on a count no process can meet."""
    for role, cls in (("learner", LearnerConfig), ("sampler", SamplerConfig)):
        if argv := next((s.argv[2:] for s in specs if s.role == role), None):
            parse_config(cls, argv, "run_distributed.py")


def check_sampler_flags(flags: list[str]) -> str | None:
    """For the launcher, before anything starts: the one-line error a sampler started with `flags`
    would give for its --reward / --dataset-transform choice (imports and names only), or None."""
    cfg = parse_config(SamplerConfig, flags, "sampling_worker.py")
    try:
        local_file(cfg.dataset)   # a mistyped path; a hub id is the sampler's to fetch
        evaluated = cfg.eval_dataset or cfg.dataset
        if cfg.eval_every > 0 and local_file(evaluated, "test") is not None:
            # sampler 0's evaluation set, when local: a folder without a test split, or a file too small to
            # hold rows out, would otherwise end the run only after the learner is up (its one row read here)
            load_problems(evaluated, "test", limit=1)
        reward_set_from_config(cfg)
        load_transform(cfg.dataset_transform)
        if cfg.curriculum and not cfg.dataset.startswith("rg:"):
            tasks.start_levels(cfg.dataset)   # says why a curriculum needs rg: tasks
    except (RewardError, PluginError, tasks.TaskSpecError, DatasetUnavailable) as exc:
        return str(exc)
    return None


# The highest --max-staleness the launcher sets by itself so that in-flight rows are kept decoding,
# where the user left the bound at its default: the highest that runs with rows in flight have been
# measured at (docs/benchmarks.md). Past it the launcher only says which bound would fill the rows.
AUTO_STALENESS_MAX = 8

# The rows each sampler keeps in flight where the launcher chooses the layout (--gpus) and the user
# chose no --in-flight-rows: the pool the four- and two-GPU runs with rows in flight decoded
# (docs/benchmarks.md); its KV cache is in the memory plan like any other.
AUTO_IN_FLIGHT_ROWS = 320


def in_flight_note(sampler_flags: list[str], learner_flags: list[str], samplers: int) -> tuple[int, str] | None:
    """When samplers streaming in flight (--in-flight-rows with swaps) are given more rows than the
    learner's staleness bound lets them keep decoding (Staleness.pool_rows), the rest of the rows
    wait for budget and generation runs at the smaller batch: (the smallest bound that would keep
    them all decoding, the clause that says why). None otherwise."""
    scfg = parse_config(SamplerConfig, sampler_flags, "sampling_worker.py")
    if not scfg.in_flight_rows or not scfg.swap_in_flight or samplers < 1 or not decodes_with_engine(scfg):
        return None   # Hugging Face generate has no rows in flight (the sampler refuses the flag)
    lcfg = parse_config(LearnerConfig, learner_flags, "training_worker.py")
    G = scfg.num_generations
    rule = Staleness(lcfg.max_staleness, lcfg.train_batch_size // G)
    held = rule.pool_rows(G, samplers)
    if held >= scfg.in_flight_rows:
        return None
    need = rule.staleness_for_pool(scfg.in_flight_rows, G, samplers)
    who = f"each of the {samplers} samplers" if samplers > 1 else "the sampler"
    why = (f"at --max-staleness {lcfg.max_staleness} the learner's budget lets {who} keep about {held} of its "
           f"{scfg.in_flight_rows} --in-flight-rows decoding (--max-staleness x {rule.groups_per_step} groups a step / "
           f"samplers, {G} rows a group; more where zero-signal groups are filtered)")
    return need, why


def decodes_with_engine(scfg) -> bool:
    """Whether a sampler of this parsed config decodes with the fast engine (the only backend with
    rows in flight): its --generation-backend on its device, auto meaning the engine on CUDA."""
    return backend_for(scfg.generation_backend, "cpu" if scfg.device == "cpu" else "cuda") == "fast"


def left_default(flags: list[str], option: str, cls, prog: str) -> bool:
    """Whether `option` (a --flag of config class `cls`) is at its default: given neither as a flag
    nor (possibly) in a --config file. Only then may the launcher choose it."""
    if any(f == option or f.startswith(option + "=") for f in flags):
        return False
    return not parse_config(cls, flags, prog).config


def staleness_left_default(learner_flags: list[str]) -> bool:
    """Whether the learner's --max-staleness is its default (left_default)."""
    return left_default(learner_flags, "--max-staleness", LearnerConfig, "training_worker.py")


def in_flight_rows(sampler_flags: list[str], learner_flags: list[str], samplers: int, on_gpus: bool) -> int:
    """The rows in flight that suit these samplers, 0 for rounds. Rows need the samplers on GPUs
    (on_gpus), decoding with the engine and swapping weights in place (every method but shared:
    grpo.weights.methods.own_weights), with no --in-flight-rows of the user's; a sampler beside
    learner ranks on one GPU too, for then it decodes while they train instead of taking turns with
    them (docs/benchmarks.md, "One shared GPU"). Then AUTO_IN_FLIGHT_ROWS where the staleness bound keeps
    them all decoding, as given or as fill_in_flight_rows may raise a default one (up to
    AUTO_STALENESS_MAX); with a default bound where it cannot (more samplers share a step's groups,
    or steps are small), the rows AUTO_STALENESS_MAX - IN_FLIGHT_SPAN keeps decoding, whole groups,
    at least one: a smaller pool that never drains, where rounds would be budget-sized as well."""
    if not on_gpus or samplers < 1:
        return 0
    scfg = parse_config(SamplerConfig, sampler_flags, "sampling_worker.py")
    if (not left_default(sampler_flags, "--in-flight-rows", SamplerConfig, "sampling_worker.py")
            or not scfg.swap_in_flight or scfg.weight_sync == "shared"
            or not decodes_with_engine(scfg)):   # (numpy-free own_weights)
        return 0
    found = in_flight_note(sampler_flags + ["--in-flight-rows", str(AUTO_IN_FLIGHT_ROWS)], learner_flags, samplers)
    if found is None:
        return AUTO_IN_FLIGHT_ROWS
    if not staleness_left_default(learner_flags):
        return 0
    if found[0] + IN_FLIGHT_SPAN <= AUTO_STALENESS_MAX:
        return AUTO_IN_FLIGHT_ROWS
    lcfg = parse_config(LearnerConfig, learner_flags, "training_worker.py")
    G = scfg.num_generations
    rows = Staleness(AUTO_STALENESS_MAX - IN_FLIGHT_SPAN, lcfg.train_batch_size // G).pool_rows(G, samplers)
    return rows if rows >= G else 0


def choose_in_flight(sampler_flags: list[str], learner_flags: list[str], samplers: int, on_gpus: bool,
                     chosen: bool) -> list[str]:
    """The flags every sampler gets: where in_flight_rows gives rows and the layout is the launcher's
    to choose (--gpus), --in-flight-rows instead of fixed rounds (a round's rows idle through its
    longest completion), said in one line; with a layout given by hand none, and the line only says
    they would suit it."""
    n = in_flight_rows(sampler_flags, learner_flags, samplers, on_gpus)
    if not n:
        return []
    rows = ["--in-flight-rows", str(n)]
    if not chosen:
        print(f"run_distributed.py: note: the samplers decode in rounds, each row idle from its own end to its round's "
              f"longest; {' '.join(rows)} would keep every row decoding, weights swapped between decode steps "
              f"(--gpus chooses it)", file=sys.stderr)
        return []
    fewer = (f"; not {AUTO_IN_FLIGHT_ROWS}, which would need a --max-staleness past {AUTO_STALENESS_MAX} to keep "
             f"decoding" if n < AUTO_IN_FLIGHT_ROWS else "")
    print(f"run_distributed.py: {' '.join(rows)} on each sampler: they decode with the engine and swap weights "
          f"between decode steps, so a row starts its next sample as soon as its own ends instead of waiting for its "
          f"round's longest, and a sampler beside learner ranks decodes while they train (--in-flight-rows 0 for "
          f"fixed rounds){fewer}", file=sys.stderr)
    return rows


def fill_in_flight_rows(sampler_flags: list[str], learner_flags: list[str], samplers: int) -> list[str]:
    """The flags every learner rank gets: where streaming samplers' rows would wait on the staleness
    bound (in_flight_note), a default bound raised to the one that keeps them decoding and
    IN_FLIGHT_SPAN more, up to AUTO_STALENESS_MAX, said in one line; otherwise none, and the line
    says which bound would fill them."""
    found = in_flight_note(sampler_flags, learner_flags, samplers) if samplers else None
    if found is None:
        return []
    need, why = found
    bound = need + IN_FLIGHT_SPAN
    if bound <= AUTO_STALENESS_MAX and staleness_left_default(learner_flags):
        print(f"run_distributed.py: --max-staleness {bound}, not the default {LearnerConfig.max_staleness}, so that every "
              f"in-flight row is kept decoding: {why}; {need} fills them, and {IN_FLIGHT_SPAN} more are for the versions a "
              f"group's longest completion takes to generate; give --max-staleness to choose", file=sys.stderr)
        return ["--max-staleness", str(bound)]
    print(f"run_distributed.py: warning: {why}, and the other rows wait; --max-staleness {need} would keep all of "
          f"them decoding, with groups up to {need} versions old", file=sys.stderr)
    return []


def fit_first_round(sampler_flags: list[str], learner_flags: list[str], samplers: int, raised: list[str]) -> list[str]:
    """The flags every learner rank gets so that the samplers' round 0 is trained whole: a sampler
    may make it before the learner's first answer says the step's size and the budget (it does not
    wait for a learner still loading), and with small steps it then holds more groups of version 0
    than the bound trains (first_round_groups: 8 with the defaults, against 3 steps of 2 groups at
    --max-staleness 2, which dropped 2 of them). Where the user left the bound at its default and
    Staleness.staleness_for_first_round is above the bound in effect (the default, or `raised`:
    fill_in_flight_rows' flags), up to AUTO_STALENESS_MAX, that bound, said in one line (stdout); otherwise
    `raised` as it is (past AUTO_STALENESS_MAX, the run's end says what its groups' ages needed).
    Whatever the layout, one shared device included."""
    if samplers < 1 or not staleness_left_default(learner_flags):
        return raised
    scfg = parse_config(SamplerConfig, sampler_flags, "sampling_worker.py")
    lcfg = parse_config(LearnerConfig, learner_flags, "training_worker.py")
    G = scfg.num_generations
    # the engine with CUDA graphs pads a round to its smallest row bucket, so a round takes at least
    # that many prompts (RolloutWorkflow.bucket_prompts); Hugging Face generate and CPU have no floor
    graphs = decodes_with_engine(scfg) and scfg.cuda_graphs and scfg.device != "cpu"
    groups = first_round_groups(scfg.prompts_per_round, scfg.filter_zero_signal, scfg.max_prompts_per_round,
                                bucket_prompts(ROW_BUCKETS if graphs else (), G))
    rule = Staleness(lcfg.max_staleness, lcfg.train_batch_size // G)
    need = rule.staleness_for_first_round(groups, samplers)
    if need <= (int(raised[-1]) if raised else lcfg.max_staleness) or need > AUTO_STALENESS_MAX:
        return raised
    each = f"each of the {samplers} samplers may make" if samplers > 1 else "the sampler may make"
    # On stdout with the launcher's other start-up lines (the layout it chose among them), not on
    # stderr: this applies to nearly every default run, CPU ones included, and a launch refused
    # for a user's mistake says that mistake alone on stderr, in one line.
    print(f"[launcher] --max-staleness {need}, not the default {lcfg.max_staleness}, so that the learner trains every "
          f"group of the samplers' first round: {each} it before the learner's first answer says the step's size and "
          f"the budget, {groups} groups of version 0, and at --max-staleness {lcfg.max_staleness} the learner trains "
          f"{rule.largest_budget()} of {groups * samplers} ({lcfg.max_staleness + 1} steps of {rule.groups_per_step} "
          f"group{'s' * (rule.groups_per_step != 1)}); give --max-staleness to choose", flush=True)
    return ["--max-staleness", str(need)]


def in_flight_flags(sampler_flags: list[str], learner_flags: list[str], samplers: int, on_gpus: bool,
                    chosen: bool) -> tuple[list[str], list[str]]:
    """(the flags every sampler gets, those every learner rank gets): choose_in_flight, then
    fill_in_flight_rows for the rows the samplers end up with, and fit_first_round for their first
    round where that needs a larger bound still. One rule for one host and --nodes."""
    more = choose_in_flight(sampler_flags, learner_flags, samplers, on_gpus, chosen)
    filled = fill_in_flight_rows(sampler_flags + more, learner_flags, samplers)
    return more, fit_first_round(sampler_flags + more, learner_flags, samplers, filled)


def apply_in_flight(specs: list, chosen: bool) -> None:
    """in_flight_flags on one host's processes: the samplers are on GPUs where each sees one (its own,
    or one beside learner ranks)."""
    samplers = [s for s in specs if s.role == "sampler"]
    learners = [s for s in specs if s.role == "learner"]
    if not samplers or not learners:
        return
    on_gpus = all(s.env.get("CUDA_VISIBLE_DEVICES") for s in samplers)
    more_s, more_l = in_flight_flags(samplers[0].argv[2:], learners[0].argv[2:], len(samplers), on_gpus, chosen)
    for s in samplers:
        s.argv += more_s
    for s in learners:
        s.argv += more_l


def check_sampler_tasks(flags: list[str]) -> str | None:
    """The one-line error a sampler started with `flags` would give for its rg: tasks and their
    settings (reasoning-gym's registry and the tasks' config classes), or None. The launcher runs
    it on a thread beside the workers' start-up: reasoning-gym's import is its slowest."""
    cfg = parse_config(SamplerConfig, flags, "sampling_worker.py")
    if not cfg.dataset.startswith("rg:"):
        return None
    try:
        tasks.check(tasks.parse_spec(cfg.dataset[3:]), curriculum=cfg.curriculum)
    except tasks.TaskSpecError as exc:
        return str(exc)
    return None


# Imported by every worker before its model loads; without bytecode each process compiles them again.
BYTECODE_PACKAGES = ("torch", "transformers", "deepspeed")


def missing_bytecode(packages: tuple[str, ...] = BYTECODE_PACKAGES) -> list[str]:
    """Those of `packages` installed here whose top module has no bytecode where this interpreter
    looks for it (beside the source, or under PYTHONPYCACHEPREFIX). Finds, never imports."""
    missing = []
    for name in packages:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        origin = spec.origin if spec is not None else None
        if origin and origin.endswith(".py") and not os.path.exists(importlib.util.cache_from_source(origin)):
            missing.append(name)
    return missing


def bytecode_warning(dont_write: bool, missing: list[str]) -> str | None:
    """One line when the workers will compile their imports at every launch: the packages have no
    bytecode and the interpreter is told not to write any (PYTHONDONTWRITEBYTECODE=1, common in
    container images). Where it may write, the first run writes it and nothing needs saying."""
    if not dont_write or not missing:
        return None
    return (f"{', '.join(missing)} {'has' if len(missing) == 1 else 'have'} no bytecode and PYTHONDONTWRITEBYTECODE "
            f"(or python -B) is set, so every worker compiles {'its' if len(missing) == 1 else 'their'} imports again at each launch "
            f"(seconds of each worker's start-up); unset PYTHONDONTWRITEBYTECODE and set "
            f"PYTHONPYCACHEPREFIX to a writable folder (e.g. ~/.cache/pycache), or run python -m compileall on "
            f"them once")


def memory_inputs(cfg: LaunchConfig, learner_flags: list[str], sampler_flags: list[str], ranks: int,
                  samplers: int) -> tuple[memory.Shape, memory.RunShape] | None:
    """The model's shape and the run's (grpo.rules.memory) for learner ranks and samplers given
    these flags; None, said in one line, while neither the model's config.json nor (for the
    default model or a GGUF file) its GGUF is here to read."""
    shape, note = probe.read_shape(cfg.model)
    if shape is None:
        print(f"run_distributed.py: {note}", file=sys.stderr)
        return None
    lcfg = parse_config(LearnerConfig, learner_flags, "training_worker.py")
    scfg = parse_config(SamplerConfig, sampler_flags, "sampling_worker.py")
    ds = Path(lcfg.deepspeed_config)
    ds = ds if ds.is_absolute() or ds.exists() else Path(__file__).resolve().parents[2] / ds
    return shape, probe.run_shape(lcfg, scfg, ranks, samplers, str(ds))


def memory_plan(cfg: LaunchConfig, learner_flags: list[str], sampler_flags: list[str], ranks: int,
                samplers: int) -> dict | None:
    """The memory plan (grpo.rules.memory) of a run whose learner ranks and samplers get these
    flags; None when memory_inputs has none."""
    inputs = memory_inputs(cfg, learner_flags, sampler_flags, ranks, samplers)
    return None if inputs is None else memory.plan(*inputs)


def layout_inputs(cfg: LaunchConfig, learner_flags: list[str]) -> tuple[int | None, int]:
    """What --gpus costs a split by, besides the launcher's own flags: the model's parameters (read as
    the memory plan reads its shape; None where that is not here yet) and the learner's
    --train-batch-size."""
    shape, _ = probe.read_shape(cfg.model)
    lcfg = parse_config(LearnerConfig, to_flags(cfg, CommonConfig) + learner_flags, "training_worker.py")
    return (shape.params if shape else None), lcfg.train_batch_size


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


def node_in_flight(cfg: LaunchConfig, mp: nodes.MultiNodePlan, to_s: list[str], to_l: list[str],
                   chosen: bool) -> nodes.MultiNodePlan:
    """--nodes: in_flight_flags, the one-host rule, on the plan (CUDA plans only); the plan again with
    the flags it adds, or the same plan."""
    if not mp.cuda:
        return mp
    learners, samplers = mp.procs("learner"), mp.procs("sampler")
    more_s, more_l = in_flight_flags(samplers[0].argv[1:], learners[0].argv[1:], len(samplers), True, chosen)
    return nodes.plan_nodes(cfg, to_s + more_s, to_l + more_l) if more_s or more_l else mp


def print_node_plan(cfg: LaunchConfig, to_s: list[str], to_l: list[str], chosen: bool = False) -> int:
    """--nodes: print each node's processes, commands and memory (grpo.launch.nodes); start nothing.
    chosen: --gpus all chose the split, so the samplers' decoding is the launcher's to choose too."""
    try:
        mp = node_in_flight(cfg, nodes.plan_nodes(cfg, to_s, to_l), to_s, to_l, chosen)
        learners, samplers = mp.procs("learner"), mp.procs("sampler")
        if problem := check_sampler_flags(samplers[0].argv[1:]):
            raise LaunchError(problem)
    except LaunchError as exc:
        print(f"run_distributed.py: error: {exc}", file=sys.stderr)
        return 2
    totals = None
    if mp.cuda and (p := memory_plan(cfg, learners[0].argv[1:], samplers[0].argv[1:], len(learners),
                                     len(samplers))) is not None:
        print(memory.format_plan(p))
        totals = memory.gpu_totals(p, {q.name: (q.node, q.gpu) for q in mp.procs()})
    print(nodes.format_plan(mp, totals, cfg.share_gpus))
    return 0


def default_micro_tokens(learner_flags: list[str]) -> bool:
    """Whether the learner's --micro-batch-tokens is left at its default (0: a budget the launcher
    may shrink to fit); a budget the user gave, or -1 (fixed micro-batches), is kept as given."""
    return parse_config(LearnerConfig, learner_flags, "training_worker.py").micro_batch_tokens == 0


def check_memory(cfg: LaunchConfig, specs: list) -> None:
    """CUDA runs: log the memory plan (grpo.rules.memory), one line per process, and refuse one
    that will not fit its GPUs. Reads the model's config.json (or the GGUF header of the default model
    or of --model FILE.gguf); never builds or fetches a model."""
    if not any(s.env.get("CUDA_VISIBLE_DEVICES") for s in specs):
        return   # CPU: no plan
    learners = [s for s in specs if s.role == "learner"]
    samplers = [s for s in specs if s.role == "sampler"]
    inputs = memory_inputs(cfg, learners[0].argv[2:], samplers[0].argv[2:], len(learners), len(samplers))
    if inputs is None:
        return
    # learner rank r runs on the r-th GPU of its list; a sampler on the first of its own
    placement = {s.name: int(s.env["CUDA_VISIBLE_DEVICES"].split(",")[r]) for r, s in enumerate(learners)}
    placement.update({s.name: int(s.env["CUDA_VISIBLE_DEVICES"].split(",")[0]) for s in samplers})
    gpu_bytes = probe.gpu_total_bytes()
    p = memory.plan(*inputs)
    # float32 weights (autocast, the full fine-tuning default) may be all that keeps a plan off its
    # GPUs: the refusal then says that --precision bf16 fits
    problem = memory.check_fits(p, gpu_bytes, placement, bf16=memory.bf16_plan(*inputs))
    if problem and not cfg.no_memory_check and default_micro_tokens(learners[0].argv[2:]) and \
            (shrink := memory.fitting_micro_tokens(*inputs, gpu_bytes, placement)):
        # the default budget is sized for a GPU of its own; where it does not fit (a learner
        # sharing its GPU with a sampler, say) the learner packs smaller micro-batches instead
        print(f"run_distributed.py: learner micro-batches of at most {shrink} tokens, not the default "
              f"{inputs[1].micro_tokens}: "
              f"{problem.split('; ')[0].replace('the memory plan does not fit', 'at the default the plan does not fit')} "
              f"(--micro-batch-tokens sets it)", file=sys.stderr)
        inputs = (inputs[0], replace(inputs[1], micro_tokens=shrink))
        for s in learners:
            s.argv += ["--micro-batch-tokens", str(shrink)]
        p = memory.plan(*inputs)
        problem = memory.check_fits(p, gpu_bytes, placement, bf16=memory.bf16_plan(*inputs))
    print(memory.format_plan(p), file=sys.stderr)
    if problem:
        if cfg.no_memory_check:
            print(f"run_distributed.py: warning: {problem} (starting anyway: --no-memory-check)", file=sys.stderr)
        else:
            raise LaunchError(problem + "; or pass --no-memory-check to start anyway")
    elif tight := memory.check_tight(p, gpu_bytes, placement):
        print(f"run_distributed.py: warning: {tight}", file=sys.stderr)


def size_for_cpu(cfg: LaunchConfig, argv: list[str], to_s: list[str], to_l: list[str],
                 cuda_count: int) -> tuple[LaunchConfig, list[str], list[str], cpusize.CpuSizing | None]:
    """A run whose processes all run on CPU (--device cpu, or auto with no GPU here) at a CPU's size
    (grpo.launch.cpusize; say_cpu_sizing says it): (the config, the samplers' and the learner's
    flags, the sizing; None for a CUDA run, which is left as it is)."""
    if cfg.device == "cuda" or (cfg.device == "auto" and (cuda_count or cfg.sampling_gpus or cfg.training_gpus)):
        return cfg, to_s, to_l, None
    config = ["--config", cfg.config] if cfg.config else []   # as the workers will read it
    lcfg = parse_config(LearnerConfig, config + to_l, "training_worker.py")
    scfg = parse_config(SamplerConfig, config + to_s, "sampling_worker.py")
    sizing, more_l, more_s = cpusize.cpu_sizes(
        cpusize.given_names(argv, cfg.config), cfg.num_generations, lcfg.train_batch_size, cfg.max_new_tokens,
        lcfg.beta, scfg.prompts_per_round, cfg.max_steps, lcfg.max_time_s, cfg.num_samplers)
    return cpusize.apply(cfg, sizing), to_s + more_s, to_l + more_l, sizing


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


def main(argv: list[str] | None = None) -> int:
    cfg, to_s, to_l = parse(argv)
    chosen = bool(cfg.gpus)   # the layout is the launcher's to choose, how samplers decode included
    try:
        check_gpus_flags(cfg)
        if cfg.nodes and cfg.gpus:
            cfg, line = nodes.choose_nodes_split(cfg, *layout_inputs(cfg, to_l), read_rates(cfg.layout_from))
            print(line, flush=True)
    except LaunchError as exc:
        print(f"run_distributed.py: error: {exc}", file=sys.stderr)
        return 2
    if cfg.nodes:
        return print_node_plan(cfg, to_s, to_l, chosen)
    try:
        check_model(cfg.model)
        cuda_count = 0 if cfg.device == "cpu" else cuda_device_count()
        if cfg.gpus:
            # from here on, the run of the explicit flags the choice stands for
            cfg, line = choose_gpus(cfg, cuda_count, *layout_inputs(cfg, to_l), read_rates(cfg.layout_from))
            print(f"[launcher] {line}", flush=True)
        cfg, to_s, to_l, sizing = size_for_cpu(cfg, argv if argv is not None else sys.argv[1:], to_s, to_l,
                                               cuda_count)
        if cfg.instances != 1 or cfg.seeds:
            instances = plan_instances(cfg, cuda_count)
        else:
            specs = plan(cfg, cuda_count, to_s, to_l, free_port())
            check_role_flags(specs)
            # a bad --reward fails before any model loads

            if samplers_argv := [s.argv[2:] for s in specs if s.role == "sampler"]:
                if problem := check_sampler_flags(samplers_argv[0]):
                    raise LaunchError(problem)
            check_resume(cfg, to_l)
            apply_in_flight(specs, chosen)
            check_memory(cfg, specs)
            if cfg.data_port == cfg.sync_port:
                raise LaunchError("--data-port and --sync-port are equal; give them different ports")
            check_ports(cfg.host, [(cfg.data_port, "--data-port"), (cfg.sync_port, "--sync-port")])
    except LaunchError as exc:
        print(f"run_distributed.py: error: {exc}", file=sys.stderr)
        return 2
    if note := bytecode_warning(sys.dont_write_bytecode, missing_bytecode()):
        print(f"run_distributed.py: warning: {note}", file=sys.stderr)
    slow = say_cpu_sizing(sizing, cfg.model)

    if cfg.instances != 1 or cfg.seeds:
        if slow:
            print(f"run_distributed.py: warning: {slow}", file=sys.stderr)
        # each instance's launcher gets the CPU sizes chosen here as flags, so it keeps them as given
        passthrough = passthrough_flags(argv if argv is not None else sys.argv[1:]) + \
            (cpusize.worker_flags(sizing) if sizing else [])
        for inst in instances:
            inst.run_dir = inst.run_dir.resolve()   # the child launchers run in the repo root
        base = Path(cfg.run_dir or "runs").resolve()
        return supervisor.run_instances(cfg, instances, [instance_argv(cfg, inst, passthrough) for inst in instances],
                                        base)

    run_dir, made = create_run_dir(cfg.run_dir)   # made: the outermost folder this run made (runs/ on a first run)
    run_dir = run_dir.resolve()
    commit = code_commit()   # asked of git once; the workers' run files record it from their environment
    for spec in specs:
        spec.argv += ["--run-dir", str(run_dir)]
        if commit:
            spec.env.setdefault(COMMIT_ENV, commit)
    save_config(run_dir, "launch", cfg)
    # started with the workers, read by the supervisor while they start (a run that ends before
    # it, on an early failure, still waits for it at exit: seconds, its import)
    tasks_check = None
    if samplers_argv:
        pool = ThreadPoolExecutor(1, thread_name_prefix="launch-check")
        tasks_check = pool.submit(check_sampler_tasks, samplers_argv[0])
        pool.shutdown(wait=False)

    resume = resume_command(argv if argv is not None else sys.argv[1:], run_dir, bool(cfg.run_dir))
    rc = supervisor.run(cfg, specs, run_dir, tasks_check, resume, warnings=(slow,) if slow else ())
    if rc == 2:
        # refused (a worker's or a launch check's one-line mistake, said already): nothing is left
        # behind, as for the mistakes found before the run folder was made; a folder that existed is kept
        remove_created(run_dir, made)
    return rc
