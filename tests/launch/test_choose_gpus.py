"""run_distributed.py --gpus: the flag's checks, the choice as the explicit flags it stands for (one
host and --nodes), the launcher's one start-up line, and --layout-from's measured rates."""
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from netutil import free_port_run

from grpo.launch import main as launch_main
from grpo.rules.layout import Rates
from grpo.launch.nodes import choose_nodes_split, plan_nodes
from grpo.launch.inflight import resolve_in_flight
from grpo.launch.plan import LaunchError, check_gpus_flags, choose_gpus, gpus_to_lay_out, parse, place, plan
from grpo.launch.runplan import RunPlan, from_flags, with_placement

ROOT = Path(__file__).resolve().parents[2]
def resolved(cfg, to_s, to_l, cuda_count: int, chosen: bool) -> tuple[RunPlan, RunPlan]:
    """(the placed plan of these flags, the plan with the launcher's in-flight choices made on it)."""
    rp = with_placement(from_flags(cfg, to_s, to_l, chosen), place(cfg, cuda_count))
    return rp, resolve_in_flight(rp, rp.placement.samplers, rp.placement.cuda)


Q05 = 494_032_768                 # Qwen2.5-Coder-0.5B's parameters, as the memory plan counts them
WORKLOAD = ["--num-generations", "16", "--max-new-tokens", "512"]   # the real workload's; T = 128 x 512


@pytest.mark.parametrize("argv, match", [
    (["--gpus", "0,1", "--sampling-gpu", "0"], "but --sampling-gpus gives that too: drop --gpus to give the split "
                                               "yourself, or drop --sampling-gpus to let --gpus choose"),
    (["--gpus", "0,1", "--training-gpus", "1", "--share-gpus"], "but --training-gpus/--share-gpus give that too"),
    (["--gpus", "0", "--device", "cpu"], "--gpus lists GPUs but --device is cpu"),
    (["--gpus", "0,1", "--seeds", "1,2"], "with --instances/--seeds give instance 0's --sampling-gpus"),
    (["--layout-from", "runs/a"], "--layout-from costs the split that --gpus chooses; add --gpus"),
    (["--nodes", "a:4,b:4", "--gpus", "0,1"], "--gpus 0,1 with --nodes: the nodes list their own GPUs; pass --gpus all"),
    (["--nodes", "a:4,b:4", "--gpus", "all", "--num-samplers", "2"], "--gpus all chooses --training-ranks and "
                                                                     "--num-samplers over --nodes"),
])
def test_gpus_with_flags_that_give_the_split_too_is_refused(argv, match):
    with pytest.raises(LaunchError, match=match.replace("(", r"\(").replace(")", r"\)")):
        check_gpus_flags(parse(argv)[0])


def test_gpus_alone_and_the_explicit_flags_alone_pass():
    for argv in (["--gpus", "0,1,2,3"], ["--gpus", "all", "--layout-from", "runs/a"], ["--nodes", "a:4", "--gpus", "all"],
                 ["--sampling-gpu", "0", "--training-gpus", "1,2,3"], ["--sampling-gpus", "0", "--training-gpus", "0",
                                                                       "--share-gpus"], []):
        check_gpus_flags(parse(argv)[0])


def test_gpus_ids():
    assert gpus_to_lay_out("all", 3) == [0, 1, 2]
    assert gpus_to_lay_out(" 2,3 ", 4) == [2, 3]
    with pytest.raises(LaunchError, match=r"GPU 4 does not exist: this machine has 4 GPU\(s\) \(0..3\); fix --gpus"):
        gpus_to_lay_out("3,4", 4)
    with pytest.raises(LaunchError, match="CUDA is not available here; use --device cpu"):
        gpus_to_lay_out("all", 0)
    with pytest.raises(LaunchError, match="lists a GPU twice"):
        gpus_to_lay_out("1,1", 4)


