"""bench/e2e.py's steady-state rates, against hand-worked numbers (no processes, no model)."""
import json

import pytest
from benchload import load_bench


@pytest.fixture(scope="module")
def e2e():
    return load_bench("e2e")


STEPS = [{"time_s": t, "completions": 64, "tokens": k} for t, k in ((10, 1000), (12, 2000), (15, 3000), (20, 4000))]


def test_rate_skips_the_first_step(e2e):
    r = e2e.steady_rate(STEPS, 1)
    # steps 2..4: 3 x 64 = 192 completions, 2000+3000+4000 = 9000 tokens, in 20 - 10 = 10 s
    assert (r["measured_steps"], r["window_s"], r["completions"]) == (3, 10, 192)
    assert r["completions_per_s"] == pytest.approx(19.2)
    assert r["tokens_per_s"] == pytest.approx(900.0)


def test_rate_skips_more_steps(e2e):
    r = e2e.steady_rate(STEPS, 2)
    # steps 3..4: 128 completions, 7000 tokens, in 20 - 12 = 8 s
    assert r["completions_per_s"] == pytest.approx(16.0)
    assert r["tokens_per_s"] == pytest.approx(875.0)
    assert e2e.steady_rate(STEPS, 0)["skipped_steps"] == 1  # the first step is never measured


def test_rate_needs_a_step_after_the_skipped_ones(e2e):
    r = e2e.steady_rate(STEPS[:2], 2)
    assert r["completions_per_s"] is None and r["measured_steps"] == 0
    # an unknown token count in a skipped step does not matter; in a measured one it does
    assert e2e.steady_rate([dict(STEPS[0], tokens=None), *STEPS[1:]], 1)["tokens_per_s"] == pytest.approx(900.0)
    assert e2e.steady_rate([*STEPS[:3], dict(STEPS[3], tokens=None)], 1)["tokens_per_s"] is None


def test_ours_skip_is_the_first_rounds_steps(e2e):
    assert e2e.ours_skip(16, 8, 64) == 2   # 128 completions feed two steps of 64
    assert e2e.ours_skip(12, 8, 64) == 2   # 96: the second step starts in round 1
    assert e2e.ours_skip(4, 8, 64) == 1    # several rounds per step


def test_ours_steps_from_metrics(e2e, tmp_path):
    recs = [{"step": 1, "time_s": 5.0, "sequences": 64, "completion_len_mean": 100.0},
            {"step": 2, "time_s": 7.5, "sequences": 64, "completion_len_mean": 150.5},
            {"final": True, "groups": {}}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert e2e.ours_steps(tmp_path) == [{"step": 1, "time_s": 5.0, "completions": 64, "tokens": 6400.0},
                                        {"step": 2, "time_s": 7.5, "completions": 64, "tokens": 9632.0}]
