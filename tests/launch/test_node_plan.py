"""The plan over several nodes (grpo.launch.nodes): placement, RANK/WORLD_SIZE layout, each
sampler's weight-sync method, each node's commands and what each GPU of each node holds, for
several (N samplers, M learner ranks, K nodes); every number worked by hand below."""

import pytest

from grpo.launch import main as launch_main
from grpo.launch import nodes
from grpo.rules import memory
from grpo.rules.memory import CUDA_CONTEXT, RunShape, Shape
from grpo.launch.nodes import Node, parse_nodes, place, plan_nodes, sampler_weight_sync
from grpo.launch.plan import LaunchError, parse


def node_plan(argv):
    cfg, to_s, to_l = parse(argv)
    return plan_nodes(cfg, to_s, to_l)


def layout(mp):
    """{process name: (node address, GPU)} of a plan."""
    return {p.name: (mp.nodes[p.node].address, p.gpu) for p in mp.procs()}


def test_parse_nodes():
    assert parse_nodes("10.0.0.1:8, 10.0.0.2:8,") == [Node("10.0.0.1", 8), Node("10.0.0.2", 8)]
    with pytest.raises(LaunchError, match="ADDRESS:GPUS"):
        parse_nodes("10.0.0.1")
    with pytest.raises(LaunchError, match="ADDRESS:GPUS"):
        parse_nodes("a:0")
    with pytest.raises(LaunchError, match="lists a twice"):
        parse_nodes("a:2,a:2")


# place(nodes, M, N, share_gpus, ranks_per_node) -> (learner (node, gpu)s, sampler (node, gpu)s, ranks a node)
def test_place_one_gpu_shared():
    # (N, M, K) = (1, 1, 1): one GPU; the sampler may join learner rank 0 only with --share-gpus
    assert place([Node("a", 1)], 1, 1, share_gpus=True) == ([(0, 0)], [(0, 0)], 1)
    with pytest.raises(LaunchError, match="add --share-gpus"):
        place([Node("a", 1)], 1, 1, share_gpus=False)


def test_place_the_seeds_layout():
    # (1, 3, 1): four GPUs; L = min(3, 4) = 3 ranks on GPUs 0-2, the sampler on the GPU after them
    assert place([Node("a", 4)], 3, 1, False) == ([(0, 0), (0, 1), (0, 2)], [(0, 3)], 3)


def test_place_two_learner_nodes_and_a_sampler_node():
    # (8, 16, 3): L = min(16, 8) = 8, 16 / 8 = 2 learner nodes full; node 2's 8 GPUs sample
    learners, samplers, per = place([Node("a", 8), Node("b", 8), Node("c", 8)], 16, 8, False)
    assert per == 8
    assert learners == [(0, g) for g in range(8)] + [(1, g) for g in range(8)]
    assert samplers == [(2, g) for g in range(8)]


def test_place_two_nodes_mixed():
    # (2, 4, 2) on two 3-GPU nodes with --ranks-per-node 2: ranks 0,1 on a's GPUs 0,1 and 2,3 on
    # b's; each node's GPU 2 samples
    assert place([Node("a", 3), Node("b", 3)], 4, 2, False, per_node=2) == (
        [(0, 0), (0, 1), (1, 0), (1, 1)], [(0, 2), (1, 2)], 2)
    # (2, 4, 2) on a 4-GPU and a 2-GPU node, by default: L = 4, one learner node; b samples
    assert place([Node("a", 4), Node("b", 2)], 4, 2, False) == ([(0, g) for g in range(4)], [(1, 0), (1, 1)], 4)
    # --share-gpus with more samplers than free GPUs: the free one first, then beside rank 0, rank 1
    assert place([Node("a", 3)], 2, 3, True)[1] == [(0, 2), (0, 0), (0, 1)]


@pytest.mark.parametrize("args,match", [
    # 4 ranks on 3-GPU nodes: L = 3 does not divide 4 (DeepSpeed: one --num_gpus for every node)
    (([Node("a", 3), Node("b", 3)], 4, 1, False), "--ranks-per-node 1 or 2"),
    # 16 ranks, L = 8: node b would need 8 GPUs
    (([Node("a", 8), Node("b", 4)], 16, 1, True), "node b has 4 GPUs but every learner node runs 8"),
    # 24 ranks, L = 8: three learner nodes, two listed
    (([Node("a", 8), Node("b", 8)], 24, 1, True), "needs 3 learner nodes"),
    (([Node("a", 8), Node("b", 8)], 16, 1, False), "1 samplers need 1 GPUs but 0 are left"),
    (([Node("a", 2)], 1, 3, True), "3 samplers are more than the 2 GPUs"),
    (([Node("a", 2), Node("b", 2)], 1, 1, False), "node.s. b would run nothing"),
])
def test_place_refuses_with_the_fix(args, match):
    with pytest.raises(LaunchError, match=match):
        place(*args)