@pytest.mark.parametrize("gpus, params, explicit", [
    ("0,1,2,3", Q05, ["--sampling-gpus", "0,1", "--training-gpus", "2,3"]),        # 1.70 s against 3.40 and 1.85
    ("all", 4 * Q05, ["--sampling-gpus", "0", "--training-gpus", "1,2,3"]),        # training 4x: 1+3 at 3.40 s
    ("5,6", Q05, ["--sampling-gpus", "5", "--training-gpus", "6"]),
    ("2", Q05, ["--sampling-gpus", "2", "--training-gpus", "2", "--share-gpus"]),
])
def test_the_choice_is_the_plan_of_the_explicit_flags(gpus, params, explicit):
    cfg, to_s, to_l = parse(["--gpus", gpus, *WORKLOAD, "--train-batch-size", "128", "--max-steps", "7"])
    chosen, line = choose_gpus(cfg, 8 if gpus == "5,6" else 4, params, 128)
    want, want_s, want_l = parse([*explicit, *WORKLOAD, "--train-batch-size", "128", "--max-steps", "7"])
    assert chosen == want and (to_s, to_l) == (want_s, want_l)
    assert plan(chosen, 8, to_s, to_l, 29999) == plan(want, 8, want_s, want_l, 29999)
    assert line.startswith(f"layout: --gpus {gpus} -> ") and f"(as {' '.join(explicit)}; why: " in line
    assert "\n" not in line


@pytest.mark.parametrize("gpus, extra, rows, bound", [
    ("0,1,2,3", [], 320, 7),                      # 2+2: 20 groups of 16 rows each at steps of 8 groups: 5 fill, +2
    ("0,1", [], 320, 5),                          # 1+1: 3 fill, +2
    ("0,1", ["--max-staleness", "5"], 320, None),  # 5 keeps 320 rows decoding: kept as given
    ("0,1,2,3", ["--max-staleness", "4"], 0, None),  # 4 keeps 256 of each 320: rounds, bound kept
    # 4 groups a step: 320 rows need 10, 12 is past 8; bound 6 fills 6 x 4 / 2 = 12 groups, 192 rows
    ("0,1,2,3", ["--train-batch-size", "64"], 192, 8),
    ("0,1,2,3", ["--train-batch-size", "16"], 48, 8),   # 1 group a step: 6 x 1 / 2 = 3 groups
    ("0,1,2,3", ["--train-batch-size", "16", "--max-staleness", "2"], 0, None),   # the user's bound: rounds
    ("0", [], 320, 5),                            # one GPU: the sampler decodes while the learner trains; 3 fill, +2
    ("0", ["--weight-sync", "shared"], 0, None),  # one GPU, shared weights: the two take turns
    ("0,1,2,3", ["--in-flight-rows", "0"], 0, None),  # the user's rounds
    ("0,1,2,3", ["--in-flight-rows", "64"], 64, None),  # the user's rows (the bound fills 64)
    ("0,1,2,3", ["--generation-backend", "hf"], 0, None),
    ("0,1,2,3", ["--weight-sync", "shared"], 0, None),  # shared weights swap only between rounds
    ("0,1,2,3", ["--no-swap-in-flight"], 0, None),
])
def test_the_chosen_layout_keeps_rows_in_flight_where_the_bound_fills_them(capsys, gpus, extra, rows, bound):
    """--gpus chooses how samplers decode too: on the real workload's steps (128 completions in groups
    of 16, 8 groups a step), samplers on GPUs of their own keep 320 rows in flight, and a default
    bound becomes the one that fills them, +2; where that would pass 8, where the user chose the rows
    or the bound, or where the sampler cannot swap in flight, nothing is added."""
    cfg, to_s, to_l = parse(["--gpus", gpus, *WORKLOAD, "--train-batch-size", "128", *extra])
    chosen, _ = choose_gpus(cfg, 4, Q05, 128)
    _, done = resolved(chosen, to_s, to_l, 4, chosen=True)
    err = capsys.readouterr().err
    given = int(extra[extra.index("--max-staleness") + 1]) if "--max-staleness" in extra else 2
    assert (done.sampler.rollout.in_flight_rows, done.learner.training.max_staleness) == (rows, bound or given)
    said = "run_distributed.py: --in-flight-rows 320 on each sampler: they decode with the engine and swap" in err
    assert said == (rows == 320 and "--in-flight-rows" not in extra)
    fewer = f"run_distributed.py: --in-flight-rows {rows} on each sampler: they decode" in err and \
        "; not 320, which would need a --max-staleness past 8 to keep decoding\n" in err
    assert fewer == (0 < rows < 320 and "--in-flight-rows" not in extra)
    if bound:
        assert f"run_distributed.py: --max-staleness {bound}, not the default 2" in err


