"""The launch plan, pure: the launcher's flags, and which process gets which GPUs, flags, ports,
environment and run directory. Tested without GPUs; grpo.launch.supervisor runs the plan.

With --gpus the split is chosen first (grpo.rules.layout, choose_gpus) and the plan is the one
of the explicit flags it stands for.

A single run: learner ranks get every training GPU visible and LOCAL_RANK set, as torchrun and
the deepspeed launcher do; each sampler sees its own GPU first (a vLLM sampler over N GPUs: its N
consecutive --sampling-gpus, grpo.rules.tensor_parallel), then learner rank 0's (for CUDA IPC
weight sync). Flags the launcher does not own go to the sampler and/or learner that
know them (`split_passthrough`); `--help` lists them too, grouped by who receives them. They are
parsed once into the RunPlan (grpo.launch.runplan), `place` puts its processes on the GPUs, and
`specs` writes each one's argv from its config, once every choice is made.

Seeded instances (`--instances K --seeds 42,1337,...`): each instance is an ordinary single run
started by its own child launcher, with its own GPUs, ports, seed and run directory
(`<run-dir or runs>/<name>_seed<seed>`):
  GPUs   with --sampling-gpus/--training-gpus: that pattern is instance 0's, and instance k
         gets it shifted by k * (highest id + 1); without them, the machine's GPUs are split
         into K equal blocks, the first GPU of a block sampling and the rest training.
  ports  instance k: --data-port + 2k and --sync-port + 2k (defaults 5555/5556: 5557/5558, ...).
"""
from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from grpo.config import LaunchConfig, LearnerConfig, PlacementSection, SamplerConfig, flat_fields, from_flat
from grpo.config.cli import unknown_flag
from grpo.flags import (ArgumentParser, add_fields, apply_config_file, build_parser, parse_config,
                        section_groups, to_flags)
from grpo.launch.runplan import PLANNED_ENV, Placement, RunPlan, from_flags, with_placement, worker_argv
from grpo.rules import layout
from grpo.rules.tensor_parallel import FLAG as TP_FLAG
from grpo.rules.tensor_parallel import sampler_groups, tensor_parallel_problem, visible_devices

ROOT = Path(__file__).resolve().parents[2]
ALIASES = {"sampling_gpus": ["--sampling-gpu"], "training_gpus": ["--training-gpu"]}
# Set by the launcher for each process it starts, so not listed as options it passes on.
SET_BY_LAUNCHER = ("gpu_id", "sampler_id", "num_samplers", "extra")


# Written on every sampler's command line, defaults or not: which one it is, in its log and in `ps`.
WHICH_SAMPLER = ("sampler_id", "num_samplers")


class LaunchError(ValueError):
    """A launch mistake; one line with the fix."""


@dataclass
class ProcSpec:
    name: str
    argv: list[str]
    env: dict[str, str]
    role: str  # "learner" or "sampler"

    @property
    def flags(self) -> list[str]:
        """The worker's flags: argv after the interpreter and the script (or `-m grpo.workers ROLE`)."""
        return self.argv[4:] if self.argv[1:2] == ["-m"] else self.argv[2:]


def parse_gpus(text: str, flag: str) -> list[int]:
    if not text.strip():
        return []
    try:
        ids = [int(x) for x in text.replace(" ", "").strip(",").split(",")]
    except ValueError:
        raise LaunchError(f"{flag} {text!r}: expected comma-separated GPU ids like 1,2,3") from None
    if any(i < 0 for i in ids):
        raise LaunchError(f"{flag} {text!r}: GPU ids are >= 0")
    if len(set(ids)) != len(ids):
        raise LaunchError(f"{flag} {text!r} lists a GPU twice; list each GPU once")
    return ids


