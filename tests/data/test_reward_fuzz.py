"""Nothing a model writes ends a run: every built-in reward and every evaluation path scores the
adversarial corpus (tests/data/reward_fuzz.py) without raising and within a bound; a reward that
fails on a completion costs that completion alone, counted by reward and exception; a reward that
fails on most of a window stops the run in one line."""
import json
import logging
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
from freshenv import child_env
from reward_fuzz import REAL, corpus

import grpo.data.rewards as R
from grpo.data.faults import FAIL_WINDOW, RewardFaults, reported_failures
from grpo.data.formats import Problem
from grpo.data.gsm8k import gsm8k_correct

ROOT = Path(__file__).resolve().parents[2]
GSM8K = ROOT.parent / "shared" / "data" / "gsm8k"
TEXTS = corpus(0)
# Generous: the slowest corpus entry takes well under a second; a hang would take minutes.
BOUND_S = 60.0

REFERENCES = ["6*12=72\n#### 72", "#### 1/3", "#### 0.5", "#### -0", "#### 1,000", "#### " + "3" * 400]


def test_the_corpus_is_seeded_and_holds_the_real_completions():
    assert corpus(0) == TEXTS and corpus(1) != TEXTS
    assert 300 <= len(TEXTS) <= 400 and TEXTS[-len(REAL):] == REAL
    assert max(len(t) for t in TEXTS) >= 100_000


def test_the_real_completion_no_longer_overflows():
    """The completion that ended a run's final evaluation (OverflowError in the rational comparison):
    an answer of 400 digits is equal only to the same text, and unequal to 72, without a float."""
    assert gsm8k_correct(REAL[0], "#### 72") is False
    assert gsm8k_correct(REAL[0], "#### " + "3" * 400) is True
    assert gsm8k_correct(REAL[0], "#### " + "3" * 399 + "4") is False
    assert gsm8k_correct(REAL[1], "#### 1/3") is False     # 600 digits after the point: text only
    assert gsm8k_correct("#### 0.333333", "#### 1/3") is True   # short ones still go to math_verify


@pytest.mark.parametrize("reference", REFERENCES)
def test_every_builtin_scores_the_corpus_without_failing(reference):
    rs = R.RewardSet("correctness,format,overlong", max_new_tokens=256, overlong_buffer=64)
    problems = [Problem("q", reference)] * len(TEXTS)
    ids = [[7] * min(len(t), 300) for t in TEXTS]
    t0 = time.perf_counter()
    got = rs.score(problems, TEXTS, ids)
    assert time.perf_counter() - t0 < BOUND_S
    assert not rs.faults.counts, rs.faults.summary()   # no built-in failed on any of them
    for r in got:
        assert r.info["correctness"] in (0.0, 1.0) and r.info["format"] in (0.0, 1.0)
        assert -1.0 <= r.info["overlong"] <= 0.0 and math.isfinite(r.reward)
    think = R.RewardSet("format", format_style="think")
    think.score(problems, TEXTS, ids)
    assert not think.faults.counts


def test_the_code_reward_scores_hostile_blocks():
    from grpo.data.sandbox import SandboxLimits

    row = Problem("Write add(a, b).", "", style="plain", columns={"tests": ["assert add(1, 2) == 3"]})
    texts = [f"```python\n{t[:2000]}\n```" for t in TEXTS[::15]] + TEXTS[::40]
    rs = R.RewardSet("code", code_limits=SandboxLimits(timeout_s=2.0))
    got = rs.score([row] * len(texts), texts, [[1]] * len(texts))
    assert not rs.faults.counts and all(r.info["code"] == 0.0 for r in got)


