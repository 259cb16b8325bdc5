"""The RunPlan (grpo.launch.runplan): each role's config parsed once from the launcher's command line,
and argv written back from a config only at spawn time; a worker's parse of that argv gives the same
config back, whatever the launcher chose on it."""
from dataclasses import replace

import pytest

from grpo.config import LearnerConfig, SamplerConfig, SamplerData, from_flat
from grpo.flags import parse_config
from grpo.launch.plan import parse, place, plan, specs
from grpo.launch.runplan import changed_flags, from_flags, with_placement, worker_argv


def round_trip(cfg):
    return parse_config(type(cfg), worker_argv(cfg), "worker")


@pytest.mark.parametrize("cfg", [
    SamplerConfig(),
    LearnerConfig(),
    from_flat(SamplerConfig, in_flight_rows=320, swap_in_flight=False, temperature=0.7, sampler_id=3, num_samplers=4,
              gpu_id=0),
    from_flat(LearnerConfig, max_staleness=7, learning_rate=2e-6, micro_batch_tokens=-1, no_deepspeed=True,
              device="cpu",
                  warm_up=False, lora_target_modules="q_proj,v_proj"),
])
def test_a_config_comes_back_from_its_argv(cfg):
    assert round_trip(cfg) == cfg


def test_only_what_differs_is_written():
    assert worker_argv(LearnerConfig()) == []
    assert worker_argv(from_flat(LearnerConfig, max_staleness=5, warm_up=False)) == ["--no-warm-up", "--max-staleness",
                                                                                     "5"]
    assert changed_flags(SamplerConfig(), SamplerConfig(), always=("sampler_id",)) == ["--sampler-id", "0"]


def test_a_config_file_is_the_baseline(tmp_path):
    """A value the file sets is not written again; one a flag set back to the class default is, since
    the file would otherwise win in the worker."""
    path = tmp_path / "run.yaml"
    path.write_text("max_staleness: 4\nbeta: 0.5\nprompts_per_round: 3\n")
    cfg, to_s, to_l = parse(["--config", str(path), "--device", "cpu", "--beta", "0.04"])
    rp = from_flags(cfg, to_s, to_l)
    assert (rp.learner.training.max_staleness, rp.learner.loss.beta, rp.sampler.rollout.prompts_per_round) == (4, 0.04,
                                                                                                               3)
    argv = worker_argv(rp.learner)
    assert argv[:2] == ["--config", str(path.resolve())] and "--max-staleness" not in argv
    assert argv[argv.index("--beta") + 1] == "0.04"
    assert round_trip(rp.learner) == rp.learner and round_trip(rp.sampler) == rp.sampler


@pytest.mark.parametrize("argv, cuda_count", [
    (["--device", "cpu", "--training-ranks", "2", "--num-samplers", "2", "--beta", "0.1", "--dataset", "x",
      "--prompts-per-round", "7", "--max-steps", "3", "--no-deepspeed", "--training-ranks", "1"], 0),
    (["--sampling-gpus", "0,1", "--training-gpus", "2,3", "--learning-rate", "3e-6", "--in-flight-rows", "64",
      "--max-staleness", "0", "--no-cuda-graphs"], 4),
])
def test_every_process_parses_back_the_plans_config(argv, cuda_count):
    """Each spawned process's argv, parsed as its worker parses it, is the plan's role config with
    that process's own id, GPU and run folder; choices made on the plan travel the same way."""
    cfg, to_s, to_l = parse(argv)
    rp = with_placement(from_flags(cfg, to_s, to_l), place(cfg, cuda_count))
    rp = replace(rp, learner=replace(rp.learner, training=replace(rp.learner.training, max_staleness=6)),
                 sampler=replace(rp.sampler, rollout=replace(rp.sampler.rollout, in_flight_rows=96)))
    procs = specs(rp, 29500, "/tmp/run")
    for p in procs:
        role = LearnerConfig if p.role == "learner" else SamplerConfig
        got = parse_config(role, p.argv[2:], "worker")
        k = int(p.name.removeprefix(p.role))
        if p.role == "learner":
            want = replace(rp.learner, run=replace(rp.learner.run, gpu_id=k if cuda_count else -1, run_dir="/tmp/run"))
        else:
            want = replace(rp.sampler, run=replace(rp.sampler.run, sampler_id=k, num_samplers=rp.placement.samplers,
                                                   gpu_id=0 if cuda_count else -1, run_dir="/tmp/run"))
        assert got == want, p.name
    assert specs(rp, 29500, "/tmp/run") == procs   # the same plan, the same processes
    assert plan(cfg, cuda_count, to_s, to_l, 29500)[0].argv[:2] == procs[0].argv[:2]


