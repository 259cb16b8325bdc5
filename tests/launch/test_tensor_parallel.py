"""A vLLM sampler over several GPUs (--vllm-tensor-parallel-size N) in the launcher's plan, on CPU:
which GPUs each sampler gets and what it sees (CUDA_VISIBLE_DEVICES, --gpu-id), the --gpus split,
every refusal (one line, exit code 2 through the launcher), and the memory plan's processes on each
of a sampler's GPUs (grpo.launch.memfit.gpu_of; the items by hand in tests/rules/test_vllm_memory.py)."""
from types import SimpleNamespace

import pytest

from grpo.launch import main as launch_main
from grpo.launch import memfit, probe
from grpo.launch.plan import LaunchError, choose_gpus, parse, plan, plan_instances
from grpo.launch.runplan import Placement
from grpo.rules import memory
from grpo.rules.memory import GiB
from grpo.rules.tensor_parallel import sampler_groups, tensor_parallel_problem, visible_devices

VLLM2 = ["--generation-backend", "vllm", "--vllm-tensor-parallel-size", "2"]


def _plan(argv, cuda_count):
    cfg, to_s, to_l = parse(argv)
    return plan(cfg, cuda_count, to_s, to_l, master_port=29999)


def _flag(spec, name):
    return spec.argv[spec.argv.index(name) + 1]


def test_each_sampler_takes_n_consecutive_gpus_and_sees_them_first():
    specs = _plan([*VLLM2, "--sampling-gpus", "0,1,2,3", "--training-gpus", "4"], cuda_count=5)
    samplers = [s for s in specs if s.role == "sampler"]
    learners = [s for s in specs if s.role == "learner"]
    assert [s.name for s in samplers] == ["sampler0", "sampler1"]
    # its own two GPUs first (vLLM's worker of rank i on visible device i), then learner rank 0's GPU
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in samplers] == ["0,1,4", "2,3,4"]
    assert [_flag(s, "--gpu-id") for s in samplers] == ["0", "0"]
    assert [_flag(s, "--sampler-id") for s in samplers] == ["0", "1"]
    assert {_flag(s, "--num-samplers") for s in samplers} == {"2"}
    assert {_flag(s, "--vllm-tensor-parallel-size") for s in samplers} == {"2"}
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in learners] == ["4"]


def test_the_defaults_give_one_sampler_the_first_n_gpus():
    # three GPUs: the sampler on 0,1, the learner on the next one
    specs = _plan(VLLM2, cuda_count=3)
    assert [(s.name, s.env["CUDA_VISIBLE_DEVICES"]) for s in specs] == [("learner0", "2"), ("sampler0", "0,1,2")]
    # two GPUs: the learner beside the sampler on GPU 0, as the one-GPU default shares its GPU
    specs = _plan(VLLM2, cuda_count=2)
    assert [(s.name, s.env["CUDA_VISIBLE_DEVICES"]) for s in specs] == [("learner0", "0"), ("sampler0", "0,1")]


def test_a_learner_gpu_among_the_samplers_is_listed_once():
    specs = _plan([*VLLM2, "--sampling-gpus", "0,1", "--training-gpus", "1", "--share-gpus"], cuda_count=2)
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in specs if s.role == "sampler"] == ["0,1"]
    assert visible_devices((2, 3), 0) == "2,3,0" and visible_devices((2, 3), 3) == "2,3"


def test_one_gpu_per_sampler_is_the_plan_it_was():
    specs = _plan(["--sampling-gpus", "0,1", "--training-gpus", "2"], cuda_count=3)
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in specs if s.role == "sampler"] == ["0,2", "1,2"]


