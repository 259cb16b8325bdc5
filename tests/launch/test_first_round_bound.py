"""The launcher's default staleness bound fits the samplers' first round (grpo.launch.inflight.fit_first_round):
a sampler may make round 0 before the learner's first answer says the step's size and the budget, so a
default bound too small for it drops part of it stale. By hand, on the RunPlans the launcher makes."""
import pytest

from grpo.launch.inflight import resolve_in_flight
from grpo.launch.plan import choose_gpus, parse, place
from grpo.launch.runplan import from_flags, with_launch, with_placement


def bound_after(argv: list[str], cuda_count: int = 0, chosen: bool = False):
    """(the --max-staleness every learner rank gets from the launcher, None where it sets none; the
    samplers' --in-flight-rows) for the run of `argv`, after choose_gpus where --gpus is given, as
    main() resolves it."""
    cfg, to_s, to_l = parse(argv)
    rp = from_flags(cfg, to_s, to_l, chosen)
    if cfg.placement.gpus:
        rp = with_launch(rp, choose_gpus(cfg, cuda_count, None, 16)[0])
    placed = with_placement(rp, place(rp.launch, cuda_count))
    done = resolve_in_flight(placed, placed.placement.samplers, placed.placement.cuda)
    bound = done.learner.training.max_staleness
    return (None if bound == placed.learner.training.max_staleness else bound), done.sampler.rollout.in_flight_rows


CPU = ["--device", "cpu", "--model", "tiny-random"]


@pytest.mark.parametrize("extra, bound", [
    # the defaults on CPU (Hugging Face generate: no row bucket): round 0 of 8 prompts (8 groups
    # assumed a step until the first answer) against steps of 16 / 8 = 2 groups: (3 + 1) x 2 = 8
    ([], 3),
    (["--filter-zero-signal"], 3),               # 24 prompts, a third of them expected to be sent: 8
    (["--num-samplers", "2"], 7),                # 16 groups of version 0: (7 + 1) x 2
    (["--train-batch-size", "64"], None),        # steps of 8 groups: one step trains round 0
    (["--num-generations", "4"], None),          # steps of 4 groups: 8 fit (2 + 1) x 4 = 12
    (["--prompts-per-round", "6"], None),        # 6 groups: (2 + 1) x 2, the default fits
    (["--prompts-per-round", "7"], 3),
    (["--max-staleness", "2"], None),            # the user's bound, even where it is the default's value
    (["--max-staleness", "1"], None),
    # steps of 1 group, 2 samplers: 16 groups need 15, past AUTO_STALENESS_MAX (8): left to the run's end
    (["--train-batch-size", "8", "--num-samplers", "2"], None),
])
def test_a_default_bound_is_raised_to_train_the_first_round(capsys, extra, bound):
    got, _ = bound_after([*CPU, *extra])
    out, err = capsys.readouterr()
    assert got == bound and err == ""
    assert ("--max-staleness" in out) == (bound is not None)


def test_the_line_says_why(capsys):
    """On stdout, with the launcher's other start-up lines: stderr is kept for a refused launch's one line."""
    bound_after(CPU)
    assert capsys.readouterr().out == (
        "[launcher] --max-staleness 3, not the default 2, so that the learner trains every group of the samplers' "
        "first round: the sampler may make it before the learner's first answer says the step's size and the budget, "
        "8 groups of version 0, and at --max-staleness 2 the learner trains 6 of 8 (3 steps of 2 groups); give "
        "--max-staleness to choose\n")
    bound_after([*CPU, "--num-samplers", "2"])
    assert "each of the 2 samplers may make it before" in capsys.readouterr().out


@pytest.mark.parametrize("extra, rows, bound", [
    # --gpus 0 at the defaults (the one-H200 run): the sampler shares GPU 0 with the learner and keeps rows
    # in flight, decoding while it trains: 320 rows would need a bound past 8 at steps of 2 groups of 8,
    # so the 96 rows bound 6 keeps decoding (6 x 2 groups of 8), at 8, above round 0's 3
    ([], 96, 8),
    (["--num-generations", "4"], 96, 8),          # steps of 4 groups of 4: 6 x 4 groups of 4
    (["--no-cuda-graphs"], 96, 8),
    # rounds where the sampler cannot swap in flight: then round 0's bound alone. The engine's smallest
    # bucket would hold 8 prompts of G=8, as round 0 assumes anyway
    (["--generation-backend", "hf"], 0, 3),
    (["--weight-sync", "shared"], 0, 3),          # the sampler waits for the first answer a while, not for ever
    (["--in-flight-rows", "0"], 0, 3),
    (["--in-flight-rows", "0", "--num-generations", "4"], 0, 3),   # 16 prompts (the bucket) against steps of 4
    (["--in-flight-rows", "0", "--no-cuda-graphs", "--num-generations", "4"], 0, None),   # 8: fits 3 x 4
])
def test_one_shared_gpu_chosen_by_the_launcher(capsys, extra, rows, bound):
    assert bound_after(["--gpus", "0", *extra], cuda_count=1, chosen=True) == (bound, rows)
    out = capsys.readouterr().out
    assert (f"[launcher] --max-staleness {bound}, not the default 2" in out) == (bound is not None and rows == 0)


def test_rows_in_flight_keep_the_larger_bound(capsys):
    """Two GPUs chosen at the defaults: the sampler keeps 320 rows in flight, whose bound (40 groups over
    steps of 2: 20, past 8, so the 96 rows 6 keeps decoding, at 8) is above round 0's 3: one line, 8."""
    got, rows = bound_after(["--gpus", "0,1"], cuda_count=2, chosen=True)
    out, err = capsys.readouterr()
    assert (got, rows) == (8, 96) and "first round" not in out
    said = [line for line in err.splitlines() if line.startswith("run_distributed.py: --max-staleness")]
    assert len(said) == 1 and said[0].startswith("run_distributed.py: --max-staleness 8, not the default 2, so that "
                                                 "every in-flight row is kept decoding")
