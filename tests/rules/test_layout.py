"""grpo.rules.layout: the split chosen at start (--gpus) and a finished run's rates and the split
they point to, worked out by hand."""
import pytest

from grpo.rules.layout import (DEFAULT_GEN_TOKENS_PER_S, DEFAULT_TRAIN_S_PER_PARAM_TOKEN, REFERENCE_PARAMS, Choice,
                                Rates, advice, best_split, choose_layout, choose_split, layout_line, max_samplers,
                                measured, nodes_layout_line, predicted_step, rates_from_run, role_seconds, step_tokens)

# The 0.5B real-workload run on 4 H200s (1 sampler, 3 learner ranks): median step 3.39 s, the ranks
# trained 0.60 s of it, the sampler was busy 3.44 s a step.
RATES = {"step_s": 3.39, "learner_busy": 0.177, "train_s": 0.5988, "sampler_s": 3.4446}


def test_predicted_step_is_the_slower_role():
    assert predicted_step(3.0, 1.8, 1, 3) == 3.0          # samplers: 3.0 / 1; ranks: 1.8 / 3 = 0.6
    assert predicted_step(3.0, 1.8, 3, 1) == 1.8          # 1.0 against 1.8


def test_best_split_by_hand():
    # one GPU's sampler-seconds 3.4446, one rank's training-seconds 3 x 0.5988 = 1.7964:
    # (1,3) 3.44; (2,2) max(1.72, 0.90) = 1.72; (3,1) max(1.15, 1.80) = 1.80
    assert best_split(4, 3.4446, 1.7964) == (2, 2)
    assert best_split(4, 1.0, 3.0) == (1, 3)             # (1,3) max(1, 1) = 1; (2,2) 1.5; (3,1) 3
    assert best_split(3, 2.0, 2.0) == (1, 2)             # (1,2) and (2,1) both 2.0: more learner ranks
    assert best_split(8, 7.0, 1.0) == (7, 1)             # (7,1) max(1, 1) = 1; (6,2) max(1.17, 0.5)
    assert best_split(2, 5.0, 0.1) == (1, 1)             # the only split


def test_advice_names_the_split_and_its_predicted_step():
    line = advice(RATES, [0], [1, 2, 3])
    assert "the learner ranks trained 18% and the samplers were busy 100% of each 3.39 s step" in line
    assert "--sampling-gpus 0,1 --training-gpus 2,3 would take about 1.72 s a step" in line
    assert advice(RATES, [4], [5, 6, 7]).count("--sampling-gpus 4,5 --training-gpus 6,7") == 1


def test_advice_says_nothing_without_a_reason():
    assert advice(RATES, [0], [0]) is None                               # roles share a GPU
    assert advice(RATES, [], [1]) is None
    busy = {"step_s": 1.0, "learner_busy": 0.9, "train_s": 0.9, "sampler_s": 0.95}
    assert advice(busy, [0], [1]) is None                                # nobody idle
    # the learner idle (40%) but the best split (1,1) is the one run: nothing to say
    assert advice({"step_s": 1.0, "learner_busy": 0.4, "train_s": 0.4, "sampler_s": 1.0}, [0], [1]) is None
    # 3 samplers, 1 rank, learner idle 55%: (3,1) max(0.73, 0.50) is already the best of 4 GPUs
    done = {"step_s": 1.1, "learner_busy": 0.45, "train_s": 0.495, "sampler_s": 2.2}
    assert advice(done, [0, 1, 2], [3]) is None
    # 2 + 2, learner idle 55%: (3,1) max(0.67, 0.90) = 0.90 against today's max(1.0, 0.45) = 1.0,
    # 1.11x: under the 1.25x worth a word
    near = {"step_s": 1.0, "learner_busy": 0.45, "train_s": 0.45, "sampler_s": 2.0}
    assert advice(near, [0, 1], [2, 3]) is None
    assert "--sampling-gpus 0,1,2 --training-gpus 3" in advice({**near, "sampler_s": 3.0}, [0, 1], [2, 3])