def test_sampler_groups_by_hand():
    assert sampler_groups([0, 1, 2, 3], 2) == [(0, 1), (2, 3)]
    assert sampler_groups([4, 5, 6, 7, 0, 1], 3) == [(4, 5, 6), (7, 0, 1)]
    assert sampler_groups([3, 1], 1) == [(3,), (1,)]
    with pytest.raises(ValueError, match=r"--sampling-gpus 0,1,2 lists 3 GPU\(s\), not a multiple of "
                                         r"--vllm-tensor-parallel-size 2 .* e.g. --sampling-gpus 0,1$"):
        sampler_groups([0, 1, 2], 2)


@pytest.mark.parametrize("tp, backend, device, sync, words", [
    (1, "fast", "cuda", "auto", None),
    (2, "vllm", "cuda", "auto", None),
    (2, "vllm", "cuda", "ipc", None),
    (2, "auto", "cuda", "auto", "but --generation-backend is auto: add --generation-backend vllm"),
    (4, "fast", "cuda", "auto", "--vllm-tensor-parallel-size 4 spreads vLLM's engine over 4 GPUs"),
    (2, "vllm", "cpu", "auto", "needs CUDA GPUs (vLLM does), but the run is on cpu"),
    (2, "vllm", "cuda", "shared", "with --weight-sync shared"),
])
def test_tensor_parallel_problem(tp, backend, device, sync, words):
    problem = tensor_parallel_problem(tp, backend, device, sync)
    if words is None:
        assert problem is None
    else:
        assert words in problem and "\n" not in problem