@pytest.mark.parametrize("requested,cuda,rank0_node,method", [
    ("auto", True, True, "ipc"),     # sees learner rank 0's GPU
    ("auto", True, False, "nccl"),   # another node: ipc falls back to nccl under auto
    ("auto", False, True, "tcp"),    # CPU: bytes
    ("auto", False, False, "tcp"),
    ("tcp", True, True, "tcp"),      # asked for by name: as asked
    ("nccl", False, False, "nccl"),  # (gloo pairs on CPU)
    ("ipc", True, False, "tcp"),     # ipc by name elsewhere steps down to tcp (the plan refuses it)
])
def test_sampler_weight_sync_is_the_runtime_rule(requested, cuda, rank0_node, method):
    assert sampler_weight_sync(requested, cuda, rank0_node) == method


def test_plan_16_ranks_on_two_nodes_and_8_samplers_on_a_third():
    mp = node_plan(["--nodes", "10.0.0.1:8,10.0.0.2:8,10.0.0.3:8", "--training-ranks", "16", "--num-samplers", "8",
                    "--run-dir", "/shared/runs/x", "--max-steps", "50", "--learning-rate", "2e-6",
                    "--prompts-per-round", "4"])
    learners, samplers = mp.procs("learner"), mp.procs("sampler")
    # DeepSpeed's numbering: rank = node x 8 + local rank
    assert [(p.env["RANK"], p.env["LOCAL_RANK"]) for p in learners[7:10]] == [("7", "7"), ("8", "0"), ("9", "1")]
    assert {(p.env["WORLD_SIZE"], p.env["MASTER_ADDR"]) for p in learners} == {("16", "10.0.0.1")}
    assert layout(mp)["learner9"] == ("10.0.0.2", 1) and layout(mp)["sampler3"] == ("10.0.0.3", 3)
    assert [p.weight_sync for p in samplers] == ["nccl"] * 8      # no sampler sees learner rank 0's GPU
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in samplers] == [str(g) for g in range(8)]
    assert mp.hostfile == "/shared/runs/x/hostfile" and mp.hostfile_text == "10.0.0.1 slots=8\n10.0.0.2 slots=8\n"
    common = ("--device cuda --host 10.0.0.1 --data-port 5555 --sync-port 5556 --run-dir /shared/runs/x")
    assert mp.nodes[1].commands[2] == (
        "deepspeed --hostfile /shared/runs/x/hostfile --num_nodes 2 --num_gpus 8 --no_ssh --node_rank 1 "
        "--master_addr 10.0.0.1 --master_port 29500 --no_local_rank training_worker.py "
        f"{common} --max-steps 50 --learning-rate 2e-6")
    assert mp.nodes[2].commands[2] == (
        f"CUDA_VISIBLE_DEVICES=0 python sampling_worker.py {common} --sampler-id 0 --num-samplers 8 --gpu-id 0 "
        "--prompts-per-round 4 &")
    assert mp.nodes[2].commands[-1] == "wait" and len(mp.nodes[2].commands) == 2 + 8 + 1


def test_plan_seeds_layout_on_one_node():
    mp = node_plan(["--nodes", "gpu-box:4", "--training-ranks", "3", "--num-samplers", "1"])
    assert layout(mp) == {"learner0": ("gpu-box", 0), "learner1": ("gpu-box", 1), "learner2": ("gpu-box", 2),
                          "sampler0": ("gpu-box", 3)}
    s = mp.procs("sampler")[0]
    # its own GPU first, then learner rank 0's, which CUDA IPC maps
    assert s.weight_sync == "ipc" and s.env["CUDA_VISIBLE_DEVICES"] == "3,0"
    # one learner node: no hostfile, and DeepSpeed's rendezvous stays on the node
    assert mp.hostfile == "" and mp.nodes[0].commands[2].startswith(
        "deepspeed --num_gpus 3 --master_port 29500 --no_local_rank training_worker.py ")
    assert nodes.one_host_equivalent(mp, False) == "--sampling-gpus 3 --training-gpus 0,1,2"