def test_measured_rates_move_the_choice():
    cfg = parse(["--gpus", "0,1,2,3", *WORKLOAD])[0]
    # generation 10 s a step on one GPU, training 1.8 s on one rank: 3+1 (3.33 s) against 2+2 (5 s)
    chosen, line = choose_gpus(cfg, 4, Q05, 128, Rates(6553.6, {3: 0.6}, 65536, "runs/a"))
    assert (chosen.placement.sampling_gpus, chosen.placement.training_gpus) == ("0,1,2", "3")
    assert "by rates measured in runs/a: 3+1 takes about 3.33 s a step" in line


def test_gpus_all_over_nodes_is_the_plan_of_the_chosen_counts():
    argv = ["--nodes", "10.0.0.1:4,10.0.0.2:4", "--run-dir", "/shared/x", *WORKLOAD]
    cfg, to_s, to_l = parse([*argv, "--gpus", "all"])
    # 0.5B over 8 GPUs: 5+3 (0.68 s) as on one host; the ranks fit node 0's 4 GPUs
    chosen, line = choose_nodes_split(cfg, Q05, 128)
    want, _, _ = parse([*argv, "--training-ranks", "3", "--num-samplers", "5"])
    assert chosen == want
    assert plan_nodes(chosen, to_s, to_l) == plan_nodes(want, to_s, to_l)
    assert line.startswith("layout: --nodes 10.0.0.1:4,10.0.0.2:4 --gpus all -> 3 learner ranks + 5 samplers "
                           "(as --training-ranks 3 --num-samplers 5; why: 494M parameters")
    # learner ranks fill whole nodes of --ranks-per-node 4: 4+4 (0.85 s), the best that can be placed
    chosen, _ = choose_nodes_split(parse([*argv, "--gpus", "all", "--ranks-per-node", "4"])[0], Q05, 128)
    assert (chosen.placement.training_ranks, chosen.placement.num_samplers) == (4, 4)
    chosen, line = choose_nodes_split(parse(["--nodes", "a:1", "--gpus", "all"])[0], Q05, 128)
    assert (chosen.placement.training_ranks, chosen.placement.num_samplers, chosen.placement.share_gpus) == (1, 1, True)
    with pytest.raises(LaunchError, match="finds no split of --nodes a:2,b:2 that fills every GPU"):
        choose_nodes_split(parse(["--nodes", "a:2,b:2", "--gpus", "all", "--ranks-per-node", "3"])[0], Q05, 128)


def test_layout_inputs_read_the_models_size_and_the_batch(config_folder):
    cfg, _, to_l = parse(["--model", str(config_folder), "--train-batch-size", "64"])
    # config_folder: 2 layers of hidden 64 (q 64, k/v 32, MLP 256), 1000 untied embeddings:
    # 2 x (4096 + 4096 + 4096 + 49152 + 128) + 2 x 64,000 + 64 = 251,200
    assert launch_main.layout_inputs(cfg, to_l) == (251_200, 64)
    assert launch_main.layout_inputs(parse(["--model", "no/such-hub-id"])[0], []) == (None, 16)


