"""The plan of a run over several machines, pure: which node runs which process on which GPU,
the commands to type on each node, the RANK/WORLD_SIZE layout, and the weight-sync method each
sampler ends up with. `run_distributed.py --nodes ADDRESS:GPUS,...` prints it and starts
nothing: one launcher cannot start processes on other machines without ssh, so each node's
commands are run there (by hand or by a scheduler).

Placement, one rule, so the layout follows from (nodes, M learner ranks, N samplers) alone:
  learners  the ranks fill the first nodes from GPU 0, L a node (--ranks-per-node; by default
            min(M, node 0's GPUs)): DeepSpeed gives every node one --num_gpus, so M must be
            L x (learner nodes) and each learner node needs L GPUs. Rank k*L + l is GPU l of learner node k, as
            DeepSpeed numbers them (hostfile order, then local rank).
  samplers  the GPUs no learner uses, node by node in order (a learner node's GPUs after its
            ranks, then the nodes after it); with --share-gpus, samplers left over go beside
            learner ranks, one a GPU, from node 0's GPU 0 on.
  weights   what grpo.weights.methods resolves for each sampler: on learner rank 0's node it
            sees rank 0's GPU (CUDA IPC); elsewhere ipc is impossible and the fallback rule
            says what replaces it (nccl under --weight-sync auto).
On --device cpu the number after a node's address counts process slots instead of GPUs.
"""
from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass, field

from grpo.config import CommonConfig, LaunchConfig, LearnerConfig, RunSection, flat, flat_fields, resolve_precision
from grpo.flags import parse_config
from grpo.launch.plan import ROOT, LaunchError
from grpo.rules import layout
from grpo.weights.methods import IPC, SHARED, check_method, fallback, sampler_method

# Set for every process, as the one-host launcher sets them (grpo.launch.plan.plan).
NODE_ENV = {"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false",
            "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
# Flags every command carries even at their defaults: where rank 0 is is the point of the plan.
ALWAYS = ("device", "host", "data_port", "sync_port")


@dataclass(frozen=True)
class Node:
    address: str
    slots: int   # GPUs (CUDA) or process slots (CPU)


@dataclass
class Proc:
    name: str            # learner<r> / sampler<i>, as the one-host launcher names them
    role: str            # "learner" or "sampler"
    node: int            # index into the nodes
    gpu: int             # GPU on that node (on CPU: the slot)
    env: dict[str, str]  # learners: what DeepSpeed sets (RANK, ...); samplers: CUDA_VISIBLE_DEVICES
    argv: list[str]      # the worker script and its flags
    weight_sync: str = ""  # samplers: the method it will use


@dataclass
class NodePlan:
    address: str
    procs: list[Proc] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)


@dataclass
class MultiNodePlan:
    nodes: list[NodePlan]
    learner_nodes: int
    ranks_per_node: int
    hostfile: str        # path; "" with one learner node (DeepSpeed needs none then)
    hostfile_text: str
    cuda: bool
    data_port: int
    sync_port: int
    master_port: int

    def procs(self, role: str = "") -> list[Proc]:
        return [p for n in self.nodes for p in n.procs if not role or p.role == role]


def parse_nodes(text: str) -> list[Node]:
    """'10.0.0.1:8,10.0.0.2:8' -> [Node('10.0.0.1', 8), Node('10.0.0.2', 8)]."""
    out: list[Node] = []
    for item in text.replace(" ", "").strip(",").split(","):
        address, _, count = item.rpartition(":")
        try:
            slots = int(count)
        except ValueError:
            slots = -1
        if not address or slots < 1:
            raise LaunchError(f"--nodes entry {item!r}: expected ADDRESS:GPUS with GPUS >= 1, "
                              f"e.g. --nodes 10.0.0.1:8,10.0.0.2:8")
        if address in (n.address for n in out):
            raise LaunchError(f"--nodes lists {address} twice; list each node once")
        out.append(Node(address, slots))
    return out


