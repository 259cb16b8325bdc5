"""The launcher's default staleness bound fits the samplers' first round (grpo.launch.main.fit_first_round):
a sampler may make round 0 before the learner's first answer says the step's size and the budget, so a
default bound too small for it drops part of it stale. By hand, on the plans the launcher makes."""
import pytest

from grpo.launch import main as launch_main
from grpo.launch.plan import choose_gpus, parse, plan


def bound_after(argv: list[str], cuda_count: int = 0, chosen: bool = False):
    """(the --max-staleness every learner rank ends up with, None where none is added; the launcher's
    stderr lines) for the run of `argv`, after choose_gpus where --gpus is given, as main() plans it."""
    cfg, to_s, to_l = parse(argv)
    if cfg.gpus:
        cfg, _ = choose_gpus(cfg, cuda_count, None, 16)
    specs = plan(cfg, cuda_count, to_s, to_l, 29999)
    before = {s.name: len(s.argv) for s in specs}
    launch_main.apply_in_flight(specs, chosen)
    added = {tuple(s.argv[before[s.name]:]) for s in specs if s.role == "learner"}
    assert len(added) == 1   # every rank alike
    (flags,) = added
    assert not flags or flags[:-1] == ("--max-staleness",)
    return (int(flags[-1]) if flags else None), [s.argv for s in specs if s.role == "sampler"]


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


@pytest.mark.parametrize("extra, bound", [
    # --gpus 0 at the defaults (the one-H200 run): the sampler shares GPU 0 with the learner and decodes in
    # rounds; the engine's smallest bucket, 64 rows, holds 8 prompts of G=8, as round 0 assumes anyway
    ([], 3),
    # G=4: the bucket makes a round of 16 prompts cost what 8 would, so round 0 takes 16 groups against
    # steps of 4: (3 + 1) x 4 (on CPU, without buckets, the same flags need nothing: above)
    (["--num-generations", "4"], 3),
    (["--no-cuda-graphs"], 3),                    # no bucket: FIRST_STEP_GROUPS, 8
    (["--no-cuda-graphs", "--num-generations", "4"], None),
    (["--generation-backend", "hf"], 3),
    (["--weight-sync", "shared"], 3),             # the sampler waits for the first answer a while, not for ever
])
def test_one_shared_gpu_chosen_by_the_launcher(capsys, extra, bound):
    got, samplers = bound_after(["--gpus", "0", *extra], cuda_count=1, chosen=True)
    assert got == bound and "--in-flight-rows" not in samplers[0]   # rounds: the GPU is the learner's too
    out = capsys.readouterr().out
    assert (f"[launcher] --max-staleness {bound}, not the default 2" in out) == (bound is not None)


def test_rows_in_flight_keep_the_larger_bound(capsys):
    """Two GPUs chosen at the defaults: the sampler keeps 320 rows in flight, whose bound (40 groups over
    steps of 2: 20, past 8, so the 96 rows 6 keeps decoding, at 8) is above round 0's 3: one line, 8."""
    got, samplers = bound_after(["--gpus", "0,1"], cuda_count=2, chosen=True)
    out, err = capsys.readouterr()
    assert got == 8 and samplers[0][-2:] == ["--in-flight-rows", "96"] and "first round" not in out
    said = [line for line in err.splitlines() if line.startswith("run_distributed.py: --max-staleness")]
    assert len(said) == 1 and said[0].startswith("run_distributed.py: --max-staleness 8, not the default 2, so that "
                                                 "every in-flight row is kept decoding")