def test_measured_leaves_out_the_first_step():
    metrics = [{"step": 1, "step_time_s": 20.0, "train_s": 1.0}, {"step": 2, "step_time_s": 4.0, "train_s": 1.0},
               {"step": 3, "step_time_s": 2.0, "train_s": 1.0}, {"step": 4, "step_time_s": 3.0, "train_s": 0.6},
               {"final": True, "steps": 4}]
    summary = {"steps": 4, "samplers": {"0": {"stats": {"gen_s": 8.0, "logprob_s": 2.0, "reward_s": 1.0}},
                                        "1": {"stats": {"gen_s": 1.0}}}}
    # steps 2-4: median step 3.0; busy shares 0.25, 0.5, 0.2 -> 0.25; train 1.0; samplers (11 + 1) / 4 steps
    assert measured(metrics, summary) == {"step_s": 3.0, "learner_busy": 0.25, "train_s": 1.0, "sampler_s": 3.0}
    assert measured(metrics[:1], summary) is None and measured(metrics, {"steps": 0}) is None


# --- the split chosen at start ----------------------------------------------------------------------
# The real workload's settings: 128 completions a step of at most 512 tokens, G 16 (T = 65,536; at most
# 128 / 16 = 8 samplers). Qwen2.5-Coder-0.5B: 494,032,768 parameters, 1.5B: 1,543,714,304, by the
# memory plan's count. By the defaults, on one GPU a step generates in 65,536 / 19,300 = 3.3956 s and
# trains in 5.7e-14 x 494,032,768 x 65,536 = 1.8455 s (0.5B), 5.7667 s (1.5B).
Q05, Q15 = 494_032_768, 1_543_714_304


def test_the_defaults_give_back_the_row_they_were_derived_from():
    # docs/benchmarks.md's 0.5B row: 1 sampler + 3 ranks, a 3.39 s step bound by the sampler, the
    # ranks training 18.1% of it (0.614 s)
    assert (DEFAULT_GEN_TOKENS_PER_S, DEFAULT_TRAIN_S_PER_PARAM_TOKEN, REFERENCE_PARAMS) == (19_300.0, 5.7e-14, Q05)
    gen, train = role_seconds(1, 3, Q05, step_tokens(128, 512))
    assert gen == pytest.approx(3.3956, abs=1e-4) and gen == pytest.approx(3.39, rel=0.01)
    assert train == pytest.approx(0.6152, abs=1e-4) and train == pytest.approx(0.181 * 3.39, rel=0.01)


def test_choose_split_by_hand_with_the_defaults():
    # 0.5B on 4 GPUs: (1,3) max(3.396, 0.615) = 3.396; (2,2) max(1.698, 0.923) = 1.698; (3,1) max(1.132, 1.846)
    sp = choose_split(4, Q05, 512, 128, 16)
    assert (sp.samplers, sp.ranks, sp.share) == (2, 2, False)
    assert sp.why == ("494M parameters, 128 x 512 tokens a step, by the default rates: 2+2 takes about 1.70 s a "
                      "step (generation 1.70 s on 2 GPUs, training 0.92 s on 2 ranks); 1+3 3.40 s, 3+1 1.85 s")
    # 1.5B: (1,3) max(3.396, 1.922) = 3.396; (2,2) max(1.698, 2.883) = 2.883; (3,1) 5.767
    assert (choose_split(4, Q15, 512, 128, 16).samplers, choose_split(4, Q15, 512, 128, 16).ranks) == (2, 2)
    # twice 1.5B: the training term doubles: (1,3) max(3.396, 3.845) = 3.845; (2,2) 5.767: the seed's layout
    assert (choose_split(4, 2 * Q15, 512, 128, 16).samplers, choose_split(4, 2 * Q15, 512, 128, 16).ranks) == (1, 3)
    # 0.5B on 8: (5,3) max(0.679, 0.615) = 0.679; (4,4) max(0.849, 0.461) = 0.849; (6,2) max(0.566, 0.923)
    assert choose_split(8, Q05, 512, 128, 16).samplers == 5