def test_workers_trust_the_plan_and_check_flags_given_by_hand(monkeypatch, tmp_path):
    """A spawned worker's environment says the launcher checked its flags (PLANNED_ENV): a sampler then
    skips the checks the plan already made; started by hand it refuses a bad id or data set path."""
    from grpo import workers
    from grpo.launch.runplan import PLANNED_ENV

    cfg, to_s, to_l = parse(["--device", "cpu"])
    assert all(p.env[PLANNED_ENV] == "1" for p in plan(cfg, 0, to_s, to_l, 29500))
    bad = from_flat(SamplerConfig, sampler_id=2, num_samplers=2, dataset=str(tmp_path / "none.jsonl"))
    monkeypatch.delenv(PLANNED_ENV, raising=False)
    with pytest.raises(Exception, match="none.jsonl"):
        workers._sampler_checks(bad)
    with pytest.raises(ValueError, match="--sampler-id 2 must be in 0..1"):
        workers._sampler_checks(replace(bad, data=replace(bad.data, dataset=SamplerData.dataset)))
    monkeypatch.setenv(PLANNED_ENV, "1")
    assert workers._sampler_checks(bad)[0] == "sampler2"


def test_a_config_file_leaves_to_the_launcher_what_it_does_not_set(tmp_path):
    """An option is the launcher's to choose unless a flag or a key of the --config file sets it: a
    file that sizes the run but says nothing of rows in flight still gets them (the GPU demo ran with
    fixed rounds when any --config file counted as setting everything)."""
    from grpo.launch.inflight import AUTO_IN_FLIGHT_ROWS, in_flight_rows

    sizing = tmp_path / "sizing.yaml"
    sizing.write_text("num_generations: 16\ntrain_batch_size: 128\nmax_new_tokens: 512\ngeneration_backend: fast\n")
    rows = tmp_path / "rows.yaml"
    rows.write_text("in-flight-rows: 64\n")
    rp = from_flags(*parse(["--config", str(sizing), "--device", "cuda"]))
    assert rp.left_default("in_flight_rows") and rp.left_default("max_staleness")
    assert in_flight_rows(rp, 1, True) == AUTO_IN_FLIGHT_ROWS
    typed = from_flags(*parse(["--config", str(sizing), "--device", "cuda", "--max-staleness", "3"]))
    assert not typed.left_default("max_staleness") and typed.left_default("in_flight_rows")
    filed = from_flags(*parse(["--config", str(rows), "--device", "cuda"]))
    assert not filed.left_default("in_flight_rows") and filed.left_default("max_staleness")
    assert in_flight_rows(filed, 1, True) == 0     # the user's 64 stands: the launcher adds none


def test_without_the_checkouts_scripts_workers_start_as_a_module(tmp_path):
    """An installed package has no sampling_worker.py beside it: the launcher then starts
    `python -m grpo.workers ROLE`, which is the same worker (its flags, its one-line refusals)."""
    import subprocess
    import sys

    from grpo.launch.plan import ROOT, ProcSpec, worker_command

    assert worker_command("sampler") == [sys.executable, str(ROOT / "sampling_worker.py")]
    assert worker_command("learner", tmp_path) == [sys.executable, "-m", "grpo.workers", "learner"]
    spec = ProcSpec("sampler0", [*worker_command("sampler", tmp_path), "--seed", "3"], {}, "sampler")
    assert spec.flags == ["--seed", "3"]
    assert ProcSpec("learner0", [*worker_command("learner"), "--seed", "3"], {}, "learner").flags == ["--seed", "3"]
    out = subprocess.run([*worker_command("sampler", tmp_path), "--loss-type", "x"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.strip() == "sampling_worker.py: error: unknown flag --loss-type (see --help)"
    bad = subprocess.run([sys.executable, "-m", "grpo.workers", "judge"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip() == "usage: python -m grpo.workers sampler|learner [flags]"