def test_a_reasoning_gym_scorer_that_never_returns_costs_one_completion(monkeypatch):
    """countdown's scorer evaluates the answer with sympy: '9**9**9**9' would compute for ever. It
    runs in a forked child with a limit per completion; the rest of the batch is scored."""
    from grpo.data.sources import load_problems

    monkeypatch.setattr(R, "RG_SCORE_LIMIT_S", 1.0)
    (p,) = load_problems("rg:countdown", limit=1, seed=0)
    texts = [f"#### {p.answer}", "#### 9**9**9**9", "#### (", f"#### {'(' * 400}", "#### 1+1",
             "#### " + "x" * (R.RG_MAX_ANSWER_CHARS + 1), f"#### {p.answer}"]
    rs = R.RewardSet()
    t0 = time.perf_counter()
    got = rs.score([p] * len(texts), texts, [[1]] * len(texts))
    assert time.perf_counter() - t0 < 20
    assert [r.info["correctness"] for r in got] == [1.0, 0.0, 0.01, 0.01, 0.05, 0.0, 1.0]
    assert dict(rs.faults.counts) == {("correctness", "TimeoutError"): 1}
    assert rs.faults.stats() == {"reward_failures": 1.0, "reward_failures/correctness/TimeoutError": 1.0}


def test_reasoning_gym_scorers_take_the_corpus():
    from grpo.data.sources import load_problems

    for task in ("word_sorting", "countdown"):
        (p,) = load_problems(f"rg:{task}", limit=1, seed=0)
        texts = [f"#### {t}" for t in TEXTS[::6]]
        rs = R.RewardSet()
        got = rs.score([p] * len(texts), texts, [[1]] * len(texts))
        assert len(got) == len(texts) and all(0.0 <= r.info["correctness"] <= 1.0 for r in got)
        assert set(rs.faults.counts) <= {("correctness", "TimeoutError")}, rs.faults.summary()


FLAKY = '''
calls = []

def flaky(prompts, completions, **kwargs):
    calls.append(len(completions))
    if any("boom" in c for c in completions):
        raise ValueError("cannot score " + completions[0][:10])
    return [1.0] * len(completions)

def penalty(prompts, completions, **kwargs):
    if any("boom" in c for c in completions):
        raise KeyError("boom")
    return [-0.5] * len(completions)
penalty.failure_value = -1.0

def skip(prompts, completions, **kwargs):
    raise RuntimeError("never")
skip.failure_value = None

def nan_one(prompts, completions, **kwargs):
    calls.append(len(completions))
    return [float("nan") if c == "boom" else 1.0 for c in completions]
'''


@pytest.fixture
def flaky(tmp_path, monkeypatch):
    (tmp_path / "flaky_rewards.py").write_text(FLAKY)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("flaky_rewards", None)
    import flaky_rewards

    yield flaky_rewards
    sys.modules.pop("flaky_rewards", None)


def test_a_failing_completion_costs_itself_alone(flaky, caplog):
    """Hand-worked: a batch of 4 with one completion the reward raises on is scored again one at a
    time (1 + 4 calls); that one gets the failure value, the others their scores; the kind is counted
    and its first example logged once."""
    rs = R.RewardSet("correctness,flaky_rewards:flaky,flaky_rewards:penalty,flaky_rewards:skip")
    q = Problem("q", "#### 72")
    texts = ["#### 72", "boom #### 72", "#### 71", "#### 72"]
    with caplog.at_level(logging.WARNING, logger="grpo.data.faults"):
        got = rs.score([q] * 4, texts, [[1]] * 4)
        rs.score([q] * 2, ["boom", "fine"], [[1]] * 2)
    assert flaky.calls == [4, 1, 1, 1, 1, 2, 1, 1]
    assert [r.info["flaky"] for r in got] == [1.0, 0.0, 1.0, 1.0]
    assert [r.info["penalty"] for r in got] == [-0.5, -1.0, -0.5, -0.5]   # its own failure value
    assert all("skip" not in r.info for r in got)                           # None: left out
    assert [r.info["correctness"] for r in got] == [1.0, 1.0, 0.0, 1.0]
    assert [r.reward for r in got] == [1.5, 0.0, 0.5, 1.5]
    assert dict(rs.faults.counts) == {("flaky", "ValueError"): 2, ("penalty", "KeyError"): 2,
                                      ("skip", "RuntimeError"): 6}
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 3 and "cannot score boom #### " in next(w for w in warned if "'flaky'" in w)
    assert rs.faults.stats()["reward_failures"] == 10.0