def place(nodes: list[Node], ranks: int, samplers: int, share_gpus: bool, per_node: int = 0,
          unit: str = "GPU") -> tuple[list[tuple[int, int]], list[tuple[int, int]], int]:
    """(learner rank r's (node, gpu), sampler i's (node, gpu), ranks a learner node) by the
    module's rule, or a LaunchError naming the problem and the fix."""
    if ranks < 1 or samplers < 1 or per_node < 0:
        raise LaunchError("--training-ranks and --num-samplers must be >= 1 (and --ranks-per-node >= 0)")
    per = per_node or min(ranks, nodes[0].slots)
    if ranks % per:
        divisors = [d for d in range(1, ranks + 1) if ranks % d == 0 and d <= nodes[0].slots]
        raise LaunchError(f"--training-ranks {ranks} does not fill learner nodes of {per} ranks evenly (DeepSpeed "
                          f"runs one --num_gpus on every node): use a multiple of {per}, or --ranks-per-node "
                          f"{' or '.join(map(str, divisors[-2:]))}")
    k_learn = ranks // per
    if k_learn > len(nodes):
        raise LaunchError(f"--training-ranks {ranks} needs {k_learn} learner nodes of {per} {unit}s but --nodes "
                          f"lists {len(nodes)}: add nodes or use fewer --training-ranks")
    for k in range(k_learn):
        if nodes[k].slots < per:
            raise LaunchError(f"node {nodes[k].address} has {nodes[k].slots} {unit}s but every learner node runs "
                              f"{per} ranks (--ranks-per-node; by default node 0's {unit}s): list nodes with {per} "
                              f"{unit}s first, or use --ranks-per-node {nodes[k].slots} and --training-ranks a "
                              f"multiple of it")
    learners = [(k, l) for k in range(k_learn) for l in range(per)]
    free = [(k, g) for k, n in enumerate(nodes) for g in range(per if k < k_learn else 0, n.slots)]
    if samplers > len(free) and not share_gpus:
        raise LaunchError(f"{samplers} samplers need {samplers} {unit}s but {len(free)} are left after the "
                          f"{ranks} learner ranks: add a node, use fewer --num-samplers, or add --share-gpus "
                          f"to put samplers beside learner ranks")
    if samplers > len(free) + len(learners):
        raise LaunchError(f"{samplers} samplers are more than the {len(free) + len(learners)} {unit}s of --nodes "
                          f"(one sampler a {unit}): add nodes or use fewer --num-samplers")
    placed = (free + learners)[:samplers]
    used = {k for k, _ in learners + placed}
    if idle := [n.address for k, n in enumerate(nodes) if k not in used]:
        raise LaunchError(f"node(s) {', '.join(idle)} would run nothing: drop them from --nodes or add "
                          f"--num-samplers")
    return learners, placed, per


def sampler_weight_sync(requested: str, cuda: bool, on_rank0_node: bool) -> str:
    """The method a sampler will use: grpo.weights.methods' own rules (what it asks for first;
    ipc where it cannot see learner rank 0's GPU steps down by the fallback rule)."""
    method = sampler_method(requested, "cuda" if cuda else "cpu")
    if method == IPC and not on_rank0_node:
        method = fallback(IPC, requested)
    return method


def changed_flags(cfg: CommonConfig) -> list[str]:
    """The common flags that differ from their defaults (and ALWAYS): short commands to print."""
    out: list[str] = []
    values = flat(cfg)
    for name, (_, f) in flat_fields(CommonConfig).items():
        value = values[name]
        if name not in ALWAYS and value == f.default:
            continue
        flag = "--" + name.replace("_", "-")
        out += ([flag] if value else ["--no-" + flag[2:]]) if isinstance(value, bool) else [flag, str(value)]
    return out