def write_run(folder: Path, sampling: str = "0", training: str = "1,2") -> Path:
    folder.mkdir()
    steps = [{"step": k, "step_time_s": 2.0, "train_s": 0.5} for k in (1, 2, 3)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    (folder / "summary.json").write_text(json.dumps({"steps": 3, "samplers": {"0": {"stats": {"gen_s": 6.0}}}}))
    (folder / "config_launch.json").write_text(json.dumps({"sampling_gpus": sampling, "training_gpus": training}))
    (folder / "config_learner.json").write_text(json.dumps({"train_batch_size": 16, "max_new_tokens": 256}))
    return folder


def test_layout_from_reads_an_earlier_runs_rates(tmp_path):
    assert launch_main.read_rates("") is None
    run = write_run(tmp_path / "a")
    # 6 busy sampler-seconds over 3 steps: 2 s a step for T = 4096; the 2 ranks train 0.5 s a step
    assert launch_main.read_rates(str(run)) == Rates(2048.0, {2: 0.5}, 4096, str(run))
    with pytest.raises(LaunchError, match=r"--layout-from .*b: cannot read metrics.jsonl there; give a finished run's"):
        launch_main.read_rates(str(tmp_path / "b"))
    shared = write_run(tmp_path / "c", "0", "0")
    with pytest.raises(LaunchError, match="did not have GPUs of their own.*; give another run's folder, or drop"):
        launch_main.read_rates(str(shared))
    (run / "config_learner.json").write_text("{}")
    with pytest.raises(LaunchError, match="no 'train_batch_size' in its files"):
        launch_main.read_rates(str(run))


def test_launcher_says_its_choice_and_plans_the_explicit_flags(monkeypatch, capsys, config_folder):
    """main() on a machine that seems to have 4 GPUs: one layout line, then the plan of the chosen
    flags, up to the busy data port (the last check before any worker starts)."""
    planned = []
    monkeypatch.setattr(launch_main, "cuda_device_count", lambda: 4)
    monkeypatch.setattr(launch_main.probe, "gpu_total_bytes", lambda: {})
    resolve = launch_main.resolve
    monkeypatch.setattr(launch_main, "resolve", lambda rp, *a: planned.append(rp.launch) or resolve(rp, *a))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", free_port_run(2)))
        busy.listen()
        port = busy.getsockname()[1]
        ports = ["--data-port", str(port), "--sync-port", str(port + 1)]
        rc = launch_main.main(["--gpus", "0,1,2,3", "--model", str(config_folder), *ports])
    out, err = capsys.readouterr()
    lines = [x for x in out.splitlines() if "layout:" in x]
    assert rc == 2 and f"port {port} on 127.0.0.1 is already in use" in err
    # a 251,200-parameter model trains in no time: as many samplers as the step has groups (16 / 8)
    assert lines == ["[launcher] layout: --gpus 0,1,2,3 -> sampling GPUs 0,1 + training GPUs 2,3 (as --sampling-gpus "
                     "0,1 --training-gpus 2,3; why: 251,200 parameters, 16 x 256 tokens a step, by the default rates: 2+2 "
                     "takes about 0.11 s a step (generation 0.11 s on 2 GPUs, training 0.00 s on 2 ranks); 1+3 0.21 s; "
                     "at most 2 samplers (16 / 8 groups a step))"]
    assert planned == [parse(["--sampling-gpus", "0,1", "--training-gpus", "2,3", "--model", str(config_folder),
                              *ports])[0]]


def test_gpus_with_a_role_flag_is_one_line_and_exit_2(tmp_path):
    """The real launcher, as a user types it: the conflict is the first thing said, on a machine with
    GPUs or without."""
    out = subprocess.run([sys.executable, str(ROOT / "run_distributed.py"), "--gpus", "0,1", "--sampling-gpu", "0",
                          "--run-dir", str(tmp_path / "run")], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    err = out.stderr.strip().splitlines()
    assert out.returncode == 2 and out.stdout == "", out.stderr
    assert err == ["run_distributed.py: error: --gpus chooses which GPUs sample and which train, but --sampling-gpus "
                   "gives that too: drop --gpus to give the split yourself, or drop --sampling-gpus to let --gpus "
                   "choose"]
    assert not (tmp_path / "run").exists()


def test_a_layout_given_by_hand_keeps_its_rounds_and_is_told_of_rows_in_flight(capsys):
    """The seed's --sampling-gpu 0 --training-gpus 1,2,3 runs as given: where --gpus would keep rows
    in flight, one line says so and nothing is added."""
    cfg, to_s, to_l = parse(["--sampling-gpu", "0", "--training-gpus", "1,2,3", *WORKLOAD, "--train-batch-size", "128"])
    placed, done = resolved(cfg, to_s, to_l, 4, chosen=False)
    assert done == placed
    assert capsys.readouterr().err == (
        "run_distributed.py: note: the samplers decode in rounds, each row idle from its own end to its round's "
        "longest; --in-flight-rows 320 would keep every row decoding, weights swapped between decode steps "
        "(--gpus chooses it)\n")
    cfg, to_s, to_l = parse(["--sampling-gpu", "0", "--training-gpus", "0", "--share-gpus", *WORKLOAD])
    # one shared GPU: rounds, and the same word of rows in flight
    _, done = resolved(cfg, to_s, to_l, 4, chosen=False)
    # (1 group of 16 a step: 320 rows would need a bound past 8, and 6 keeps 6 groups, 96 rows, decoding);
    # with the default 16 completions a step, round 0's 8 groups (made before the learner's first
    # answer) need a bound of 8 - 1 = 7 (fit_first_round)
    out, err = capsys.readouterr()
    assert err == (
        "run_distributed.py: note: the samplers decode in rounds, each row idle from its own end to its round's "
        "longest; --in-flight-rows 96 would keep every row decoding, weights swapped between decode steps "
        "(--gpus chooses it)\n") and out == (
        "[launcher] --max-staleness 7, not the default 2, so that the learner trains every group of the samplers' "
        "first round: the sampler may make it before the learner's first answer says the step's size and the budget, "
        "8 groups of version 0, and at --max-staleness 2 the learner trains 3 of 8 (3 steps of 1 group); give "
        "--max-staleness to choose\n")
    assert (done.learner.training.max_staleness, done.sampler.rollout.in_flight_rows) == (7, 0)


def test_gpus_all_over_nodes_keeps_rows_in_flight_by_the_one_host_rule(capsys):
    """--nodes: the same in-flight choice and bound as one host, on each node's GPUs. 2 learner ranks on
    node a, 2 samplers on node b (GPUs of their own, weights by nccl): 320 rows, bound 7, in the printed
    commands; 3 samplers (320 rows would need bound 10, past 8) keep the 256 rows bound 6 fills, at 8;
    a sampler beside a learner rank (--share-gpus, one node of one GPU) keeps rows in flight too, and a
    layout given by hand keeps its rounds."""
    argv = ["--nodes", "a:2,b:2", "--training-ranks", "2", "--num-samplers", "2", *WORKLOAD, "--train-batch-size", "128"]
    cfg, to_s, to_l = parse(argv)
    done, mp = launch_main.node_in_flight(from_flags(cfg, to_s, to_l, chosen=True), plan_nodes(cfg, to_s, to_l))
    want = plan_nodes(cfg, to_s + ["--in-flight-rows", "320"], to_l + ["--max-staleness", "7"])
    assert mp == want and (done.sampler.rollout.in_flight_rows, done.learner.training.max_staleness) == (320, 7)
    assert all(p.argv[-2:] == ["--in-flight-rows", "320"] for p in mp.procs("sampler"))
    assert all(p.argv[-2:] == ["--max-staleness", "7"] for p in mp.procs("learner"))
    assert "--in-flight-rows 320" in mp.nodes[1].commands[2] and "--max-staleness 7" in mp.nodes[0].commands[2]
    err = capsys.readouterr().err
    assert "--in-flight-rows 320 on each sampler" in err and "--max-staleness 7, not the default 2" in err
    plain = plan_nodes(cfg, to_s, to_l)
    assert launch_main.node_in_flight(from_flags(cfg, to_s, to_l), plain)[1] is plain   # by hand: a note only
    assert "note: the samplers decode in rounds" in capsys.readouterr().err
    cfg, to_s, to_l = parse(["--nodes", "a:2,b:2", "--training-ranks", "1", "--num-samplers", "3", *WORKLOAD,
                             "--train-batch-size", "128"])
    _, mp = launch_main.node_in_flight(from_flags(cfg, to_s, to_l, chosen=True), plan_nodes(cfg, to_s, to_l))
    assert mp == plan_nodes(cfg, to_s + ["--in-flight-rows", "256"], to_l + ["--max-staleness", "8"])
    capsys.readouterr()
    cfg, to_s, to_l = parse(["--nodes", "a:1", "--training-ranks", "1", "--num-samplers", "1", "--share-gpus",
                             *WORKLOAD, "--train-batch-size", "128"])
    _, mp = launch_main.node_in_flight(from_flags(cfg, to_s, to_l, chosen=True), plan_nodes(cfg, to_s, to_l))
    assert mp == plan_nodes(cfg, to_s + ["--in-flight-rows", "320"], to_l + ["--max-staleness", "5"])   # 3 fill, +2
    assert "--in-flight-rows 320 on each sampler" in capsys.readouterr().err