def check_gpus_flags(cfg: LaunchConfig) -> None:
    """--gpus and --layout-from against the other flags: mistakes known before anything is counted."""
    if cfg.placement.layout_from and not cfg.placement.gpus:
        raise LaunchError("--layout-from costs the split that --gpus chooses; add --gpus, or drop --layout-from")
    if not cfg.placement.gpus:
        return
    given = [flag for flag, value in (("--sampling-gpus", cfg.placement.sampling_gpus), ("--training-gpus",
                                                                                         cfg.placement.training_gpus),
                                      ("--share-gpus", cfg.placement.share_gpus)) if value]
    if given:
        raise LaunchError(f"--gpus chooses which GPUs sample and which train, but {'/'.join(given)} "
                          f"{'gives' if len(given) == 1 else 'give'} that too: drop --gpus to give the split "
                          f"yourself, or drop {'/'.join(given)} to let --gpus choose")
    if cfg.run.device == "cpu":
        raise LaunchError("--gpus lists GPUs but --device is cpu: drop --gpus (on CPU, --training-ranks and "
                          "--num-samplers give the processes)")
    if cfg.instances.instances != 1 or cfg.instances.seeds:
        raise LaunchError("--gpus chooses one run's split; with --instances/--seeds give instance 0's "
                          "--sampling-gpus and --training-gpus, or neither (the GPUs are split into equal blocks)")
    if cfg.nodes.nodes:
        if cfg.placement.gpus.strip() != "all":
            raise LaunchError(f"--gpus {cfg.placement.gpus} with --nodes: the nodes list their own GPUs; pass --gpus all")
        placed = cfg.placement
        if (placed.training_ranks != PlacementSection.training_ranks
                or placed.num_samplers != PlacementSection.num_samplers):
            raise LaunchError("--gpus all chooses --training-ranks and --num-samplers over --nodes; drop them to "
                              "let it, or drop --gpus to give them yourself")


def gpus_to_lay_out(text: str, cuda_count: int) -> list[int]:
    """--gpus as GPU ids: 'all' is every GPU CUDA sees here; listed ids must exist."""
    if cuda_count == 0:
        raise LaunchError("--gpus asks for GPUs but CUDA is not available here; use --device cpu (with "
                          "--training-ranks and --num-samplers)")
    if text.strip() == "all":
        return list(range(cuda_count))
    ids = parse_gpus(text, "--gpus")
    if not ids:
        raise LaunchError("--gpus is empty; list GPU ids like 0,1,2,3, or pass --gpus all")
    if missing := [g for g in ids if g >= cuda_count]:
        raise LaunchError(f"GPU {missing[0]} does not exist: this machine has {cuda_count} GPU(s) "
                          f"(0..{cuda_count - 1}); fix --gpus")
    return ids


def choose_gpus(cfg: LaunchConfig, cuda_count: int, params: int | None, train_batch_size: int,
                rates: layout.Rates | None = None, tp: int = 1) -> tuple[LaunchConfig, str]:
    """(the config as if the chosen --sampling-gpus/--training-gpus/--share-gpus had been typed in
    place of --gpus, the layout line that says so). `params`: the model's parameters (None: unknown);
    `tp`: GPUs per sampler (--vllm-tensor-parallel-size), so each sampler takes that many."""
    ids = gpus_to_lay_out(cfg.placement.gpus, cuda_count)
    check_tensor_parallel(cfg, tp, True)
    try:
        choice = layout.choose_layout(ids, params, cfg.rollout.max_new_tokens, train_batch_size,
                                      cfg.rollout.num_generations, rates, tp)
    except ValueError as exc:
        raise LaunchError(str(exc)) from None
    placement = dataclasses.replace(cfg.placement, gpus="", layout_from="", share_gpus=choice.share,
                                    sampling_gpus=",".join(map(str, choice.sampling_gpus)),
                                    training_gpus=",".join(map(str, choice.training_gpus)))
    chosen = dataclasses.replace(cfg, placement=placement)
    return chosen, layout.layout_line(cfg.placement.gpus.strip(), choice)


def _fields(cls) -> dict[str, dataclasses.Field]:
    return {name: f for name, (_, f) in flat_fields(cls).items()}