def test_plan_one_gpu_shared_and_two_mixed_nodes():
    mp = node_plan(["--nodes", "a:1", "--share-gpus"])
    assert layout(mp) == {"learner0": ("a", 0), "sampler0": ("a", 0)}
    assert mp.procs("sampler")[0].env["CUDA_VISIBLE_DEVICES"] == "0"
    assert nodes.one_host_equivalent(mp, True) == "--sampling-gpus 0 --training-gpus 0 --share-gpus"
    # (2, 4, 2): a sampler beside each learner node's ranks: ipc on rank 0's node, nccl on the other
    mp = node_plan(["--nodes", "a:3,b:3", "--training-ranks", "4", "--ranks-per-node", "2", "--num-samplers", "2",
                    "--run-dir", "/s"])
    assert [(p.name, p.weight_sync, p.env["CUDA_VISIBLE_DEVICES"]) for p in mp.procs("sampler")] == [
        ("sampler0", "ipc", "2,0"), ("sampler1", "nccl", "2")]
    assert [p.env["RANK"] for p in mp.nodes[1].procs if p.role == "learner"] == ["2", "3"]
    assert mp.hostfile_text == "a slots=2\nb slots=2\n"


def test_plan_on_cpu_sets_each_ranks_variables():
    mp = node_plan(["--nodes", "h1:2,h2:1", "--device", "cpu", "--training-ranks", "2", "--num-samplers", "1"])
    assert mp.procs("sampler")[0].weight_sync == "tcp"
    assert mp.nodes[0].commands[2] == (
        "RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 "
        "CUDA_VISIBLE_DEVICES='' python training_worker.py --device cpu --host h1 --data-port 5555 "
        "--sync-port 5556 --max-steps 100 &")
    assert mp.nodes[1].commands[2].startswith("CUDA_VISIBLE_DEVICES='' python sampling_worker.py --device cpu "
                                              "--host h1 ")


@pytest.mark.parametrize("argv,match", [
    (["--nodes", "a:1,b:1", "--weight-sync", "ipc"], "ipc needs every sampler on learner rank 0's node"),
    (["--nodes", "a:2", "--weight-sync", "shared", "--precision", "bf16"],
     "shared needs every sampler on learner rank 0's GPU"),
    (["--nodes", "a:1", "--weight-sync", "shared", "--share-gpus"], "shared needs .* --precision bf16"),
    (["--nodes", "a:1,b:1", "--device", "cpu", "--weight-sync", "ipc"], "ipc needs a CUDA learner"),
    (["--nodes", "a:2", "--master-port", "5556"], "--sync-port and --master-port are both 5556"),
    (["--nodes", "a:2", "--host", "b"], "--host b is not the first node"),
    (["--nodes", "a:2,b:2", "--training-ranks", "4", "--num-samplers", "1", "--share-gpus"], "give --run-dir"),
    (["--nodes", "a:2", "--sampling-gpus", "1"], "drop --sampling-gpus"),
    (["--nodes", "a:2", "--seeds", "1,2"], "drop --instances/--seeds"),
    (["--nodes", "a:3", "--training-ranks", "2", "--no-deepspeed"], "--no-deepspeed runs one learner"),
])
def test_plan_refusals(argv, match):
    with pytest.raises(LaunchError, match=match):
        node_plan(argv)


# A made-up 1,000,000-parameter model (as in test_memory_plan.py): 2 layers, hidden 64, KV 32,
# intermediate 256, vocab 1000; seq = 10 + 6 = 16, micro-batch 1, 3 rows, log-prob batch 2.
SHAPE = Shape(params=1_000_000, layers=2, hidden=64, kv_dim=32, q_dim=64, intermediate=256, vocab=1000)
# Every learner rank: weights 2 x 1e6 = 2,000,000; activations 2 x 1 x 16 x 64 x 77 = 157,696;
# logits chunk 2 x (1 x 16 x 1000) x 4 = 128,000; + CUDA context. Rank 0 adds the ipc slots,
# 2 x 1e6 x 2 = 4,000,000. Per M: optimizer state 12e6 // M, gradients 2e6 // M.
# Full fine-tuning's allocator reserve (expandable segments, the default): 0.25 x the rank's other
# items, the context left out.
def learner(split: int) -> int:
    """A learner rank's bytes, `split` being its state, gradients and (rank 0) ipc slots."""
    items = 2_000_000 + 157_696 + 128_000 + split
    return items + int(0.25 * items) + CUDA_CONTEXT