def test_one_gpu_is_shared_and_two_are_one_each():
    one = choose_split(1, Q05, 512, 128, 16)
    assert (one.samplers, one.ranks, one.share, one.why) == (1, 1, True, "one GPU: the sampler and the learner share it")
    # 2 GPUs: the only split, whatever the costs (a tiny model: training 5.7e-14 x 1000 x 65,536 ~ 4 us)
    for params in (1000, 100 * Q15):
        two = choose_split(2, params, 512, 128, 16)
        assert (two.samplers, two.ranks, two.share) == (1, 1, False)


def test_at_most_one_sampler_a_group_of_the_step():
    assert max_samplers(128, 16) == 8 and max_samplers(16, 8) == 2 and max_samplers(4, 8) == 1
    # a 1000-parameter model trains in no time: as many samplers as groups a step, no more
    sp = choose_split(6, 1000, 256, 16, 8)
    assert (sp.samplers, sp.ranks) == (2, 4)
    assert sp.why.endswith("; 1+5 0.21 s; at most 2 samplers (16 / 8 groups a step)")   # 4096 / 19,300


def test_ties_go_to_fewer_samplers():
    # T = 4 x 1 = 4; 2 tokens/s a GPU: generation 2 / s; 2.0 s of training on 1 rank: 2 / r.
    # (1,2) max(2, 1) = 2 and (2,1) max(1, 2) = 2: the same step, fewer samplers
    rates = Rates(2.0, {1: 2.0}, 4)
    sp = choose_split(3, Q05, 1, 4, 2, rates)
    assert (sp.samplers, sp.ranks) == (1, 2)


def test_measured_rates_replace_the_defaults():
    # gen: 65,536 tokens at 6,553.6 a GPU: 10 s on one; learner: 0.6 s a step on 3 ranks (1.8 on one), at
    # T 65,536. (1,3) max(10, 0.6); (2,2) max(5, 0.9); (3,1) max(3.33, 1.8): 3 samplers
    rates = Rates(6553.6, {3: 0.6}, 65536, "runs/a")
    sp = choose_split(4, Q05, 512, 128, 16, rates)
    assert (sp.samplers, sp.ranks) == (3, 1)
    assert "by rates measured in runs/a: 3+1 takes about 3.33 s a step (generation 3.33 s on 3 GPUs, training " \
           "1.80 s on 1 rank); 2+2 5.00 s" in sp.why
    # only the learner measured: generation by the default rate
    assert role_seconds(2, 2, Q05, 65536, Rates(None, {3: 0.6}, 65536)) == pytest.approx((65536 / 19300 / 2, 0.9))
    # only generation measured: training by the default cost
    assert role_seconds(1, 1, 10**9, 65536, Rates(6553.6)) == pytest.approx((10.0, 5.7e-14 * 1e9 * 65536))


def test_measured_learner_seconds_scale_from_the_nearest_rank_count():
    # 0.6 s on 3 ranks at T 65,536, asked for 2 ranks at T 32,768: 0.6 x 3 / 2 x 0.5 = 0.45
    assert role_seconds(1, 2, Q05, 32768, Rates(None, {3: 0.6}, 65536))[1] == pytest.approx(0.45)
    two = Rates(None, {1: 2.0, 4: 0.4}, 100)
    assert role_seconds(1, 2, Q05, 100, two)[1] == pytest.approx(1.0)          # from 1 rank: 2.0 x 1 / 2
    assert role_seconds(1, 3, Q05, 100, two)[1] == pytest.approx(0.4 * 4 / 3)  # from 4 ranks
    # 1 and 3 equally near 2: the larger count, whose step shares its work as 2 ranks' does
    assert role_seconds(1, 2, Q05, 100, Rates(None, {1: 2.0, 3: 0.5}, 100))[1] == pytest.approx(0.75)


def test_unknown_size_is_costed_as_the_reference_and_said():
    sp = choose_split(4, None, 512, 128, 16)
    assert (sp.samplers, sp.ranks) == (2, 2)
    assert sp.why.startswith("model size not known here (costed as 494M), 128 x 512 tokens a step")


