"""What the report says of a before/after accuracy pair: a change within the noise of the
evaluation's problems is said to be so (the CPU demo's 8 problems), a larger one as points and ratio."""
from grpo.obs.report import change_note, eval_summary


def test_change_note_by_hand():
    # 1/8 -> 2/8: variances .125 x .875 + .25 x .75 = .296875; pooled .1875: 2 x .1875 x .8125 = .3046875
    # (the larger); / 8 = .038086, sqrt .19516, two of them .390 > .125
    assert change_note(0.125, 0.25, 8) == "+0.125, within the noise of 8 problems (two standard errors: 0.390)"
    # 29/200 -> 59/200: .145 x .855 + .295 x .705 = .33195; pooled .22: .3432 (the larger); / 200, sqrt,
    # twice: .0829 < .15
    assert change_note(0.145, 0.295, 200) == "+15.0 points, 2.03x (two standard errors: 0.083)"
    # from zero: no ratio; pooled .15: 2 x .15 x .85 = .255 against .3 x .7 = .21; / 200, sqrt, twice: .0714
    assert change_note(0.0, 0.3, 200) == "+30.0 points (two standard errors: 0.071)"
    assert change_note(0.25, 0.25, 8) == "no change on 8 problems"
    assert change_note(0.5, 0.125, 8).startswith("-0.375, within the noise of 8 problems")


def test_eval_summary_uses_the_baseline_and_the_last_evaluation():
    evals = [{"version": 0, "by": "sampler0", "accuracy": 0.125, "n": 8},
             {"version": 3, "by": "learner", "accuracy": 0.25, "n": 8}]
    assert eval_summary(evals) == ("greedy accuracy on the held-out subset (first 8 test problems): before 0.125 "
                                   "(version 0), after 0.250 (version 3, learner): +0.125, within the noise of 8 "
                                   "problems (two standard errors: 0.390)")
    assert eval_summary(evals[:1]) is None


def test_eval_summary_of_a_resumed_run_with_version_0_scored_twice():
    """Each launch's sampler 0 scores the weights it starts with as version 0: a resumed run's
    eval.jsonl holds two records of (0, sampler0), which the sort must order without comparing them."""
    evals = [{"version": 0, "by": "sampler0", "time": 1.0, "accuracy": 0.125, "n": 8},
             {"version": 0, "by": "sampler0", "time": 9.0, "accuracy": 0.125, "n": 8},
             {"version": 5, "by": "learner", "time": 10.0, "accuracy": 0.25, "n": 8}]
    assert eval_summary(evals).startswith("greedy accuracy on the held-out subset (first 8 test problems): before "
                                          "0.125 (version 0), after 0.250 (version 5, learner)")