def split_passthrough(rest: list[str]) -> tuple[list[str], list[str]]:
    """Route flags the launcher does not own to the sampler and/or learner that know them."""
    samp, learn = _fields(SamplerConfig), _fields(LearnerConfig)
    to_s: list[str] = []
    to_l: list[str] = []
    i = 0
    while i < len(rest):
        tok = rest[i]
        if not tok.startswith("--"):
            raise LaunchError(f"unexpected argument {tok!r}; flags look like --name value")
        name, _, inline = tok[2:].partition("=")
        key = name.replace("-", "_")
        neg = key.startswith("no_") and key[3:] in {**samp, **learn} and key not in {**samp, **learn}
        base = key[3:] if neg else key
        if base not in samp and base not in learn:
            # the nearest of every flag the launcher takes, its own and those it passes on (its --help's)
            raise LaunchError(unknown_flag(f"--{name}", launcher_parser(with_workers=True).option_names()))
        field = samp.get(base) or learn[base]
        is_bool = field.type in (bool, "bool")
        group = [tok]
        if not is_bool and not inline:
            if i + 1 >= len(rest):
                raise LaunchError(f"--{name} needs a value")
            group.append(rest[i + 1])
            i += 1
        if base in samp:
            to_s += group
        if base in learn:
            to_l += group
        i += 1
    return to_s, to_l


def _resolve_gpus(cfg: LaunchConfig, cuda_count: int) -> tuple[list[int], list[int], bool]:
    """(--sampling-gpus, --training-gpus as ids, whether the run uses CUDA): --device cuda or cpu
    says so; auto uses CUDA when GPUs are listed or CUDA sees any here. One resolution for a single
    run (plan) and for seeded instances (plan_instances), so both refuse the same mistakes in the
    same words; what empty lists then mean (defaults, equal blocks) is each one's own."""
    samp = parse_gpus(cfg.placement.sampling_gpus, "--sampling-gpus")
    train = parse_gpus(cfg.placement.training_gpus, "--training-gpus")
    if cfg.run.device == "cpu" and (samp or train):
        raise LaunchError("--device cpu with --sampling-gpus/--training-gpus; drop the GPU lists or the --device cpu")
    use_cuda = cfg.run.device == "cuda" or (cfg.run.device == "auto" and bool(samp or train or cuda_count > 0))
    if use_cuda and cuda_count == 0:
        raise LaunchError("GPUs were asked for but CUDA is not available here; use --device cpu")
    return samp, train, use_cuda


def check_tensor_parallel(cfg: LaunchConfig, tp: int, use_cuda: bool) -> None:
    """A sampler over `tp` GPUs that cannot work (grpo.rules.tensor_parallel): one line, before anything loads."""
    problem = tensor_parallel_problem(tp, cfg.rollout.generation_backend, "cuda" if use_cuda else "cpu",
                                      cfg.weight_sync.weight_sync, cfg.nodes.nodes)
    if problem:
        raise LaunchError(problem)


def place(cfg: LaunchConfig, cuda_count: int, tp: int = 1) -> Placement:
    """Where one host's processes run: the GPU lists (defaults filled) or, on CPU, the counts; each
    sampler over `tp` GPUs (--vllm-tensor-parallel-size)."""
    samp_gpus, train_gpus, use_cuda = _resolve_gpus(cfg, cuda_count)
    check_tensor_parallel(cfg, tp, use_cuda)
    if not use_cuda:
        if cfg.placement.training_ranks < 1 or cfg.placement.num_samplers < 1:
            raise LaunchError("--training-ranks and --num-samplers must be >= 1")
        return _one_process_learner(cfg, Placement(False, cfg.placement.training_ranks, cfg.placement.num_samplers))
    if not samp_gpus and tp > cuda_count:
        raise LaunchError(f"{TP_FLAG} {tp}: a sampler takes {tp} GPUs, but this machine has {cuda_count}; "
                          f"lower {TP_FLAG}")
    # the defaults: one sampler on the first GPU(s), the learner on the next one (or the first, with one GPU)
    samp_gpus = samp_gpus or list(range(tp))
    train_gpus = train_gpus or ([tp] if cuda_count > tp else [0])
    try:
        groups = sampler_groups(samp_gpus, tp)
    except ValueError as exc:
        raise LaunchError(str(exc)) from None
    shared = sorted(set(samp_gpus) & set(train_gpus))
    if shared and (cfg.placement.sampling_gpus or cfg.placement.training_gpus) and not cfg.placement.share_gpus:
        raise LaunchError(f"GPU(s) {','.join(map(str, shared))} in both --sampling-gpus and --training-gpus; "
                          f"give disjoint lists, or add --share-gpus to put a sampler beside learner ranks")
    for g in samp_gpus + train_gpus:
        if g >= cuda_count:
            raise LaunchError(f"GPU {g} does not exist: this machine has {cuda_count} GPU(s) "
                              f"(0..{cuda_count - 1}); fix --sampling-gpus/--training-gpus")
    return _one_process_learner(cfg, Placement(True, len(train_gpus), len(groups), tuple(train_gpus),
                                               tuple(samp_gpus), tp))