@pytest.mark.parametrize("argv, cuda_count, words", [
    (["--vllm-tensor-parallel-size", "2", "--sampling-gpus", "0,1", "--training-gpus", "2"], 3,
     "--vllm-tensor-parallel-size 2 spreads vLLM's engine over 2 GPUs, but --generation-backend is auto: add "
     "--generation-backend vllm, or drop --vllm-tensor-parallel-size"),
    ([*VLLM2, "--sampling-gpus", "0,1,2", "--training-gpus", "3"], 4,
     "--sampling-gpus 0,1,2 lists 3 GPU(s), not a multiple of --vllm-tensor-parallel-size 2 (each vLLM sampler "
     "takes 2): list a multiple of 2, e.g. --sampling-gpus 0,1"),
    ([*VLLM2], 1, "--vllm-tensor-parallel-size 2: a sampler takes 2 GPUs, but this machine has 1; lower "
                  "--vllm-tensor-parallel-size"),
    ([*VLLM2, "--device", "cpu"], 0, "--vllm-tensor-parallel-size 2 needs CUDA GPUs (vLLM does), but the run is on "
                                     "cpu: drop --vllm-tensor-parallel-size or run on GPUs"),
    ([*VLLM2, "--weight-sync", "shared", "--sampling-gpus", "0,1", "--training-gpus", "0", "--share-gpus"], 2,
     "--vllm-tensor-parallel-size 2 with --weight-sync shared"),
    ([*VLLM2, "--gpus", "0,1"], 2, "--gpus gives 2 GPU(s): a vLLM sampler over 2 GPUs "
                                   "(--vllm-tensor-parallel-size 2) and a learner rank need at least 3"),
    ([*VLLM2, "--gpus", "0"], 1, "--gpus gives 1 GPU(s)"),
    ([*VLLM2, "--nodes", "a:4,b:4"], 0, "--vllm-tensor-parallel-size 2 with --nodes: the several-node plan gives "
                                        "each sampler one GPU"),
    ([*VLLM2, "--instances", "2"], 4, "2 instances need at least 6 GPUs (a sampler of 2 GPUs and a learner each)"),
    ([*VLLM2, "--seeds", "1,2", "--sampling-gpus", "0,1,2", "--training-gpus", "3"], 8,
     "--sampling-gpus 0,1,2 lists 3 GPU(s), not a multiple of --vllm-tensor-parallel-size 2"),
])
def test_each_refusal_is_one_line_and_exit_2_before_anything_loads(monkeypatch, capsys, tmp_path, argv, cuda_count,
                                                                   words):
    monkeypatch.setattr(launch_main, "cuda_device_count", lambda: cuda_count)
    monkeypatch.setattr(launch_main, "sampler_problem", lambda cfg: None)
    started = []
    monkeypatch.setattr(launch_main, "start", lambda *a: started.append(a) or 0)
    monkeypatch.setattr(launch_main, "start_instances", lambda *a: started.append(a) or 0)
    rc = launch_main.main(["--model", "tiny-random", "--run-dir", str(tmp_path / "run"), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and started == [] and not (tmp_path / "run").exists()
    assert len(err) == 1 and err[0].startswith("run_distributed.py: error: ") and words in err[0], err


def test_gpus_splits_in_whole_samplers_of_n():
    cfg, _, _ = parse([*VLLM2, "--gpus", "0,1,2,3"])
    chosen, line = choose_gpus(cfg, 4, 10**9, 16, tp=2)
    # the only split: one sampler on two GPUs, two learner ranks (two samplers would leave no rank)
    assert (chosen.placement.sampling_gpus, chosen.placement.training_gpus) == ("0,1", "2,3")
    assert not chosen.placement.share_gpus
    assert "1 sampler of 2 GPUs, each costed as one GPU" in line and "on 2 ranks" in line
    cfg, _, _ = parse([*VLLM2, "--gpus", "0,1,2"])
    chosen, _ = choose_gpus(cfg, 3, 10**9, 16, tp=2)
    assert (chosen.placement.sampling_gpus, chosen.placement.training_gpus) == ("0,1", "2")
    # and the chosen flags are a plan the launcher takes: sampler0 on 0,1
    specs = _plan([*VLLM2, "--sampling-gpus", "0,1", "--training-gpus", "2"], 3)
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in specs if s.role == "sampler"] == ["0,1,2"]
    with pytest.raises(LaunchError, match="need at least 3"):
        choose_gpus(parse([*VLLM2, "--gpus", "0,1"])[0], 2, 10**9, 16, tp=2)


def test_seeded_instances_give_each_instance_whole_samplers():
    cfg, _, _ = parse([*VLLM2, "--instances", "2"])
    insts = plan_instances(cfg, 6, tp=2)
    # no lists: equal blocks of 3, the first two GPUs of each sampling
    assert [(i.sampling_gpus, i.training_gpus) for i in insts] == [([0, 1], [2]), ([3, 4], [5])]
    # instance 0's lists, shifted by the highest id + 1 for the next: whole samplers of two each
    cfg, _, _ = parse([*VLLM2, "--seeds", "1,2", "--sampling-gpus", "0,1,2,3", "--training-gpus", "4"])
    insts = plan_instances(cfg, 10, tp=2)
    assert [(i.sampling_gpus, i.training_gpus) for i in insts] == [([0, 1, 2, 3], [4]), ([5, 6, 7, 8], [9])]


def test_the_memory_plan_places_each_vllm_worker_on_its_gpu():
    def samplers(engine_process: bool, backend: str = "vllm"):
        return SimpleNamespace(rollout=SimpleNamespace(vllm_engine_process=engine_process, generation_backend=backend))

    rp = SimpleNamespace(placement=Placement(True, 1, 2, (4,), (0, 1, 2, 3), 2), sampler=samplers(False))
    assert memfit.gpu_of(rp) == {"learner0": 4, "sampler0": 0, "sampler0.tp0": 0, "sampler0.tp1": 1,
                                 "sampler1": 2, "sampler1.tp0": 2, "sampler1.tp1": 3}
    one = SimpleNamespace(placement=Placement(True, 1, 2, (2,), (0, 1)), sampler=samplers(False))
    assert memfit.gpu_of(one) == {"learner0": 2, "sampler0": 0, "sampler1": 1}
    # --vllm-engine-process: each sampler's one worker in its engine-core process, on the sampler's GPU
    apart = SimpleNamespace(placement=one.placement, sampler=samplers(True))
    assert memfit.gpu_of(apart) == {"learner0": 2, "sampler0": 0, "sampler0.tp0": 0, "sampler1": 1, "sampler1.tp0": 1}
    # the flag means nothing without vLLM: our engine's sampler is one process
    fast = SimpleNamespace(placement=one.placement, sampler=samplers(True, "fast"))
    assert memfit.gpu_of(fast) == {"learner0": 2, "sampler0": 0, "sampler1": 1}


def test_the_fit_check_covers_every_gpu_of_a_sampler(monkeypatch, capsys, config_folder):
    """GPU 1 holds only vLLM's rank-1 worker: its share of vLLM's weights and KV cache, the 1 GiB
    workspace and a CUDA context (0.5 GiB), 1.51 GiB: on a 1 GiB GPU the plan is refused there."""
    monkeypatch.setattr(launch_main, "cuda_device_count", lambda: 3)
    monkeypatch.setattr(launch_main, "sampler_problem", lambda cfg: None)
    monkeypatch.setattr(probe, "gpu_total_bytes", lambda: {0: 80 * GiB, 1: GiB, 2: 80 * GiB})
    rc = launch_main.main(["--model", str(config_folder), *VLLM2, "--sampling-gpus", "0,1", "--training-gpus", "2"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "memory plan: sampler0.tp0" in err and "memory plan: sampler0.tp1" in err
    assert "does not fit GPU 1: sampler0.tp1 need about 1.51 GiB of its 1.00 GiB" in err
    assert "the biggest item is sampler0.tp1's vLLM workspace" in err
    # a GPU of 2 GiB holds it: the check goes on (to the port check, stopped here on purpose)
    monkeypatch.setattr(probe, "gpu_total_bytes", lambda: {0: 80 * GiB, 1: 2 * GiB, 2: 80 * GiB})
    monkeypatch.setattr(launch_main, "check_ports", lambda *a: (_ for _ in ()).throw(LaunchError("ports reached")))
    rc = launch_main.main(["--model", str(config_folder), *VLLM2, "--sampling-gpus", "0,1", "--training-gpus", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and "ports reached" in err and "does not fit" not in err


def test_the_launchers_run_shape_knows_the_vllm_sampler(config_folder):
    cfg, to_s, to_l = parse(["--model", str(config_folder), *VLLM2])
    from grpo.launch.runplan import from_flags

    inputs = memfit.memory_inputs(from_flags(cfg, to_s, to_l), 1, 1)
    assert inputs[1].vllm and inputs[1].tensor_parallel == 2
    p = memory.plan(*inputs)
    assert list(p) == ["learner0", "sampler0", "sampler0.tp0", "sampler0.tp1"]


def test_the_launchers_plan_puts_vllms_engine_process_on_the_samplers_gpu(config_folder):
    """--vllm-engine-process on one GPU a sampler: the launcher's run shape carries it, and the plan holds
    vLLM's items in sampler0.tp0 (its engine-core process) on sampler 0's GPU, none in sampler0 itself;
    without it (the default, or --no-vllm-engine-process) they are in sampler0."""
    from grpo.launch.plan import place
    from grpo.launch.runplan import from_flags, with_placement

    one = ["--model", str(config_folder), "--generation-backend", "vllm", "--sampling-gpus", "0", "--training-gpus", "1"]
    rp = from_flags(*parse([*one, "--vllm-engine-process"]))
    shape, run = memfit.memory_inputs(rp, 1, 1)
    assert run.vllm and run.vllm_process and run.tensor_parallel == 1
    p = memory.plan(shape, run)
    assert list(p) == ["learner0", "sampler0", "sampler0.tp0"]
    assert "vLLM weights" in dict(p["sampler0.tp0"]) and "vLLM weights" not in dict(p["sampler0"])
    rp = with_placement(rp, place(rp.launch, 2, 1))
    assert memfit.gpu_of(rp) == {"learner0": 1, "sampler0": 0, "sampler0.tp0": 0}
    for flags in ([], ["--no-vllm-engine-process"]):
        rp = from_flags(*parse([*one, *flags]))
        shape, run = memfit.memory_inputs(rp, 1, 1)
        assert not run.vllm_process and list(memory.plan(shape, run)) == ["learner0", "sampler0"]
        assert memfit.gpu_of(with_placement(rp, place(rp.launch, 2, 1))) == {"learner0": 1, "sampler0": 0}


def test_the_end_of_run_layout_advice_is_not_given_for_samplers_over_several_gpus(monkeypatch, tmp_path):
    """The advice's splits count one GPU a sampler, so a run whose samplers spread over two says none."""
    import json

    from grpo.launch import supervisor

    monkeypatch.setattr(supervisor, "measured", lambda metrics, summary: {"step_s": 1.0})
    monkeypatch.setattr(supervisor, "advice", lambda rates, sampling, training: f"split {sampling} {training}")
    (tmp_path / "metrics.jsonl").write_text("")
    cfg, _, _ = parse([*VLLM2, "--sampling-gpus", "0,1", "--training-gpus", "2,3"])
    assert supervisor.layout_note(cfg, tmp_path, {}) == "split [0, 1] [2, 3]"   # no sampler config: one GPU each
    (tmp_path / "config_sampler0.json").write_text(json.dumps({"vllm_tensor_parallel_size": 1}))
    assert supervisor.layout_note(cfg, tmp_path, {}) == "split [0, 1] [2, 3]"
    (tmp_path / "config_sampler0.json").write_text(json.dumps({"vllm_tensor_parallel_size": 2}))
    assert supervisor.layout_note(cfg, tmp_path, {}) is None


@pytest.mark.parametrize("tp, widths, sizes", [
    (2, (9, 3, 1536), "1 or 3"),           # SmolLM2-135M: 9 heads, 3 KV heads
    (4, (14, 2, 4864), "1 or 2"),          # Qwen2.5-0.5B: 14 heads
    (8, (28, 4, 18944), "1 or 2 or 4"),    # Qwen2.5-7B: 28 heads do not split over 8
    (3, (4, 2, 256), "1 or 2 or 4"),       # the test config: 4 heads; 4 GPUs replicate its 2 KV heads
])
def test_a_model_vllm_cannot_split_is_refused_naming_the_sizes_that_would(tp, widths, sizes):
    from grpo.rules.tensor_parallel import model_problem

    problem = model_problem(tp, *widths)
    assert problem.endswith(f"use --vllm-tensor-parallel-size {sizes}") and "\n" not in problem
    assert f"its {widths[0]} attention heads" in problem


def test_models_vllm_can_split():
    from grpo.rules.tensor_parallel import model_problem

    assert model_problem(2, 14, 2, 4864) is None       # Qwen2.5-0.5B over 2
    assert model_problem(4, 28, 4, 18944) is None      # Qwen2.5-7B over 4
    assert model_problem(16, 32, 8, 14336) is None     # more GPUs than KV heads: vLLM replicates them
    assert model_problem(2, 0, 0, 0) is None           # widths not known: left to vLLM
    assert model_problem(1, 9, 3, 1536) is None


def test_the_launcher_refuses_a_model_vllm_cannot_split(monkeypatch, capsys, config_folder):
    monkeypatch.setattr(launch_main, "cuda_device_count", lambda: 4)
    monkeypatch.setattr(launch_main, "sampler_problem", lambda cfg: None)
    rc = launch_main.main(["--model", str(config_folder), "--generation-backend", "vllm",
                           "--vllm-tensor-parallel-size", "3", "--sampling-gpus", "0,1,2", "--training-gpus", "3"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "memory plan" not in err[0], err
    assert err[0] == ("run_distributed.py: error: --vllm-tensor-parallel-size 3 cannot split the model (vLLM splits "
                      "its 4 attention heads, 2 KV heads and MLP width 256 evenly over a sampler's GPUs): use "
                      "--vllm-tensor-parallel-size 1 or 2 or 4")
