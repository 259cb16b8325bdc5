"""bench/signal_probe.py's counting, on a hand-worked round, and the probe end to end on the
tiny model (CPU): every completion is generated, scored and counted once."""
from pathlib import Path

import torch
from benchload import load_bench

from grpo.data.sources import load_problems
from grpo.model import load_causal_lm, load_tokenizer, resolve_model
from grpo.generate.engine import RolloutEngine

GSM8K = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k"


def test_signal_stats_hand_worked():
    sp = load_bench("signal_probe")
    # 3 groups of 4: [1,0,0,0] has signal, [0,0,0,0] none, [1,1,0,1] signal (3 correct).
    rewards = [1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 1]
    lengths = [10, 20, 30, 40] * 3
    finished = [True] * 9 + [False] * 3
    assert sp.signal_stats(rewards, 4, lengths, finished) == {
        "completions": 12, "accuracy": round(4 / 12, 5), "groups_with_signal": round(2 / 3, 4),
        "correct_per_signal_group": 2.0, "mean_completion_len": 25.0, "truncated_frac": 0.25}


def test_probe_runs_on_the_tiny_model():
    sp = load_bench("signal_probe")
    path = resolve_model("tiny-random")
    tok, model = load_tokenizer(path), load_causal_lm(path, torch.device("cpu"), torch.float32).eval()
    problems = load_problems(str(GSM8K), "train", limit=3)
    row = sp.probe(RolloutEngine(model, tok.eos_token_id, tok.pad_token_id), tok, problems, 2, 1.0, 5, 4)
    assert row["completions"] == 6 and row["temperature"] == 1.0
    assert 1 <= row["mean_completion_len"] <= 5 and 0 <= row["truncated_frac"] <= 1
    assert row["accuracy"] == 0.0 and row["groups_with_signal"] == 0.0   # a random model is never right