def _one_process_learner(cfg: LaunchConfig, p: Placement) -> Placement:
    if cfg.training.no_deepspeed and p.ranks > 1:
        raise LaunchError("--no-deepspeed runs one learner process; give one training GPU (or --training-ranks 1)")
    return p


def base_env(cuda: bool) -> dict[str, str]:
    """Every worker's environment: this one, and what the workers need whatever they are."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", NCCL_NVLS_ENABLE="0",
               TORCH_SYMM_MEM_DISABLE_MULTICAST="1", **{PLANNED_ENV: "1"})
    # Workers run from the repo root: keep the launch directory importable for the
    # module:function of --reward and --dataset-transform.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH", "")) if p)
    if not cuda:
        env["CUDA_VISIBLE_DEVICES"] = ""
        # Two cores shared by every process: one thread each keeps them from thrashing.
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def as_visible(indices: str, parent: str | None) -> str:
    """A worker's CUDA_VISIBLE_DEVICES for these GPU indices ("1,0"): the launcher numbers the GPUs
    it sees, as torch and the driver do, so under a CUDA_VISIBLE_DEVICES of its own (a scheduler's
    allocation, another job beside it) index i is that list's entry i, not the host's GPU i: "1,0"
    under "4,6" is "6,4". Entries go through as they are (UUIDs, MIG ids); without a list of its own
    the indices are the host's."""
    if not parent or not parent.strip() or not indices:
        return indices
    entries = [e.strip() for e in parent.split(",")]
    picked = []
    for i in indices.split(","):
        if int(i) >= len(entries):
            raise ValueError(f"GPU {i} is not among the {len(entries)} this process may use "
                             f"(CUDA_VISIBLE_DEVICES={parent}); give indices below {len(entries)}")
        picked.append(entries[int(i)])
    return ",".join(picked)


def worker_command(role: str, root: Path = ROOT) -> list[str]:
    """How a worker of `role` ('sampler', 'learner') is started: the checkout's root script where
    there is one (its name in every ps listing), else `python -m grpo.workers ROLE` (a package
    installed without the checkout's scripts)."""
    script = root / {"sampler": "sampling_worker.py", "learner": "training_worker.py"}[role]
    return [sys.executable, str(script)] if script.is_file() else [sys.executable, "-m", "grpo.workers", role]


def specs(rp: RunPlan, master_port: int, run_dir: str = "") -> list[ProcSpec]:
    """Every process of a placed plan, learner ranks first (`run_dir`: the one the launcher made, in
    place of the roles'): here, and only here, argv is written."""
    p = rp.placement
    env0 = base_env(p.cuda)
    parent = os.environ.get("CUDA_VISIBLE_DEVICES")   # the launcher's own: its GPU indices count within it
    out: list[ProcSpec] = []
    for r in range(p.ranks):
        env = dict(env0, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(p.ranks), LOCAL_WORLD_SIZE=str(p.ranks),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port))
        if p.cuda:
            env["CUDA_VISIBLE_DEVICES"] = as_visible(",".join(map(str, p.training_gpus)), parent)
        run = dataclasses.replace(rp.learner.run, gpu_id=r if p.cuda else -1, run_dir=run_dir or rp.learner.run.run_dir)
        cfg = dataclasses.replace(rp.learner, run=run)
        out.append(ProcSpec(f"learner{r}", [*worker_command("learner"), *worker_argv(cfg)], env, "learner"))
    for k in range(p.samplers):
        env = dict(env0)
        if p.cuda:
            # The sampler's own GPU(s) first (its device 0; vLLM's worker of rank i on device i), then
            # learner rank 0's GPU, which CUDA IPC weight sync maps (peer access); found there by UUID.
            env["CUDA_VISIBLE_DEVICES"] = as_visible(visible_devices(p.sampler_gpus(k), p.training_gpus[0]), parent)
        run = dataclasses.replace(rp.sampler.run, sampler_id=k, num_samplers=p.samplers, gpu_id=0 if p.cuda else -1,
                                  run_dir=run_dir or rp.sampler.run.run_dir)
        cfg = dataclasses.replace(rp.sampler, run=run)
        out.append(ProcSpec(f"sampler{k}", [*worker_command("sampler"), *worker_argv(cfg, WHICH_SAMPLER)], env,
                            "sampler"))
    return out


