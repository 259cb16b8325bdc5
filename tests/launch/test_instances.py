"""Operations, pure parts: GPU overlap refusal, instance planning (GPUs, ports, run dirs, seeds)."""
from pathlib import Path

import pytest

from grpo.config import LaunchConfig
from grpo.flags import build_parser
from grpo.launch.plan import LaunchError, as_visible, instance_argv, parse, plan, plan_instances
from grpo.launch.supervisor import describe_exit


def _cfg(argv):
    cfg, _, _ = parse(argv)
    return cfg


def test_overlapping_gpus_are_refused_unless_shared():
    cfg, s, l = parse(["--sampling-gpus", "0,1", "--training-gpus", "1,2"])
    with pytest.raises(LaunchError, match=r"GPU\(s\) 1 in both --sampling-gpus and --training-gpus.*--share-gpus"):
        plan(cfg, 4, s, l, master_port=1)
    cfg, s, l = parse(["--sampling-gpus", "0,1", "--training-gpus", "1,2", "--share-gpus"])
    assert len(plan(cfg, 4, s, l, master_port=1)) == 4
    # One GPU and no lists: sampler and learner share GPU 0 by default (nothing to refuse).
    cfg, s, l = parse([])
    assert [sp.env["CUDA_VISIBLE_DEVICES"] for sp in plan(cfg, 1, s, l, master_port=1)] == ["0", "0"]
    cfg, s, l = parse(["--sampling-gpus", "0", "--training-gpus", "1,4"])
    with pytest.raises(LaunchError, match="GPU 4 does not exist: this machine has 4"):
        plan(cfg, 4, s, l, master_port=1)


def test_describe_exit():
    assert describe_exit(3) == "failed with exit code 3"
    assert describe_exit(-9) == "was killed by SIGKILL"


def test_four_instances_on_eight_gpus():
    plan4 = plan_instances(_cfg(["--seeds", "42,1337,2024,9999", "--name", "gsm"]), cuda_count=8)
    assert [i.seed for i in plan4] == [42, 1337, 2024, 9999]
    assert [(i.sampling_gpus, i.training_gpus) for i in plan4] == [([0], [1]), ([2], [3]), ([4], [5]), ([6], [7])]
    assert [(i.data_port, i.sync_port) for i in plan4] == [(5555, 5556), (5557, 5558), (5559, 5560), (5561, 5562)]
    assert [str(i.run_dir) for i in plan4] == ["runs/gsm_seed42", "runs/gsm_seed1337", "runs/gsm_seed2024",
                                               "runs/gsm_seed9999"]
    # Two instances on 8 GPUs, no lists: blocks of 4, one sampler and three learner GPUs each.
    plan2 = plan_instances(_cfg(["--instances", "2", "--seed", "5", "--run-dir", "/r"]), cuda_count=8)
    assert [(i.seed, i.sampling_gpus, i.training_gpus, str(i.run_dir)) for i in plan2] == [
        (5, [0], [1, 2, 3], "/r/grpo_seed5"), (6, [4], [5, 6, 7], "/r/grpo_seed6")]
    # Instance 0's pattern given: shifted by (highest id + 1) for the next instance.
    plan3 = plan_instances(_cfg(["--seeds", "1,2", "--sampling-gpus", "0,1", "--training-gpus", "2"]), cuda_count=6)
    assert [(i.sampling_gpus, i.training_gpus) for i in plan3] == [([0, 1], [2]), ([3, 4], [5])]


def test_instances_on_cpu_get_ports_and_dirs_only():
    p = plan_instances(_cfg(["--device", "cpu", "--seeds", "7,8", "--data-port", "6000", "--sync-port", "6001"]), 0)
    assert [(i.seed, i.data_port, i.sync_port, i.sampling_gpus) for i in p] == [(7, 6000, 6001, []), (8, 6002, 6003, [])]


