"""grpo.launch.layout: a finished run's rates and the split they point to, worked out by hand."""
from grpo.launch.layout import advice, best_split, measured, predicted_step

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