def plan(cfg: LaunchConfig, cuda_count: int, sampler_flags: list[str], learner_flags: list[str],
         master_port: int) -> list[ProcSpec]:
    """Every process of the run of these flags as given, learner ranks first (no choice made)."""
    rp = from_flags(cfg, sampler_flags, learner_flags)
    placement = place(cfg, cuda_count, rp.sampler.rollout.vllm_tensor_parallel_size)
    return specs(with_placement(rp, placement), master_port)


def launcher_parser(with_workers: bool = False):
    """The launcher's own options; `with_workers` adds, for --help, the options it passes on, each
    in its section beside the launcher's own, saying which processes receive it."""
    if not with_workers:
        return build_parser(LaunchConfig, "run_distributed.py", aliases=ALIASES)
    own, samp, learn = _fields(LaunchConfig), _fields(SamplerConfig), _fields(LearnerConfig)
    passed = [n for n in {**samp, **learn} if n not in own and n not in SET_BY_LAUNCHER]
    parts = ((LaunchConfig, [n for n in own if n != "extra"], ""),
             (SamplerConfig, [n for n in passed if n in samp and n not in learn], "to the samplers"),
             (LearnerConfig, [n for n in passed if n in learn and n not in samp], "to the learner"),
             (SamplerConfig, [n for n in passed if n in samp and n in learn], "to both"))
    parser = ArgumentParser(prog="run_distributed.py", description=(
        f"{LaunchConfig.__doc__} Options come in sections. The launcher passes those marked 'to the samplers', "
        f"'to the learner' (every rank) or 'to both' on, and its own shared ones (model, device, ports, ...) to all."))
    groups = section_groups(parser, [(cls, names) for cls, names, _ in parts])
    for cls, names, note in parts:
        add_fields(parser, cls, names, ALIASES, groups, note)
    return parser


def parse(argv: list[str] | None) -> tuple[LaunchConfig, list[str], list[str]]:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "-h" in argv or "--help" in argv:
        launcher_parser(with_workers=True).print_help()
        raise SystemExit(0)
    parser = launcher_parser()
    apply_config_file(parser, LaunchConfig, argv)
    ns, rest = parser.parse_known_args(argv)
    if ns.config:
        ns.config = os.path.abspath(ns.config)  # the children get it as --config and read their keys
    cfg = from_flat(LaunchConfig, **{k: v for k, v in vars(ns).items() if k in _fields(LaunchConfig)})
    try:
        to_s, to_l = split_passthrough(rest)
    except LaunchError as exc:
        parser.error(str(exc))
    # The workers' flags, parsed as each worker will parse them: a bad choice or value is the
    # launcher's one-line error (exit 2) now, not a worker's exit after the run folder exists.
    parse_config(LearnerConfig, to_l, parser.prog)
    parse_config(SamplerConfig, to_s, parser.prog)
    return cfg, to_s, to_l


def passthrough_flags(argv: list[str]) -> list[str]:
    """The worker flags of a command line, as given (each instance's launcher gets them again)."""
    _, rest = launcher_parser().parse_known_args(argv)
    return rest


PORT_STRIDE = 2


@dataclass
class Instance:
    index: int
    seed: int
    run_dir: Path
    data_port: int
    sync_port: int
    sampling_gpus: list[int]
    training_gpus: list[int]


