"""Real processes, real sockets, real DeepSpeed groups (gloo) on the CPU.

These start the entry scripts exactly as a user would and check what a user would look at:
exit codes, metrics.jsonl, summary.json and the per-process logs.
"""
import json
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from netutil import free_ports

from grpo.model.load import load_causal_lm, weights_checksum

ROOT = Path(__file__).resolve().parents[2]
GSM8K = ROOT.parent / "shared" / "data" / "gsm8k"
PY = sys.executable


def env():
    e = dict(os.environ, PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    return e


def run(args, timeout, **kw):
    return subprocess.run([PY, *args], cwd=ROOT, env=env(), capture_output=True, text=True, timeout=timeout, **kw)


def steps_of(run_dir):
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in lines if not r.get("final")], json.loads((run_dir / "summary.json").read_text())


def test_communication_test_script(tmp_path):
    """Started from another folder, as `python path/to/communication_test.py` (its sampler-side child
    still finds the package). A pass writes nothing to stderr: the receiver's warning for the malformed
    message the test sends on purpose is said beside its check, as expected, announced before it."""
    d, s = free_ports(2)
    r = subprocess.run([PY, str(ROOT / "communication_test.py"), "--data-port", str(d), "--sync-port", str(s)],
                       cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stderr == ""
    out = r.stdout.splitlines()
    assert out[-1] == "communication test: 5 passed, 0 failed", r.stdout
    assert "then one malformed message on purpose (the receiver must drop it and go on)" in out[0], r.stdout
    rejected = next(i for i, x in enumerate(out) if x.startswith("  [ok] malformed message rejected"))
    assert out[rejected + 1].startswith("       expected: dropped a bad data message (bad_header): "), r.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_run_distributed_cpu_two_ranks_two_samplers(tmp_path):
    """The issue's CPU run: a 2-rank ZeRO-2 learner and 2 samplers through run_distributed.py."""
    d, s = free_ports(2)
    run_dir = tmp_path / "run"
    r = run(["run_distributed.py", "--device", "cpu", "--training-ranks", "2", "--num-samplers", "2",
             "--max-steps", "3", "--model", "tiny-random", "--dataset", str(GSM8K), "--num-generations", "4",
             "--prompts-per-round", "1", "--train-batch-size", "8", "--max-new-tokens", "16",
             "--eval-every", "2", "--eval-size", "3", "--weight-sync", "nccl", "--verify-weight-sync",
             "--save-weights-every-s", "0.001", "--ppo-minibatches", "2", "--tis-cap", "2",
             "--entropy-coef", "0.01", "--data-port", str(d), "--sync-port", str(s), "--run-dir", str(run_dir)], timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr + _logs(run_dir)
    steps, summary = steps_of(run_dir)
    assert [x["step"] for x in steps] == [1, 2, 3]
    # --ppo-minibatches 2: each step's two groups are two DeepSpeed updates on both ranks
    assert all(x["updates"] == 2 for x in steps) and summary["optimizer_updates"] == 6
    assert all(x["is_weight_max"] >= x["is_weight_mean"] > 0 and 0 <= x["is_limited_frac"] <= 1 for x in steps)
    assert all(math.isfinite(x["loss"]) for x in steps)
    # --entropy-coef: the whole distribution's entropy per generated token, both ranks' tokens
    # together; the tiny random model's is near that of a uniform one over its 49,152 tokens
    assert all(0 < x["policy_entropy"] <= math.log(49152) + 1e-3 for x in steps), [x["policy_entropy"] for x in steps]
    assert all(x["sequences"] == 8 for x in steps)          # both ranks' shards add up to the batch
    assert all(len(x["rank_tokens_per_s"]) == 2 and min(x["rank_tokens_per_s"]) > 0 for x in steps)
    assert all(0.0 <= x["pad_frac"] < 1.0 for x in steps)   # both ranks' padded slots, gathered
    # each sampler's overlap with the learner's training, once it has sent two statuses: a share
    assert all(set(x["both_busy_share"]) <= {"0", "1"} and all(v is None or 0.0 <= v <= 1.0
                                                              for v in x["both_busy_share"].values()) for x in steps)
    # ZeRO-2 keeps a full copy of the (updated) weights on every rank: both fingerprints agree
    assert len(summary["rank_weight_checksums"]) == 2 and summary["ranks_identical"], summary
    acc = summary["groups"]
    dropped = sum(acc["dropped"].values())
    assert acc["sent"] == acc["trained"] + dropped + acc["queued"], acc
    assert acc["trained"] == 3 * 2 and acc["balanced"]
    # both samplers took part, reported a version newer than the initial weights, and stopped cleanly
    assert set(summary["samplers"]) == {"0", "1"}
    assert all(v["final"] and v["version"] >= 1 for v in summary["samplers"].values()), summary["samplers"]
    for name in ("learner0", "learner1", "sampler0", "sampler1"):
        assert (run_dir / f"{name}.log").exists()
    # --weight-sync nccl on CPU: each sampler got its versions over its own gloo pair group
    for k in (0, 1):
        assert "MB by nccl applied" in (run_dir / f"sampler{k}.log").read_text()
    # --verify-weight-sync: every version a sampler applied is bit-identical to what rank 0 published
    ver = summary["weight_sync_verified"]
    assert ver["all_matched"] and ver["mismatched"] == 0 and set(ver["per_sampler"]) == {"0", "1"}, ver
    log0 = (run_dir / "learner0.log").read_text()
    assert "DeepSpeed ZeRO stage 2 engine" in log0 and "balanced" in log0
    assert "learner passes: padding-free" in log0          # the default, for this Llama
    # gloo's collectives, without DeepSpeed's shared-memory op (a C++ build before a CPU run starts)
    for k in (0, 1):
        assert "deepspeed_shm_comm" not in (run_dir / f"learner{k}.log").read_text()
    assert (run_dir / "config_learner.json").exists() and (run_dir / "config_launch.json").exists()
    # every JSON file of the run says what made it: its process's command line and the code's commit,
    # the launcher's, passed to its workers (one git call a run)
    from grpo.obs.rundir import code_commit

    made = {name: json.loads((run_dir / name).read_text()) for name in
            ("config_launch.json", "config_learner.json", "config_sampler0.json", "summary.json",
             "sampler1_result.json", "stages/learner0.json", "stages/sampler1.json")}
    assert {m["commit"] for m in made.values()} == {code_commit()}
    assert "run_distributed.py" in made["config_launch.json"]["command"]
    assert all("training_worker.py" in made[n]["command"] for n in ("config_learner.json", "summary.json",
                                                                      "stages/learner0.json"))
    assert "sampling_worker.py" in made["sampler1_result.json"]["command"]
    # --eval-every: sampler 0 scored the initial weights (the baseline), the learner its final ones
    evals = [json.loads(x) for x in (run_dir / "eval.jsonl").read_text().splitlines()]
    assert (0, "sampler0") in {(e["version"], e["by"]) for e in evals}
    assert (3, "learner") in {(e["version"], e["by"]) for e in evals} and all(e["n"] == 3 for e in evals)
    # ... with one decoder (--generation-backend's rule, the same for both roles)
    assert {e["decoder"] for e in evals} == {"hf"}
    assert summary["final_eval"]["version"] == 3
    assert any(x["eval"] and x["eval"]["version"] == 0 for x in steps)
    # --save-weights-every-s: rank 0 saved the policy after every step (each took longer than 1 ms),
    # stamped in order, and the last save is the final weights every rank holds
    saves = [json.loads((run_dir / "weights" / f"step_{k}" / "weights.json").read_text()) for k in (1, 2, 3)]
    assert [w["step"] for w in saves] == [1, 2, 3] and saves[0]["wall_time"] < saves[1]["wall_time"] < saves[2]["wall_time"]
    assert sorted(p.name for p in (run_dir / "weights").iterdir()) == ["step_1", "step_2", "step_3"]
    model = load_causal_lm(str(run_dir / "weights" / "step_3"), torch.device("cpu"), torch.float32)
    assert weights_checksum(model) == summary["rank_weight_checksums"][0]


@pytest.mark.slow
def test_two_terminals_real_model_sampler_first(tmp_path):
    """The default SmolLM2-135M model, worker scripts started by hand, sampler before learner."""
    d, s = free_ports(2)
    run_dir = tmp_path / "run"
    # Short problems in GSM8K's form (a folder of train/test.jsonl): ~50 prompt tokens where
    # GSM8K's average ~105, and a 135M model's CPU passes (prefill, both log-prob passes,
    # training) take time in proportion to the tokens
    data = tmp_path / "data"
    data.mkdir()
    rows = "".join(json.dumps({"question": f"What is {a} + {b}?", "answer": f"{a} + {b} = {a + b}\n#### {a + b}"})
                   + "\n" for a, b in ((2, 3), (4, 1), (6, 7), (9, 2)))
    for split in ("train", "test"):
        (data / f"{split}.jsonl").write_text(rows)
    # groups of 2 short completions: a 135M model's decode and training steps are slow on a CPU
    common = ["--device", "cpu", "--data-port", str(d), "--sync-port", str(s), "--run-dir", str(run_dir),
              "--num-generations", "2", "--max-new-tokens", "8"]
    sampler = subprocess.Popen([PY, "sampling_worker.py", *common, "--dataset", str(data),
                                "--prompts-per-round", "1"], cwd=ROOT, env=env(),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # the sampler is up (its start marked; it goes on to load the model) before the learner
        # exists: ZeroMQ connects later
        deadline = time.monotonic() + 300
        while not (run_dir / "stages" / "sampler0.json").exists():
            assert sampler.poll() is None, sampler.communicate()[0][-4000:]
            assert time.monotonic() < deadline, "the sampler never marked its start"
            time.sleep(0.1)
        # --max-staleness 0: step 2 trains only on a group generated at version 1, so the sampler
        # must have applied v1 (without it, under load, both steps could use v0 groups and the
        # stop could come before the sampler ever asked for v1).
        learner = run(["training_worker.py", *common, "--max-steps", "2", "--train-batch-size", "2",
                       "--learning-rate", "1e-5", "--max-staleness", "0"], timeout=900)
        out, _ = sampler.communicate(timeout=300)
    finally:
        sampler.kill()
    assert learner.returncode == 0, learner.stderr[-4000:]
    assert sampler.returncode == 0, out[-4000:]
    steps, summary = steps_of(run_dir)
    assert [x["step"] for x in steps] == [1, 2] and all(math.isfinite(x["loss"]) for x in steps)
    assert summary["groups"]["balanced"]
    assert "now running policy version" in out and "learner says stop" in out
    assert summary["samplers"]["0"]["version"] >= 1


def _logs(run_dir):
    out = []
    for p in sorted(Path(run_dir).glob("*.log")):
        out.append(f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-30:]))
    return "\n".join(out)


@pytest.mark.parametrize("args,needle", [
    (["training_worker.py", "--bogus-flag"], "--bogus-flag"),
    (["sampling_worker.py", "--gpu-id", "0"], "CUDA is not available"),
    (["training_worker.py", "--gpu-id", "3"], "CUDA is not available"),
    (["sampling_worker.py", "--device", "cpu", "--dataset", "/nonexistent/gsm8k"], "/nonexistent/gsm8k"),
    (["training_worker.py", "--device", "cpu", "--model", "/nonexistent/model"], "/nonexistent/model"),
    (["run_distributed.py", "--device", "cpu", "--frobnicate", "1"], "--frobnicate"),
    (["training_worker.py", "--device", "cpu", "--loss-type", "ppo"], "--loss-type: invalid choice: 'ppo'"),
    (["training_worker.py", "--device", "cpu", "--weight-sync", "ipc"], "--weight-sync ipc needs a CUDA learner"),
    (["run_distributed.py", "--sampling-gpu", "0", "--training-gpus", "1,2,3"], "CUDA is not available"),
    (["run_distributed.py", "--device", "cpu", "--loss-type", "ppo"], "--loss-type: invalid choice: 'ppo'"),
    (["run_distributed.py", "--device", "cpu", "--dataset", "/nonexistent/gsm8k"], "'/nonexistent/gsm8k' does not exist"),
    (["sampling_worker.py", "--device", "cpu", "--generation-backend", "vllm"], "--generation-backend vllm needs vLLM: pip install '.[vllm]'"),
    # found by a worker after the launch: the worker's line is the launcher's, exit 2, no run folder
    (["run_distributed.py", "--device", "cpu", "--weight-sync", "ipc", "--max-steps", "1"],
     "run_distributed.py: error: --weight-sync ipc needs a CUDA learner"),
    # found by a sampler after the learner bound its ports (its model loads after that), before any step
    (["run_distributed.py", "--device", "cpu", "--model", "tiny-random", "--in-flight-rows", "64",
      "--max-staleness", "4", "--max-steps", "1"],
     "run_distributed.py: error: --in-flight-rows 64: needs --generation-backend fast (here it is hf)"),
])
def test_user_mistakes_get_one_line_and_no_traceback(args, needle, tmp_path):
    """Exit code 2, one line naming the mistake, and no run folder left behind (the workers remove
    the one they made; the launcher refuses before it makes one)."""
    if args[0] == "run_distributed.py":   # ports of its own, whatever holds the defaults on this host
        d, s = free_ports(2)
        args = [*args, "--data-port", str(d), "--sync-port", str(s)]
    r = run([*args, "--run-dir", str(tmp_path / "run")], timeout=300)   # not runs/<id> in the checkout
    assert r.returncode == 2
    err = r.stderr.strip().splitlines()
    assert "Traceback" not in r.stderr
    assert len(err) == 1 and needle in err[0], r.stderr
    assert not (tmp_path / "run").exists()


def test_worker_mistakes_known_without_torch_are_found_before_it_is_imported(tmp_path):
    """--gpu-id or --device cuda where the CUDA driver sees no GPU (here: none visible), a --dataset
    path that does not exist, and a CPU learner's --weight-sync ipc end either worker with its one
    line before torch or transformers is imported (seconds of a refused start; the weight-sync rules
    bring numpy), and before a run folder is made."""
    code = ("import sys\nfrom grpo.workers import learner_main, sampler_main\n"
            f"rc = sampler_main(['--gpu-id', '0', '--run-dir', {str(tmp_path / 's')!r}]), "
            f"learner_main(['--device', 'cuda', '--run-dir', {str(tmp_path / 'l')!r}]), "
            f"sampler_main(['--device', 'cpu', '--dataset', '/nonexistent/gsm8k', '--run-dir', {str(tmp_path / 'd')!r}]), "
            f"learner_main(['--device', 'cpu', '--weight-sync', 'ipc', '--run-dir', {str(tmp_path / 'w')!r}])\n"
            "print(rc, sorted(n for n in ('torch', 'transformers') if n in sys.modules))\n")
    r = subprocess.run([PY, "-c", code], cwd=ROOT, env=env(), capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "(2, 2, 2, 2) []", r.stdout + r.stderr
    err = r.stderr.splitlines()
    assert err[:2] == [f"{w}: error: CUDA is not available on this machine; use --device cpu "
                       f"(and drop --gpu-id)" for w in ("sampling_worker.py", "training_worker.py")], r.stderr
    assert len(err) == 4 and err[2].startswith("sampling_worker.py: error: Dataset folder '/nonexistent/gsm8k' "
                                               "does not exist."), r.stderr
    assert err[3] == ("training_worker.py: error: --weight-sync ipc needs a CUDA learner; use --weight-sync tcp "
                      "(or auto) on CPU"), r.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_refused_start_leaves_a_folder_that_existed_as_it_was(tmp_path):
    run_dir = tmp_path / "mine"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("keep")
    r = run(["training_worker.py", "--device", "cpu", "--model", "/nonexistent/model", "--run-dir", str(run_dir)],
            timeout=120)
    assert r.returncode == 2 and "/nonexistent/model" in r.stderr
    assert (run_dir / "notes.txt").read_text() == "keep"


def test_a_refused_start_with_the_default_run_dir_leaves_no_runs_folder(tmp_path):
    """Without --run-dir a worker makes runs/<id>; refused, it removed <id> but left an empty runs/
    behind. Now runs/ goes too where this start made it, and stays where it held another run."""
    args = [str(ROOT / "training_worker.py"), "--device", "cpu", "--model", "/nonexistent/model"]
    r = subprocess.run([PY, *args], cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "/nonexistent/model" in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "runs" / "earlier").mkdir(parents=True)
    r = subprocess.run([PY, *args], cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["earlier"]


def test_training_worker_finds_the_default_deepspeed_config_from_another_folder(tmp_path):
    """deepspeed.json is looked up beside the entry scripts when the working directory has none:
    the error that comes is the model's, not the config's."""
    r = subprocess.run([PY, str(ROOT / "training_worker.py"), "--device", "cpu", "--model", "/nonexistent/model",
                        "--run-dir", str(tmp_path / "run")], cwd=tmp_path, env=env(), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "/nonexistent/model" in r.stderr and "deepspeed" not in r.stderr.lower(), r.stderr


def test_busy_port_is_reported_with_the_flag(tmp_path):
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    port = blocker.getsockname()[1]
    try:
        free = free_ports(2)   # the other port of each pair: free, whatever holds the defaults on this host
        for args, flag in ((["training_worker.py", "--device", "cpu", "--data-port", str(port),
                             "--sync-port", str(free[0]), "--run-dir", str(tmp_path)], "--data-port"),
                           (["run_distributed.py", "--device", "cpu", "--sync-port", str(port),
                             "--data-port", str(free[1])], "--sync-port")):
            r = run(args, timeout=120)
            assert r.returncode == 2 and "Traceback" not in r.stderr
            line = r.stderr.strip().splitlines()
            assert len(line) == 1 and "in use" in line[0] and flag in line[0], r.stderr
    finally:
        blocker.close()


@pytest.mark.slow
def test_max_time_ends_a_run_whose_samplers_send_nothing(tmp_path):
    """--max-time-s bounds the run even when no step's data ever comes: the random model's groups
    all lack signal and --filter-zero-signal drops each at the sampler, so the 2-rank learner waits
    for its first step until the time is up, then every rank stops together, with the books balanced."""
    d, s = free_ports(2)
    run_dir = tmp_path / "run"
    t0 = time.monotonic()
    r = run(["run_distributed.py", "--device", "cpu", "--training-ranks", "2", "--max-steps", "5",
             "--max-time-s", "4", "--model", "tiny-random", "--dataset", str(GSM8K), "--num-generations", "4",
             "--prompts-per-round", "1", "--train-batch-size", "8", "--max-new-tokens", "8", "--eval-every", "0",
             "--filter-zero-signal", "--data-port", str(d), "--sync-port", str(s), "--run-dir", str(run_dir)],
            timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr + _logs(run_dir)
    steps, summary = steps_of(run_dir)
    assert summary["steps"] == 0 and steps == []
    acc = summary["groups"]
    assert acc["balanced"] and acc["trained"] == 0 and acc["sent"] == acc["dropped"].get("sampler_zero_signal", 0)
    assert "--max-time-s reached while waiting for data" in (run_dir / "learner0.log").read_text()
    assert time.monotonic() - t0 < 400


@pytest.mark.slow
def test_a_run_to_max_steps_generates_no_group_its_steps_cannot_train(tmp_path):
    """--max-steps 3, one group a step, a bound that would let the sampler run 5 groups ahead: from
    the learner's first answer on, the budget stops at the groups the steps left train, so the run
    ends with nothing queued that no step took (one-prompt rounds: round 0, before any answer, is
    one group too)."""
    d, s = free_ports(2)
    run_dir = tmp_path / "run"
    r = run(["run_distributed.py", "--device", "cpu", "--max-steps", "3", "--model", "tiny-random",
             "--dataset", str(GSM8K), "--num-generations", "4", "--prompts-per-round", "1",
             "--train-batch-size", "4", "--max-new-tokens", "8", "--max-staleness", "4",
             "--data-port", str(d), "--sync-port", str(s), "--run-dir", str(run_dir)], timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr + _logs(run_dir)
    steps, summary = steps_of(run_dir)
    assert [x["step"] for x in steps] == [1, 2, 3]
    acc = summary["groups"]
    assert acc == {"received": 3, "trained": 3, "dropped": {}, "queued": 0, "sent": 3, "balanced": True}, acc


@pytest.mark.slow
def test_two_samplers_share_what_the_last_steps_train(tmp_path):
    """Two samplers, one group a step, --max-steps 3, a bound that alone would let 5 groups wait:
    the run ends with its 3 steps and at most one group a sampler made in vain (each rounds its
    share of what is left up, so 1 group left is 1 for each, never 0 for both; and neither counts
    the other's groups still on the way)."""
    d, s = free_ports(2)
    run_dir = tmp_path / "run"
    r = run(["run_distributed.py", "--device", "cpu", "--num-samplers", "2", "--max-steps", "3",
             "--model", "tiny-random", "--dataset", str(GSM8K), "--num-generations", "4",
             "--prompts-per-round", "1", "--train-batch-size", "4", "--max-new-tokens", "8",
             "--max-staleness", "4", "--data-port", str(d), "--sync-port", str(s), "--run-dir", str(run_dir)],
            timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr + _logs(run_dir)
    steps, summary = steps_of(run_dir)
    assert [x["step"] for x in steps] == [1, 2, 3]
    acc = summary["groups"]
    assert acc["trained"] == 3 and acc["dropped"] == {} and acc["queued"] <= 2 and acc["balanced"], acc