@pytest.mark.parametrize("argv,cuda,needle", [
    (["--seeds", "1,1"], 8, "repeats a seed"),
    (["--seeds", "1,x"], 8, "comma-separated integers"),
    (["--instances", "3", "--seeds", "1,2"], 8, "one seed per instance"),
    (["--instances", "4"], 6, "need at least 8 GPUs"),
    (["--seeds", "1,2,3", "--sampling-gpus", "0", "--training-gpus", "1,2"], 8, "would need GPU 8"),
    (["--seeds", "1,2", "--sampling-gpus", "0", "--training-gpus", "0,1"], 8, "in both --sampling-gpus"),
    (["--seeds", "1,2", "--sampling-gpus", "0"], 8, "give both --sampling-gpus and --training-gpus"),
    (["--seeds", "1,2", "--data-port", "7000", "--sync-port", "7002"], 8, "collide"),
    (["--seeds", "1,2"], 0, "CUDA is not available"),
])
def test_instance_plan_mistakes(argv, cuda, needle):
    with pytest.raises(LaunchError, match=needle):
        plan_instances(_cfg(["--device", "cuda" if cuda == 0 else "auto", *argv]), cuda)


def test_instance_argv_round_trips_through_the_parser():
    cfg = _cfg(["--seeds", "42,1337", "--max-steps", "7", "--no-deepspeed", "--restart-samplers", "2"])
    inst = plan_instances(cfg, cuda_count=4)[1]
    argv = instance_argv(cfg, inst, ["--beta", "0.1"])
    ns, rest = build_parser(LaunchConfig, "x").parse_known_args(argv[2:])
    assert (ns.seed, ns.instances, ns.seeds, ns.data_port, ns.sync_port) == (1337, 1, "", 5557, 5558)
    assert (ns.sampling_gpus, ns.training_gpus, ns.max_steps, ns.no_deepspeed, ns.restart_samplers) == \
        ("2", "3", 7, True, 2)
    assert Path(ns.run_dir) == Path("runs/grpo_seed1337") and rest == ["--beta", "0.1"]


@pytest.mark.parametrize("extra,needle", [
    ([], "--resume latest needs the --run-dir of the run to resume"),
    (["--run-dir", "{tmp}"], "--resume latest: no complete checkpoint under"),
])
def test_launcher_refuses_a_resume_that_cannot_work(tmp_path, capsys, extra, needle):
    from grpo.launch.main import main

    argv = ["--device", "cpu", "--resume", "latest"] + [x.format(tmp=tmp_path) for x in extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_gpu_indices_count_within_the_launchers_own_cuda_visible_devices(monkeypatch):
    """Under a CUDA_VISIBLE_DEVICES of the launcher's own (a scheduler's allocation, a benchmark row
    beside another), GPU i is that list's entry i, as torch numbers it: the workers get those
    entries. Two rows started as `CUDA_VISIBLE_DEVICES=1 run_distributed.py --gpus 0` and
    `CUDA_VISIBLE_DEVICES=0 ... --gpus 0` had all four processes on the host's GPU 0, and ran out of
    memory."""
    assert as_visible("1,0", "4,6") == "6,4" and as_visible("0", " 4, 6") == "4"
    assert as_visible("0", None) == "0" and as_visible("0,1", "") == "0,1" and as_visible("", "3") == ""
    assert as_visible("0", "GPU-aaaa,GPU-bbbb") == "GPU-aaaa"
    with pytest.raises(ValueError, match=r"GPU 2 is not among the 2 this process may use \(CUDA_VISIBLE_DEVICES=4,6\)"):
        as_visible("2", "4,6")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    cfg, s, l = parse(["--sampling-gpus", "1", "--training-gpus", "0"])
    assert [sp.env["CUDA_VISIBLE_DEVICES"] for sp in plan(cfg, 2, s, l, master_port=1)] == ["5", "7,5"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert [sp.env["CUDA_VISIBLE_DEVICES"] for sp in plan(cfg, 2, s, l, master_port=1)] == ["0", "1,0"]