def check(cfg: LaunchConfig, nodes: list[Node]) -> None:
    """The mistakes that need no placement: other launcher modes, --host, ports."""
    if cfg.placement.sampling_gpus or cfg.placement.training_gpus:
        raise LaunchError("--nodes places every process itself; drop --sampling-gpus/--training-gpus "
                          "(use --training-ranks and --num-samplers)")
    if cfg.instances.instances != 1 or cfg.instances.seeds:
        raise LaunchError("--nodes plans one run; drop --instances/--seeds (plan each seed's run on its own nodes)")
    if cfg.run.host not in (RunSection.host, nodes[0].address):
        raise LaunchError(f"--host {cfg.run.host} is not the first node of --nodes ({nodes[0].address}), where learner "
                          f"rank 0 binds: drop --host, or list that node first")
    ports = {"--data-port": cfg.run.data_port, "--sync-port": cfg.run.sync_port, "--master-port": cfg.nodes.master_port}
    for flag, port in ports.items():
        if not 0 < port < 65536:
            raise LaunchError(f"{flag} {port} is not a TCP port; give one in 1..65535")
    seen: dict[int, str] = {}
    for flag, port in ports.items():
        if port in seen:
            raise LaunchError(f"{seen[port]} and {flag} are both {port} on {nodes[0].address} (learner rank 0's "
                              f"node); give each its own port")
        seen[port] = flag


def choose_nodes_split(cfg: LaunchConfig, params: int | None, train_batch_size: int,
                       rates=None) -> tuple[LaunchConfig, str]:
    """--gpus all with --nodes: (the config as if the chosen --training-ranks/--num-samplers (and
    --share-gpus, for one GPU in all) had been typed, the layout line). The split is
    grpo.rules.layout.choose_split's over every node's GPUs, among those `place` can lay out with
    every GPU used (learner ranks fill whole learner nodes from GPU 0, the samplers take the rest)."""
    nodes = parse_nodes(cfg.nodes.nodes)

    def feasible(samplers: int, ranks: int) -> bool:
        try:
            place(nodes, ranks, samplers, False, cfg.nodes.ranks_per_node)
        except LaunchError:
            return False
        return True

    try:
        split = layout.choose_split(sum(n.slots for n in nodes), params, cfg.rollout.max_new_tokens, train_batch_size,
                                    cfg.rollout.num_generations, rates, feasible)
    except ValueError:
        raise LaunchError(f"--gpus all finds no split of --nodes {cfg.nodes.nodes} that fills every GPU (learner ranks "
                          f"fill whole nodes of --ranks-per-node GPUs from GPU 0, samplers the rest): give "
                          f"--training-ranks and --num-samplers yourself") from None
    placement = dataclasses.replace(cfg.placement, gpus="", layout_from="", training_ranks=split.ranks,
                                    num_samplers=split.samplers, share_gpus=split.share)
    chosen = dataclasses.replace(cfg, placement=placement)
    return chosen, layout.nodes_layout_line(cfg.nodes.nodes, split)