def test_feasible_limits_the_splits():
    # 0.5B on 8 GPUs prefers 5+3; with learner ranks only in whole nodes of 4, 4+4 (0.849 s)
    sp = choose_split(8, Q05, 512, 128, 16, feasible=lambda s, r: r % 4 == 0)
    assert (sp.samplers, sp.ranks) == (4, 4) and sp.why.endswith("(generation 0.85 s on 4 GPUs, training 0.46 s "
                                                                 "on 4 ranks)")
    with pytest.raises(ValueError, match="no split of 3 GPUs"):
        choose_split(3, Q05, 512, 128, 16, feasible=lambda s, r: False)


def test_choose_layout_places_samplers_on_the_first_ids():
    c = choose_layout([4, 5, 6, 7], Q05, 512, 128, 16)
    assert (c.sampling_gpus, c.training_gpus, c.share) == ((4, 5), (6, 7), False)
    assert c.flags() == ["--sampling-gpus", "4,5", "--training-gpus", "6,7"]
    one = choose_layout([3], Q05, 512, 128, 16)
    assert (one.sampling_gpus, one.training_gpus, one.flags()) == ((3,), (3,), ["--sampling-gpus", "3", "--training-gpus",
                                                                                 "3", "--share-gpus"])


def test_the_start_line():
    c = choose_layout([0, 1, 2, 3], 2 * Q15, 512, 128, 16)
    assert layout_line("0,1,2,3", c) == (
        "layout: --gpus 0,1,2,3 -> sampling GPU 0 + training GPUs 1,2,3 (as --sampling-gpus 0 --training-gpus 1,2,3; "
        "why: 3.1B parameters, 128 x 512 tokens a step, by the default rates: 1+3 takes about 3.84 s a step "
        "(generation 3.40 s on 1 GPU, training 3.84 s on 3 ranks); 2+2 5.77 s)")
    assert layout_line("all", Choice((0,), (0,), True, "one GPU: x")) == (
        "layout: --gpus all -> sampling and training share GPU 0 (as --sampling-gpus 0 --training-gpus 0 "
        "--share-gpus; why: one GPU: x)")
    sp = choose_split(2, Q05, 512, 128, 16)
    assert nodes_layout_line("a:1,b:1", sp).startswith(
        "layout: --nodes a:1,b:1 --gpus all -> 1 learner rank + 1 sampler (as --training-ranks 1 --num-samplers 1; "
        "why: 494M parameters")


def test_rates_from_an_earlier_run():
    metrics = [{"step": 1, "step_time_s": 20.0, "train_s": 1.0}, {"step": 2, "step_time_s": 4.0, "train_s": 1.0},
               {"step": 3, "step_time_s": 2.0, "train_s": 1.0}, {"step": 4, "step_time_s": 3.0, "train_s": 0.6}]
    summary = {"steps": 4, "samplers": {"0": {"stats": {"gen_s": 8.0, "logprob_s": 2.0, "reward_s": 1.0}},
                                        "1": {"stats": {"gen_s": 1.0}}}}
    launch = {"sampling_gpus": "0,1", "training_gpus": "2,3"}
    learner = {"train_batch_size": 16, "max_new_tokens": 256}
    # measured: the ranks' step 1.0 s, the samplers busy 12 / 4 = 3 s a step; T = 16 x 256 = 4096
    r = rates_from_run(metrics, summary, launch, learner, "runs/a")
    assert (r.gen_tokens_per_s, r.learner_s, r.step_tokens, r.source) == (pytest.approx(4096 / 3), {2: 1.0}, 4096,
                                                                          "runs/a")
    with pytest.raises(ValueError, match="runs/a's samplers and learner ranks did not have GPUs of their own"):
        rates_from_run(metrics, summary, {"sampling_gpus": "0", "training_gpus": "0"}, learner, "runs/a")
    with pytest.raises(ValueError, match="fewer than two trained steps"):
        rates_from_run(metrics[:1], summary, launch, learner, "runs/a")