def test_a_value_that_is_not_a_number_costs_its_completion_without_a_second_call(flaky):
    rs = R.RewardSet("flaky_rewards:nan_one")
    got = rs.score([Problem("q", "1")] * 3, ["a", "boom", "c"], [[1]] * 3)
    assert flaky.calls == [3] and [r.info["nan_one"] for r in got] == [1.0, 0.0, 1.0]
    assert dict(rs.faults.counts) == {("nan_one", "ValueError"): 1}


def test_the_probe_still_refuses_a_reward_that_fails_on_its_made_up_completions(flaky):
    with pytest.raises(R.RewardError, match="reward 'skip' raised RuntimeError: never"):
        R.RewardSet("flaky_rewards:skip").probe(Problem("q", "1"))
    R.RewardSet("flaky_rewards:flaky").probe(Problem("q", "1"))   # fine on ordinary ones
    assert flaky.calls == [2]


def test_a_reward_that_fails_on_half_of_its_window_is_broken(flaky):
    """FAIL_WINDOW completions, half failing: broken at the completion that makes it half, not one before."""
    half = FAIL_WINDOW // 2
    rs = R.RewardSet("flaky_rewards:flaky")
    q = Problem("q", "1")
    rs.score([q] * (FAIL_WINDOW - half), ["ok"] * (FAIL_WINDOW - half), [[1]] * (FAIL_WINDOW - half))
    rs.score([q] * (half - 1), ["boom"] * (half - 1), [[1]] * (half - 1))   # 255 seen, 127 failed
    rs.score([q], ["ok"], [[1]])   # 256 seen, 127 failed: not yet
    with pytest.raises(R.RewardBroken) as err:
        rs.score([q], ["boom"], [[1]])   # the oldest 'ok' leaves the window: 128 of 256
    assert str(err.value).startswith("reward 'flaky' failed on 128 of its last 256 completions (mostly ValueError: "
                                     "cannot score boom)")
    assert "\n" not in str(err.value)


def test_the_books_of_failures_name_at_most_sixteen_kinds_in_a_status():
    """The first 16 pairs seen by name, the rest summed: a name once given stays, with its count."""
    faults = RewardFaults()
    errors = [type(f"E{i:02d}", (Exception,), {})("x") for i in range(20)]
    for i, e in enumerate(errors):
        faults.record("r", [e] * (i + 1), ["t"] * (i + 1))
    stats = faults.stats()
    assert len(stats) == 1 + 16 + 1 and stats["reward_failures"] == sum(range(1, 21))
    assert stats["reward_failures/r/E00"] == 1.0 and stats["reward_failures/r/E15"] == 16.0
    assert "reward_failures/r/E16" not in stats and stats["reward_failures/other/other"] == 17 + 18 + 19 + 20
    faults.record("r", [errors[0]] * 5, ["t"] * 5)
    assert faults.stats()["reward_failures/r/E00"] == 6.0
    # the learner's sum over samplers: by '<reward>/<type>', the totals left out
    assert reported_failures([faults.stats(), {"reward_failures": 3.0, "reward_failures/q/KeyError": 3.0, "rounds": 2.0}]) \
        == {"other/other": 74, "q/KeyError": 3, **{f"r/E{i:02d}": i + 1 + 5 * (i == 0) for i in range(16)}}


def test_every_evaluation_path_scores_the_corpus():
    """greedy_accuracy (sampler 0's baseline, the learner's final evaluation, python -m grpo.evaluate
    and the benchmark's scorer all call it) over the corpus as decoded completions."""
    import torch
    from scripted import ScriptedEngine

    from grpo.data.prompts import problem_prompt
    from grpo.evaluate import constant_answer_baseline, eval_problems, greedy_accuracy
    from grpo.model.load import load_tokenizer
    from grpo.model.zoo import resolve_model

    if not (GSM8K / "test.jsonl").is_file():
        pytest.skip(f"{GSM8K} is missing")
    tok = load_tokenizer(resolve_model("smollm2"))
    problems = eval_problems(str(GSM8K), len(TEXTS))
    keys = [tuple(tok(problem_prompt(tok, p), add_special_tokens=False)["input_ids"]) for p in problems]
    assert len(set(keys)) == len(keys)
    t0 = time.perf_counter()
    res = greedy_accuracy(torch.nn.Module(), tok, problems, 64, batch_size=8, device=torch.device("cpu"),
                          engine=ScriptedEngine(tok, dict(zip(keys, TEXTS))))
    assert time.perf_counter() - t0 < BOUND_S
    assert res["n"] == len(TEXTS) and res["reward_failures"] == 0 and res["reward_failed"] == ""
    assert 0.0 <= res["accuracy"] < 0.05   # the corpus answers none of these on purpose
    assert constant_answer_baseline(problems)["accuracy"] > 0