def plan_nodes(cfg: LaunchConfig, sampler_flags: list[str], learner_flags: list[str]) -> MultiNodePlan:
    """Every node's processes and commands for cfg.nodes, --training-ranks M, --num-samplers N."""
    nodes = parse_nodes(cfg.nodes.nodes)
    check(cfg, nodes)
    cuda = cfg.run.device != "cpu"
    unit = "GPU" if cuda else "slot"
    learners, samplers, per = place(nodes, cfg.placement.training_ranks, cfg.placement.num_samplers,
                                    cfg.placement.share_gpus,
                                    cfg.nodes.ranks_per_node, unit)
    if cfg.training.no_deepspeed and len(learners) > 1:
        raise LaunchError("--no-deepspeed runs one learner process; use --training-ranks 1")
    k_learn, m, n = len(learners) // per, len(learners), len(samplers)
    if k_learn > 1 and not cfg.run.run_dir:
        raise LaunchError("learner ranks on several nodes write one checkpoint together: give --run-dir on a "
                          "filesystem every learner node mounts, e.g. --run-dir /shared/runs/x")
    rank0 = nodes[0].address
    run = dataclasses.replace(cfg.run, host=rank0, device="cuda" if cuda else "cpu")
    common = changed_flags(dataclasses.replace(cfg, run=run))
    plans = [NodePlan(x.address) for x in nodes]

    for r, (k, l) in enumerate(learners):
        env = {"RANK": str(r), "LOCAL_RANK": str(l), "WORLD_SIZE": str(m), "LOCAL_WORLD_SIZE": str(per),
               "MASTER_ADDR": rank0 if k_learn > 1 else "127.0.0.1", "MASTER_PORT": str(cfg.nodes.master_port)}
        argv = ["training_worker.py", *common, "--max-steps", str(cfg.training.max_steps)]
        argv += (["--no-deepspeed"] if cfg.training.no_deepspeed else []) + learner_flags
        plans[k].procs.append(Proc(f"learner{r}", "learner", k, l, env, argv))

    lcfg = parse_config(LearnerConfig, plans[0].procs[0].argv[1:], "training_worker.py")
    try:
        bf16 = resolve_precision(lcfg.training.precision, cuda, lcfg.training.lora_r > 0,
                                 not cfg.training.no_deepspeed) == "bf16"
        check_method(cfg.weight_sync.weight_sync, "cuda" if cuda else "cpu", lcfg.training.lora_r > 0, bf16)
    except ValueError as exc:
        raise LaunchError(str(exc)) from None
    for i, (k, g) in enumerate(samplers):
        method = sampler_weight_sync(cfg.weight_sync.weight_sync, cuda, k == 0)
        if cfg.weight_sync.weight_sync == IPC and method != IPC:
            raise LaunchError(f"--weight-sync ipc needs every sampler on learner rank 0's node, but sampler{i} is "
                              f"on {nodes[k].address}: use --weight-sync auto (nccl there) or tcp")
        if method == SHARED and (k, g) != (0, 0):
            raise LaunchError(f"--weight-sync shared needs every sampler on learner rank 0's GPU ({rank0} GPU 0) "
                              f"but sampler{i} is on {nodes[k].address} GPU {g}: use --weight-sync auto")
        # Its own GPU first (its cuda:0); on rank 0's node rank 0's GPU too, which CUDA IPC maps.
        visible = ",".join(map(str, dict.fromkeys([g, 0] if k == 0 else [g]))) if cuda else ""
        argv = ["sampling_worker.py", *common, "--sampler-id", str(i), "--num-samplers", str(n)]
        argv += (["--gpu-id", "0"] if cuda else []) + sampler_flags
        plans[k].procs.append(Proc(f"sampler{i}", "sampler", k, g, {"CUDA_VISIBLE_DEVICES": visible}, argv, method))

    uses_deepspeed = cuda and not cfg.training.no_deepspeed
    hostfile = f"{cfg.run.run_dir.rstrip('/')}/hostfile" if k_learn > 1 and uses_deepspeed else ""
    hostfile_text = "".join(f"{nodes[k].address} slots={per}\n" for k in range(k_learn)) if hostfile else ""
    mp = MultiNodePlan(plans, k_learn, per, hostfile, hostfile_text, cuda, cfg.run.data_port, cfg.run.sync_port,
                       cfg.nodes.master_port)
    for k, node in enumerate(plans):
        node.commands = node_commands(mp, k, cfg.training.no_deepspeed)
    return mp


def deepspeed_command(mp: MultiNodePlan, k: int) -> list[str]:
    """DeepSpeed's launcher on learner node k. Several nodes: without ssh every node runs it with
    its --node_rank, and the hostfile (the same on every node) names the nodes in rank order;
    DeepSpeed ignores --master_addr without one, so one learner node runs it without."""
    cmd = ["deepspeed"]
    if mp.learner_nodes > 1:
        cmd += ["--hostfile", mp.hostfile, "--num_nodes", str(mp.learner_nodes), "--num_gpus", str(mp.ranks_per_node),
                "--no_ssh", "--node_rank", str(k), "--master_addr", mp.nodes[0].address]
    else:
        cmd += ["--num_gpus", str(mp.ranks_per_node)]
    return cmd + ["--master_port", str(mp.master_port), "--no_local_rank"]


