"""Reward selection and combination: built-ins, user functions in TRL's convention, weights,
per-part reward_info, and one-line errors for bad --reward choices."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from freshenv import child_env

from grpo.data.formats import Problem
from grpo.data.gsm8k import RewardResult
from grpo.data.rewards import RewardError, RewardSet, format_reward, overlong_reward, parse_reward_spec

ROOT = Path(__file__).resolve().parents[2]
GSM8K = ROOT.parent / "shared" / "data" / "gsm8k"
Q = Problem(question="What is 6 * 12?", answer="6*12=72\n#### 72")

USER_MODULE = '''
calls = []

def record(prompts, completions, **kwargs):
    calls.append({"prompts": prompts, "completions": completions, **kwargs})
    return [0.25] * len(completions)

def short(prompts, completions, completion_ids, **kwargs):
    return [1.0 if len(ids) <= 2 else None for ids in completion_ids]

def wrong_length(prompts, completions, **kwargs):
    return [1.0]

def not_numbers(prompts, completions, **kwargs):
    return ["good"] * len(completions)

def not_finite(prompts, completions, **kwargs):
    return [float("nan")] * len(completions)

def crashes(prompts, completions, **kwargs):
    raise KeyError("solution")

NOT_CALLABLE = 3
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("my_rewards", None)
    yield tmp_path / "my_rewards.py"
    sys.modules.pop("my_rewards", None)


def test_default_is_correctness_only():
    rs = RewardSet()
    assert rs.names == ["correctness"]
    got = rs.score([Q, Q, Q], ["so 72\n#### 72", "#### 71", "no idea"], [[1], [2], [3]])
    assert got == [RewardResult(1.0, {"correctness": 1.0, "correct": 1.0, "has_answer": 1.0}),
                   RewardResult(0.0, {"correctness": 0.0, "correct": 0.0, "has_answer": 1.0}),
                   RewardResult(0.0, {"correctness": 0.0, "correct": 0.0, "has_answer": 0.0})]


def test_parse_spec_and_weights():
    assert parse_reward_spec("correctness") == [("correctness", None)]
    assert parse_reward_spec("correctness, format=0.5,m:f=-2") == [
        ("correctness", None), ("format", 0.5), ("m:f", -2.0)]
    assert parse_reward_spec("correctness,format", "1,0.1") == [("correctness", 1.0), ("format", 0.1)]
    assert parse_reward_spec("./r.py:fn=0.3") == [("./r.py:fn", 0.3)]
    for spec, weights, needle in [("correctness,format", "1", "2 rewards"),
                                  ("correctness=1,format", "1,1", "both inline"),
                                  ("format=high", "", "not a number"),
                                  ("format=inf", "", "finite"),
                                  (" , ", "", "empty")]:
        with pytest.raises(RewardError, match=needle):
            parse_reward_spec(spec, weights)


def test_weighted_sum_and_parts():
    rs = RewardSet("correctness,format=0.5,overlong=2", max_new_tokens=20, overlong_buffer=8)
    texts = ["72 eggs\n#### 72", "#### 72\nI hope that is right", "I think 72"]
    ids = [[0] * 10, [0] * 16, [0] * 20]  # overlong: 0, (12-16)/8 = -0.5, -1.0
    got = rs.score([Q] * 3, texts, ids)
    assert [r.info["format"] for r in got] == [1.0, 0.0, 0.0]  # '####' must end the text
    assert [r.info["overlong"] for r in got] == [0.0, -0.5, -1.0]
    assert [r.info["correctness"] for r in got] == [1.0, 1.0, 1.0]
    assert [r.reward for r in got] == [1.0 + 0.5 * 1.0 + 0.0, 1.0 + 0.0 - 1.0, 1.0 + 0.0 - 2.0]


def test_format_forms():
    gsm = ["#### 72", "Work.\n#### $1,200 dollars\n", "#### 72\nmore text 3", "72", "#### seventy-two"]
    assert format_reward([], gsm, style=["gsm8k"] * 5) == [1.0, 1.0, 0.0, 0.0, 0.0]
    think = ["<think>6*12=72</think>\n72", "<think>x</think>", "72 <think>x</think> 72",
             "<think>a</think> 72 <think>b</think> 1", "\n<think>\nlong\nreasoning\n</think>\n\nThe answer is 72."]
    assert format_reward([], think, style=["think"] * 5) == [1.0, 0.0, 0.0, 0.0, 1.0]


def test_overlong_hand_worked():
    # max 100, buffer 20: free up to 80, then (80 - n) / 20.
    ids = [[0] * n for n in (1, 80, 81, 90, 100)]
    assert overlong_reward([], [""] * 5, ids, max_completion_length=100, overlong_buffer=20) == [
        0.0, 0.0, -0.05, -0.5, -1.0]
    with pytest.raises(RewardError, match="--overlong-buffer"):
        RewardSet("overlong", max_new_tokens=32, overlong_buffer=64)


def test_user_function_gets_trl_arguments(user_module):
    import my_rewards

    code_row = Problem(question="Write add.", answer="", style="plain",
                       columns={"tests": ["assert add(1, 2) == 3"], "difficulty": "easy"})
    chat = Problem(question="Hi?", answer="hello", style="plain",
                   messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}],
                   columns={"tests": ["assert True"], "completions": "a column named like an argument"})
    rs = RewardSet("my_rewards:record=2,format")
    got = rs.score([code_row, chat], ["```python\nx=1\n```", "<think>ok</think> hello"], [[5, 6], [7]])
    call = my_rewards.calls[-1]
    assert call["prompts"] == ["Write add.", chat.messages]
    assert call["completions"] == ["```python\nx=1\n```", [{"role": "assistant", "content": "<think>ok</think> hello"}]]
    assert call["completion_ids"] == [[5, 6], [7]]
    assert call["answer"] == ["", "hello"]
    assert call["tests"] == [["assert add(1, 2) == 3"], ["assert True"]]
    assert call["difficulty"] == ["easy", None]  # a column one row lacks is None there
    assert [r.info for r in got] == [{"record": 0.25, "format": 0.0}, {"record": 0.25, "format": 1.0}]
    assert [r.reward for r in got] == [0.5, 1.5]
    # A .py path works too, and None means "does not apply": no term and no info entry.
    short = RewardSet(f"{user_module}:short")
    assert short.score([Q, Q], ["a", "b"], [[1, 2], [1, 2, 3]]) == [
        RewardResult(1.0, {"short": 1.0}), RewardResult(0.0, {})]


@pytest.mark.parametrize("spec,needle", [
    ("no_such_module:fn", "no module named 'no_such_module'"),
    ("my_rewards:missing", "has no attribute 'missing'"),
    ("my_rewards:NOT_CALLABLE", "not a function"),
    ("my_rewards", "unknown reward 'my_rewards'"),
    ("./nowhere.py:fn", "does not exist"),
])
def test_bad_reward_choice(user_module, spec, needle):
    with pytest.raises(RewardError, match=needle) as err:
        RewardSet(spec)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("fn,needle", [
    ("wrong_length", "returned 1 values for 2 completions"),
    ("not_numbers", "returned 'good' at index 0"),
    ("not_finite", "returned nan"),
    ("crashes", "raised KeyError"),
])
def test_bad_reward_output_fails_the_probe(user_module, fn, needle):
    rs = RewardSet(f"my_rewards:{fn}")
    with pytest.raises(RewardError, match=needle) as err:
        rs.probe(Q)
    assert "\n" not in str(err.value)


def _run(args, cwd, timeout=300):
    env = {"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT), **child_env()}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("reward,needle", [
    # (bad names are also caught by the launcher: see the launcher test below)
    ("my_rewards:wrong_length", "returned 1 values for 2 completions"),
])
def test_sampler_rejects_bad_reward_in_one_line(user_module, tmp_path, reward, needle):
    if not (GSM8K / "train.jsonl").is_file():
        pytest.skip(f"{GSM8K} is missing")
    r = _run([str(ROOT / "sampling_worker.py"), "--device", "cpu", "--model", "/nonexistent/model",
              "--dataset", str(GSM8K), "--dataset-limit", "4", "--reward", reward,
              "--run-dir", str(tmp_path / "run")], cwd=user_module.parent)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and "Traceback" not in r.stderr
    # The model path is bad too: the reward error coming first shows no model was loaded.
    assert len(lines) == 1 and needle in lines[0], r.stderr


@pytest.mark.slow
def test_parts_reach_the_learner_metrics(user_module, tmp_path):
    """A real run (tiny model, CPU): the custom and built-in parts are logged as reward/<name>."""
    if not (GSM8K / "train.jsonl").is_file():
        pytest.skip(f"{GSM8K} is missing")
    sys.path.insert(0, str(ROOT / "tests"))
    from netutil import free_ports

    d, s = free_ports(2)
    run_dir = tmp_path / "run"
    r = _run([str(ROOT / "run_distributed.py"), "--device", "cpu", "--no-deepspeed", "--max-steps", "2",
              "--model", "tiny-random", "--dataset", str(GSM8K), "--num-generations", "4",
              "--prompts-per-round", "1", "--train-batch-size", "4", "--max-new-tokens", "12",
              "--reward", "correctness,format=0.5,my_rewards:record=2,overlong",
              "--overlong-buffer", "4", "--data-port", str(d), "--sync-port", str(s),
              "--run-dir", str(run_dir)], cwd=user_module.parent, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    steps = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in steps if not x.get("final")]
    assert [x["step"] for x in steps] == [1, 2]
    for x in steps:
        assert x["reward/record"] == 0.25
        assert -1.0 <= x["reward/overlong"] <= 0.0
        total = x["reward/correctness"] + 0.5 * x["reward/format"] + 2 * 0.25 + x["reward/overlong"]
        assert math.isclose(x["reward_mean"], total, abs_tol=1e-5)
        assert x["reward/correct"] == x["accuracy"]


def test_correctness_on_a_non_numeric_reasoning_gym_task():
    from grpo.data.sources import load_problems

    (p,) = load_problems("rg:word_sorting", limit=1, seed=0)
    assert p.answer == "Hart, find, inform, necessarily, profit, received, subscribers, tax, undertaking"
    texts = [f"Sorted.\n#### {p.answer}", "#### Hart, find", p.answer]  # the last lacks the marker
    got = RewardSet().score([p] * 3, texts, [[1]] * 3)
    # word_sorting gives partial credit: 2 of 9 words in place. Only a full score counts as correct.
    assert [r.info["correctness"] for r in got] == [1.0, pytest.approx(2 / 9), 0.0]
    assert [r.info["correct"] for r in got] == [1.0, 0.0, 0.0]
    (g,) = load_problems("rg:gsm_symbolic", limit=1, seed=0)  # numeric answers keep GSM8K rules
    assert RewardSet().score([g], [f"#### {int(g.answer):,}"], [[1]])[0].reward == 1.0


def test_code_reward_through_the_reward_set():
    from grpo.data.sandbox import SandboxLimits

    row = Problem(question="Write add(a, b).", answer="", style="plain",
                  columns={"tests": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"]})
    rs = RewardSet("code,format=0.5", code_limits=SandboxLimits(timeout_s=3.0, memory_mb=512))
    good = "<think>easy</think>\n```python\ndef add(a, b):\n    return a + b\n```"
    wrong = "```python\ndef add(a, b):\n    return a - b\n```"  # passes only add(0, 0) == 0
    got = rs.score([row, row, row], [good, wrong, "no code"], [[1], [1], [1]])
    assert [(r.reward, r.info) for r in got] == [(1.5, {"code": 1.0, "format": 1.0}),
                                                 (0.5, {"code": 0.5, "format": 0.0}),
                                                 (0.0, {"code": 0.0, "format": 0.0})]


@pytest.mark.parametrize("flags,needle", [
    (["--reward", "correctness,my_rewards:missing"], "--reward: module 'my_rewards' has no attribute 'missing'"),
    (["--reward", "correctness,format=x"], "--reward: weight 'x'"),
    (["--dataset-transform", "my_rewards:NOT_CALLABLE"], "--dataset-transform: 'my_rewards:NOT_CALLABLE' is a int"),
])
def test_launcher_rejects_bad_user_functions_before_starting_anything(user_module, tmp_path, flags, needle):
    run_dir = tmp_path / "run"
    r = _run([str(ROOT / "run_distributed.py"), "--device", "cpu", "--run-dir", str(run_dir), *flags],
             cwd=user_module.parent, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("run_distributed.py: error: ") and needle in lines[0], r.stderr
    assert not run_dir.exists()  # nothing was started
