"""bench/chance_probe.py's counting on a hand-worked case, and the probe end to end on the tiny
model (CPU): every completion is generated, its answer extracted and counted once."""
from pathlib import Path

import torch
from benchload import load_bench

from grpo.data.sources import load_problems
from grpo.model import load_causal_lm, load_tokenizer, resolve_model
from grpo.generate.engine import RolloutEngine

GSM8K = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k"


def test_solution_steps_are_the_lines_before_the_answer():
    cp = load_bench("chance_probe")
    solutions = ["A<<1+1=2>>2\n#### 2", "A\nB\n#### 3", "A\nB\n\nC\n#### 4"]
    assert [cp.solution_steps(a) for a in solutions] == [1, 2, 3]   # the blank line is no step


def test_answer_stats_hand_worked():
    cp = load_bench("chance_probe")
    # Q0's numbers are 3, 4, 12 and its gold 12 is among them; Q1's are 5, 2 and its gold 7 is not.
    questions = ["Ann has 3 bags of 4 apples, 12 in all?", "Bo has 5 pens and buys 2 more. How many?"]
    golds = ["12", "7"]
    # Two completions per question. Q0: "12" (right, copied), "3" (wrong, copied).
    # Q1: "7" (right, not copied), None (no number).
    answers = ["12", "3", "7", None]
    stats = cp.answer_stats(questions, golds, answers, 2, [2, 4])
    assert stats == {
        "completions": 4, "accuracy": 0.5, "answer_copied_from_question": 0.5,
        "correct_copied_from_question": 0.5, "correct": 2,
        "gold_in_question": 0.5,
        "accuracy_gold_in_question": 0.5, "accuracy_gold_not_in_question": 0.5,
        "accuracy_by_solution_steps": {"2": 0.5, "3": None, "4+": 0.5},
        # Last question number: Q0's is 12 (right), Q1's is 2 (wrong) -> 1/2.
        # Uniform pick: Q0 1/3, Q1 0 -> (1/3) / 2.
        "chance_last_question_number": 0.5, "chance_uniform_question_number": round(1 / 6, 5),
    }


def test_probe_runs_on_the_tiny_model():
    cp = load_bench("chance_probe")
    path = resolve_model("tiny-random")
    tok, model = load_tokenizer(path), load_causal_lm(path, torch.device("cpu"), torch.float32).eval()
    problems = load_problems(str(GSM8K), "train", limit=3)
    engine = RolloutEngine(model, tok.eos_token_id, tok.pad_token_id)
    row = cp.probe(engine, tok, problems, 2, 1.0, 5, 4)
    assert row["completions"] == 6 and row["per_problem"] == 2
    assert row["correct"] == 0 and row["correct_examples"] == []   # a random model is never right
    greedy = cp.probe(engine, tok, problems, 1, 0.0, 5, 4)
    assert greedy["completions"] == 3 and greedy["temperature"] == 0.0
    # The chance baselines depend on the problems only, not on what the model wrote.
    assert greedy["chance_last_question_number"] == row["chance_last_question_number"]


def test_prior_baselines_hand_worked():
    cp = load_bench("chance_probe")
    # Train answers: "4" x3, "6" x1. Test golds "4", "6", "9": always "4" is right once in 3;
    # drawing from the train distribution scores (3/4 + 1/4 + 0) / 3.
    assert cp.prior_baselines(["4", "6", "4", "4"], ["4", "6", "9"]) == {
        "most_common_train_answer": "4", "constant_answer_accuracy": round(1 / 3, 5),
        "train_answer_distribution_accuracy": round(1 / 3, 5)}


def test_gsm8k_chance_baselines_beside_the_models_2_4_percent():
    """On the evaluation subset (first 500 test problems), answering "4" (the train split's most
    common answer) scores 3.0%, more than SmolLM2-135M's greedy 2.4%; copying the question's last
    number 1.8%. These are the README's reference points for 'learning'."""
    import pytest

    from grpo.data.gsm8k import extract_gsm8k_answer
    from grpo.data.sources import load_problems

    if not (GSM8K / "train.jsonl").is_file():
        pytest.skip(f"{GSM8K} is missing")
    cp = load_bench("chance_probe")
    golds = lambda ps: [extract_gsm8k_answer(p.answer) for p in ps]   # noqa: E731
    test = load_problems(str(GSM8K), "test", limit=500)
    prior = cp.prior_baselines(golds(load_problems(str(GSM8K), "train")), golds(test))
    assert (prior["most_common_train_answer"], prior["constant_answer_accuracy"]) == ("4", 0.03)
    copy = cp.answer_stats([p.question for p in test], golds(test), golds(test), 1, [2] * 500)
    assert (copy["gold_in_question"], copy["chance_last_question_number"]) == (0.06, 0.018)