def node_commands(mp: MultiNodePlan, k: int, no_deepspeed: bool) -> list[str]:
    """The shell lines to run on node k: DeepSpeed's launcher for its learner ranks (or, on CPU
    and with --no-deepspeed, each rank with the variables DeepSpeed would set), then its samplers."""
    procs = mp.nodes[k].procs
    lines: list[str] = []
    learners = [p for p in procs if p.role == "learner"]
    if learners and mp.cuda and not no_deepspeed:
        lines.append(shlex.join(deepspeed_command(mp, k) + learners[0].argv))
    else:
        for p in learners:
            env = dict(p.env, CUDA_VISIBLE_DEVICES=str(p.gpu) if mp.cuda else "")
            lines.append(" ".join(f"{key}={shlex.quote(v)}" for key, v in env.items())
                         + " python " + shlex.join(p.argv))
    for p in procs:
        if p.role == "sampler":
            visible = shlex.quote(p.env["CUDA_VISIBLE_DEVICES"])
            lines.append(f"CUDA_VISIBLE_DEVICES={visible} python {shlex.join(p.argv)}")
    if len(lines) > 1:   # several processes: in the background, and wait for them all
        lines = [line + " &" for line in lines] + ["wait"]
    export = "export " + " ".join(f"{key}={v}" for key, v in NODE_ENV.items())
    return [f"cd {shlex.quote(str(ROOT))}", export, *lines]


def one_host_equivalent(mp: MultiNodePlan, share_gpus: bool) -> str:
    """One node: the run_distributed.py flags that start the same layout itself."""
    if mp.cuda:
        samp, train = (",".join(str(p.gpu) for p in mp.procs(role)) for role in ("sampler", "learner"))
        return f"--sampling-gpus {samp} --training-gpus {train}" + (" --share-gpus" if share_gpus else "")
    return f"--device cpu --training-ranks {len(mp.procs('learner'))} --num-samplers {len(mp.procs('sampler'))}"


def format_plan(mp: MultiNodePlan, gpu_bytes: dict[tuple[int, int], int] | None = None,
                share_gpus: bool = False) -> str:
    """The printed plan: the layout line, the hostfile, then per node each GPU's processes (and
    their memory, when the memory plan is known) and the commands to run there."""
    m, n = len(mp.procs("learner")), len(mp.procs("sampler"))
    unit = "GPU" if mp.cuda else "slot"
    at = f"{unit} 0" if mp.ranks_per_node == 1 else f"{unit}s 0-{mp.ranks_per_node - 1}"
    out = [f"multi-node plan: {m} learner rank(s) on {mp.learner_nodes} node(s), {mp.ranks_per_node} a node "
           f"({at}); {n} sampler(s); learner rank 0 on {mp.nodes[0].address} "
           f"(data port {mp.data_port}, sync port {mp.sync_port}, rendezvous port {mp.master_port})"]
    if mp.hostfile:
        out.append(f"hostfile {mp.hostfile} (the same file on every learner node):")
        out += [f"  {line}" for line in mp.hostfile_text.splitlines()]
    if len(mp.nodes) == 1:
        out.append(f"one node: run_distributed.py {one_host_equivalent(mp, share_gpus)} starts the same layout itself")
    for k, node in enumerate(mp.nodes):
        out.append(f"node {k}: {node.address}")
        at: dict[int, list[Proc]] = {}
        for p in node.procs:
            at.setdefault(p.gpu, []).append(p)
        for g in sorted(at):
            who = []
            for p in at[g]:
                if p.role == "learner":
                    who.append(f"{p.name} (RANK {p.env['RANK']}, LOCAL_RANK {p.env['LOCAL_RANK']}, "
                               f"WORLD_SIZE {p.env['WORLD_SIZE']})")
                else:
                    who.append(f"{p.name} (weights by {p.weight_sync})")
            mem = f"  ~{gpu_bytes[(k, g)] / (1 << 30):.2f} GiB" if gpu_bytes and (k, g) in gpu_bytes else ""
            out.append(f"  {unit} {g}: {' + '.join(who)}{mem}")
        out.append("  run there:")
        out += [f"    {line}" for line in node.commands]
    return "\n".join(out)