def parse_seeds(cfg: LaunchConfig) -> list[int]:
    if cfg.instances.seeds.strip():
        try:
            seeds = [int(x) for x in cfg.instances.seeds.replace(" ", "").strip(",").split(",")]
        except ValueError:
            raise LaunchError(f"--seeds {cfg.instances.seeds!r}: expected comma-separated integers like 42,1337") from None
        if cfg.instances.instances not in (1, len(seeds)):
            raise LaunchError(f"--instances {cfg.instances.instances} but --seeds lists {len(seeds)}; give one seed per instance")
    else:
        seeds = [cfg.run.seed + k for k in range(cfg.instances.instances)]
    if len(set(seeds)) != len(seeds):
        raise LaunchError(f"--seeds {cfg.instances.seeds!r} repeats a seed; each instance needs its own (it names the run dir)")
    if cfg.instances.instances < 1:
        raise LaunchError("--instances must be >= 1")
    return seeds


def plan_instances(cfg: LaunchConfig, cuda_count: int, tp: int = 1) -> list[Instance]:
    """Seeds, GPUs, ports and run directories of every instance (no side effects); `tp`: GPUs per
    sampler (--vllm-tensor-parallel-size)."""
    seeds = parse_seeds(cfg)
    k_all = len(seeds)
    samp0, train0, use_cuda = _resolve_gpus(cfg, cuda_count)
    check_tensor_parallel(cfg, tp, use_cuda)
    if use_cuda:
        if bool(samp0) != bool(train0):
            raise LaunchError("with --instances give both --sampling-gpus and --training-gpus (instance 0's), or neither")
        if not samp0:
            per = cuda_count // k_all
            if per < tp + 1:
                sampler = "a sampler" if tp == 1 else f"a sampler of {tp} GPUs"
                raise LaunchError(f"{k_all} instances need at least {(tp + 1) * k_all} GPUs ({sampler} and a learner "
                                  f"each); this machine has {cuda_count}: use fewer --instances")
            samp0, train0 = list(range(tp)), list(range(tp, per))
        try:
            sampler_groups(samp0, tp)   # each instance's samplers, tp GPUs each: a count that does not divide is refused
        except ValueError as exc:
            raise LaunchError(str(exc)) from None
        overlap = sorted(set(samp0) & set(train0))
        if overlap and not cfg.placement.share_gpus:
            raise LaunchError(f"GPU(s) {','.join(map(str, overlap))} in both --sampling-gpus and --training-gpus; "
                              f"give disjoint lists, or add --share-gpus")
    width = max(samp0 + train0, default=-1) + 1
    ports: set[int] = set()
    base = Path(cfg.run.run_dir) if cfg.run.run_dir else Path("runs")
    out = []
    for k, seed in enumerate(seeds):
        samp = [g + k * width for g in samp0]
        train = [g + k * width for g in train0]
        if use_cuda and max(samp + train) >= cuda_count:
            raise LaunchError(f"instance {k} would need GPU {max(samp + train)} but this machine has {cuda_count} "
                              f"(0..{cuda_count - 1}); use fewer --instances or shorter GPU lists")
        d, s = cfg.run.data_port + PORT_STRIDE * k, cfg.run.sync_port + PORT_STRIDE * k
        if d in ports or s in ports or d == s or max(d, s) > 65535:
            raise LaunchError(f"instance {k}'s ports {d}/{s} collide or overflow (each instance adds {PORT_STRIDE}); "
                              f"use --data-port and --sync-port that differ by 1, e.g. 5555 and 5556")
        ports |= {d, s}
        out.append(Instance(k, seed, base / f"{cfg.instances.name}_seed{seed}", d, s, samp, train))
    return out


def instance_argv(cfg: LaunchConfig, inst: Instance, passthrough: list[str]) -> list[str]:
    """The child launcher's command line: this instance's settings plus the worker flags as given."""
    sub = dataclasses.replace(
        cfg, instances=dataclasses.replace(cfg.instances, instances=1, seeds=""),
        run=dataclasses.replace(cfg.run, seed=inst.seed, run_dir=str(inst.run_dir), data_port=inst.data_port,
                                sync_port=inst.sync_port),
        placement=dataclasses.replace(cfg.placement, sampling_gpus=",".join(map(str, inst.sampling_gpus)),
                                      training_gpus=",".join(map(str, inst.training_gpus))))
    return [sys.executable, str(ROOT / "run_distributed.py"), *to_flags(sub, LaunchConfig), *passthrough]