FUZZED = '''
import json, zlib
from pathlib import Path
from grpo.data.rewards import correctness_reward, format_reward

TEXTS = json.loads((Path(__file__).parent / "corpus.json").read_text())

def fuzzed(prompts, completions, completion_ids, answer, **kwargs):
    """Built-in rewards on a corpus entry chosen by the completion's ids; raises on one in five."""
    picked = [TEXTS[zlib.crc32(bytes(str(ids), "ascii")) % len(TEXTS)] for ids in completion_ids]
    if any(zlib.crc32(bytes(str(ids), "ascii")) % 5 == 0 for ids in completion_ids):
        raise ValueError("one in five")
    c = correctness_reward(prompts, picked, answer)
    f = format_reward(prompts, picked)
    return [x + y for x, y in zip(c, f)]

def mostly_broken(prompts, completions, completion_ids, **kwargs):
    """Fails on three in four sampled completions (the start-up probe's made-up ones are shorter)."""
    out = []
    for ids in completion_ids:
        h = zlib.crc32(bytes(str(ids), "ascii"))
        if h % 4 and len(ids) > 1:
            raise ZeroDivisionError("three in four")
        out.append(float(h % 8 == 0))
    return out
'''


def _launch(tmp_path, reward: str, steps: int) -> subprocess.CompletedProcess:
    from netutil import free_ports

    (tmp_path / "fuzzed.py").write_text(FUZZED)
    (tmp_path / "corpus.json").write_text(json.dumps(TEXTS))
    d, s = free_ports(2)
    env = {"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT),
           **child_env()}
    return subprocess.run(
        [sys.executable, str(ROOT / "run_distributed.py"), "--device", "cpu", "--no-deepspeed",
         "--max-steps", str(steps), "--model", "tiny-random", "--dataset", str(GSM8K), "--num-generations", "4",
         "--prompts-per-round", "4", "--train-batch-size", "8", "--max-new-tokens", "8",
         "--reward", reward, "--data-port", str(d), "--sync-port", str(s), "--run-dir", str(tmp_path / "run")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def test_a_run_whose_reward_fails_on_some_completions_goes_on_and_balances(tmp_path):
    if not (GSM8K / "train.jsonl").is_file():
        pytest.skip(f"{GSM8K} is missing")
    r = _launch(tmp_path, "correctness,./fuzzed.py:fuzzed", 4)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["balance"]["text"] == "balanced", summary["balance"]
    failures = summary["reward_failures"]
    assert list(failures) == ["fuzzed/ValueError"] and failures["fuzzed/ValueError"] > 0
    sampled = summary["samplers"]["0"]["stats"]
    assert sampled["reward_failures"] == failures["fuzzed/ValueError"] < sampled["samples"] / 2
    assert f"reward failures: {failures['fuzzed/ValueError']} completions" in r.stdout


def test_a_reward_broken_on_most_completions_stops_the_run_in_one_line(tmp_path):
    if not (GSM8K / "train.jsonl").is_file():
        pytest.skip(f"{GSM8K} is missing")
    r = _launch(tmp_path, "correctness,./fuzzed.py:mostly_broken", 200)
    assert r.returncode == 1   # a worker that ended the run (the sampler's own exit code is 2)
    assert "sampler0 failed with exit code 2" in r.stderr
    line = next(x for x in r.stderr.splitlines() if "sampling_worker.py: error:" in x)
    assert "reward 'mostly_broken' failed on" in line and "of its last 256 completions (mostly ZeroDivisionError: " \
        "three in four): the reward is broken" in line