# Every sampler: weights and reference 2 x 2,000,000; KV cache 2 x 2 x 3 x 16 x 32 x 2 = 12,288;
# log-prob pass 2 x 16 x (128 + 512) x 2 = 40,960 + logits 2 x (2 x 16 x 1000) x 4 = 256,000.
# Weight staging (ipc and nccl) 2 x 1e6 = 2,000,000; allocator reserve 0.7 x (12,288 + 296,960) =
# int(216,473.6) = 216,473.
SAMPLER = 4_000_000 + 12_288 + 40_960 + 256_000 + 2_000_000 + 216_473 + CUDA_CONTEXT


def gpu_memory(argv, ranks, samplers):
    mp = node_plan(argv)
    p = memory.plan(SHAPE, RunShape(ranks=ranks, samplers=samplers, micro_batch=1, prompt_tokens=10, new_tokens=6,
                                    rows=3, logprob_batch_size=2))
    return memory.gpu_totals(p, {q.name: (mp.nodes[q.node].address, q.gpu) for q in mp.procs()})


def test_memory_per_gpu_one_gpu_shared():
    # (1, 1, 1): M = 1 holds all 12e6 + 2e6 of state and gradients; the sampler adds up on the same GPU
    got = gpu_memory(["--nodes", "a:1", "--share-gpus"], 1, 1)
    assert got == {("a", 0): learner(4_000_000 + 12_000_000 + 2_000_000) + SAMPLER}
    # learner: 20,285,696 of items + reserve int(5,071,424) + context; sampler 6,525,721 + context
    assert got[("a", 0)] == 20_285_696 + 5_071_424 + 6_525_721 + 2 * CUDA_CONTEXT == 1_105_624_665


def test_memory_per_gpu_seeds_layout():
    # (1, 3, 1): ZeRO-2 over 3: 12e6 // 3 = 4,000,000 and 2e6 // 3 = 666,666
    got = gpu_memory(["--nodes", "a:4", "--training-ranks", "3"], 3, 1)
    assert got == {("a", 0): learner(4_000_000 + 4_000_000 + 666_666),
                   ("a", 1): learner(4_666_666), ("a", 2): learner(4_666_666), ("a", 3): SAMPLER}
    assert got[("a", 1)] == 6_952_362 + 1_738_090 + CUDA_CONTEXT == 545_561_364


def test_memory_per_gpu_16_ranks_on_two_nodes():
    # (8, 16, 3): 12e6 / 16 = 750,000 and 2e6 / 16 = 125,000 on each of the 16 GPUs of nodes a and b
    got = gpu_memory(["--nodes", "a:8,b:8,c:8", "--training-ranks", "16", "--num-samplers", "8", "--run-dir", "/s"],
                     16, 8)
    assert got[("a", 0)] == learner(4_000_000 + 875_000)
    assert {got[("a", g)] for g in range(1, 8)} | {got[("b", g)] for g in range(8)} == {learner(875_000)}
    assert {got[("c", g)] for g in range(8)} == {SAMPLER} and len(got) == 24
    assert learner(875_000) == 3_160_696 + 790_174 + CUDA_CONTEXT == 540_821_782


def test_memory_per_gpu_two_mixed_nodes():
    # (2, 4, 2), 2 ranks a node: 12e6 / 4 = 3,000,000 and 2e6 / 4 = 500,000
    got = gpu_memory(["--nodes", "a:3,b:3", "--training-ranks", "4", "--ranks-per-node", "2", "--num-samplers", "2",
                      "--run-dir", "/s"], 4, 2)
    assert got == {("a", 0): learner(4_000_000 + 3_500_000), ("a", 1): learner(3_500_000),
                   ("a", 2): SAMPLER, ("b", 0): learner(3_500_000), ("b", 1): learner(3_500_000),
                   ("b", 2): SAMPLER}


def test_launcher_prints_the_plan_and_starts_nothing(monkeypatch, capsys, config_folder):
    folder = config_folder
    monkeypatch.setattr(launch_main, "check_ports", lambda *a: pytest.fail("--nodes checks no local port"))
    rc = launch_main.main(["--nodes", "10.0.0.1:2,10.0.0.2:1", "--training-ranks", "2", "--model", str(folder)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "memory plan: learner1" in out and "memory plan: sampler0" in out
    assert "node 1: 10.0.0.2\n  GPU 0: sampler0 (weights by nccl)  ~" in out
    assert "deepspeed --num_gpus 2 --master_port 29500 --no_local_rank training_worker.py" in out
    rc = launch_main.main(["--nodes", "a:1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--share-gpus" in err[0]
