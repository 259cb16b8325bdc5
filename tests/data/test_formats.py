"""Datasets in the layouts and file types users bring, transforms, and the validate command."""
import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from freshenv import child_env

from grpo.data.formats import Problem
from grpo.data.prompts import DEFAULT_INSTRUCTION, problem_prompt
from grpo.data.sources import DatasetUnavailable, load_problems

ROOT = Path(__file__).resolve().parents[2]

ROWS = [
    {"question": "What is 2+2?", "answer": "#### 4"},
    {"instruction": "Reverse the word.", "input": "abc", "response": "cba"},
    {"instruction": "Say hi.", "input": "", "output": "hi"},
    {"input": "Capital of France?", "output": "Paris"},
    {"prompt": "Write add(a, b).", "tests": ["assert add(1, 2) == 3"]},
    {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2*3?"}],
     "solution": "6", "level": 1},
]
EXPECTED = [
    Problem("What is 2+2?", "#### 4"),
    Problem("Reverse the word.\n\nabc", "cba", style="plain", columns={"response": "cba"}),
    Problem("Say hi.", "hi", style="plain", columns={"output": "hi"}),
    Problem("Capital of France?", "Paris", style="plain", columns={"output": "Paris"}),
    Problem("Write add(a, b).", "", style="plain", columns={"tests": ["assert add(1, 2) == 3"]}),
    Problem("2*3?", "6", style="plain", columns={"solution": "6", "level": 1},
            messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2*3?"}]),
]


def write(path: Path, rows: list[dict]) -> Path:
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    elif path.suffix == ".json":
        path.write_text(json.dumps(rows), encoding="utf-8")
    elif path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:  # CSV: nested values as JSON text, as exports do
        keys = sorted({k for r in rows for k in r})
        with path.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=keys)
            writer.writeheader()
            for r in rows:
                writer.writerow({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in r.items()})
    return path


def test_every_layout_from_jsonl(tmp_path):
    assert load_problems(str(write(tmp_path / "mixed.jsonl", ROWS))) == EXPECTED


@pytest.mark.parametrize("suffix", [".json", ".parquet", ".csv"])
def test_file_types(tmp_path, suffix):
    rows = [ROWS[0], {"question": "3+3?", "answer": "#### 6"}]
    problems = load_problems(str(write(tmp_path / f"train{suffix}", rows)))
    assert problems == [Problem("What is 2+2?", "#### 4"), Problem("3+3?", "#### 6")]
    # A folder of <split>.<ext> files works the same way.
    write(tmp_path / f"test{suffix}", rows[1:])
    assert load_problems(str(tmp_path), split="test") == [Problem("3+3?", "#### 6")]


def test_csv_chat_prompt_and_tests_as_json_text(tmp_path):
    rows = [{"prompt": ROWS[5]["prompt"], "tests": ["assert True"]}]
    (problem,) = load_problems(str(write(tmp_path / "chat.csv", rows)))
    assert problem.messages == ROWS[5]["prompt"]
    assert problem.columns == {"tests": '["assert True"]'}  # the code reward parses JSON lists


def test_a_file_too_small_to_hold_rows_out_trains_whole_and_names_eval_dataset_for_evaluation(tmp_path):
    path = write(tmp_path / "data.jsonl", ROWS)   # 6 rows: fewer than the 10 a held-out split needs
    assert load_problems(str(path)) == EXPECTED
    with pytest.raises(DatasetUnavailable) as err:
        load_problems(str(path), split="test")
    message = str(err.value)
    assert "\n" not in message and "has 6 rows" in message and "--eval-dataset PATH" in message
    with pytest.raises(DatasetUnavailable, match="not 'validation'.*--eval-dataset"):
        load_problems(str(path), split="validation")


def test_transform(tmp_path, monkeypatch):
    (tmp_path / "my_transform.py").write_text(
        "def to_gsm8k(row):\n"
        "    if row['difficulty'] == 'skip':\n"
        "        return None\n"
        "    return {'question': row['problem'], 'answer': '#### ' + str(row['result'])}\n"
        "def broken(row):\n"
        "    return row['nope']\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    rows = [{"problem": "1+1?", "result": 2, "difficulty": "easy"},
            {"problem": "hard", "result": 0, "difficulty": "skip"},
            {"problem": "5-1?", "result": 4, "difficulty": "easy"}]
    path = str(write(tmp_path / "raw.jsonl", rows))
    assert load_problems(path, transform="my_transform:to_gsm8k") == [
        Problem("1+1?", "#### 2"), Problem("5-1?", "#### 4")]
    assert load_problems(path, transform="my_transform:to_gsm8k", limit=1) == [Problem("1+1?", "#### 2")]
    with pytest.raises(DatasetUnavailable, match=r"line 1: --dataset-transform raised KeyError"):
        load_problems(path, transform="my_transform:broken")
    with pytest.raises(ValueError, match="--dataset-transform: module 'my_transform' has no attribute 'nope'"):
        load_problems(path, transform="my_transform:nope")
    # Generated problems go through it too.
    (tmp_path / "tag.py").write_text("def tag(row):\n    return dict(row, question='Q: ' + row['question'])\n")
    tagged = load_problems("rg:gsm_symbolic", limit=2, seed=1, transform="tag:tag")
    assert [p.question for p in tagged] == ["Q: " + p.question for p in load_problems("rg:gsm_symbolic", limit=2, seed=1)]


def test_bad_rows_name_the_line(tmp_path):
    lines = [json.dumps(ROWS[0]), json.dumps({"title": "no prompt"}), json.dumps({"prompt": [{"role": "robot", "content": "x"}]})]
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetUnavailable, match=r"bad.jsonl, line 2: no prompt column among \['title'\]"):
        load_problems(str(path))


def test_prompts_per_style():
    class Plain:
        chat_template = None

    assert problem_prompt(Plain(), EXPECTED[0]) == f"Question: What is 2+2?{DEFAULT_INSTRUCTION}\nAnswer:"
    assert problem_prompt(Plain(), EXPECTED[3]) == "Question: Capital of France?\nAnswer:"  # verbatim
    assert problem_prompt(Plain(), EXPECTED[5]) == "System: Be brief.\nUser: 2*3?\nAssistant:"


def test_reasoning_gym_unknown_task_says_how_to_list_names():
    with pytest.raises(DatasetUnavailable) as err:
        load_problems("rg:no_such_task", limit=2)
    message = str(err.value)
    assert "\n" not in message and "no_such_task" in message
    assert "reasoning_gym.factory" in message and "DATASETS" in message


def test_reasoning_gym_any_task():
    # A non-arithmetic task loads too (the GSM8K correctness reward only scores numeric answers).
    problems = load_problems("rg:word_sorting", limit=3, seed=0)
    assert len(problems) == 3 and all(p.question and p.answer for p in problems)


def validate(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "grpo.data", "validate", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), **child_env()})


def test_validate_command(tmp_path):
    good = write(tmp_path / "good.jsonl", ROWS)
    r = validate(str(good))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (f"{good}: 6 good rows (1 gsm8k, 1 messages, 4 plain), 0 bad, "
                                "1 without a reference answer (only custom rewards can score them)")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([json.dumps(ROWS[0]), "{not json", "", json.dumps({"question": ["x"], "answer": "1"}),
                              json.dumps(["a list"]), json.dumps({"question": "q", "answer": "#### 1"})]) + "\n")
    r = validate(str(bad))
    assert r.returncode == 1
    out = r.stdout.strip().splitlines()
    assert out[0].startswith(f"{bad}: line 2: not valid JSON")
    assert out[1] == f"{bad}: line 4: column 'question' is list, expected a string"
    assert out[2] == f"{bad}: line 5: expected an object (a dict of columns), got list"
    assert out[3] == f"{bad}: 2 good rows (2 gsm8k), 3 bad"
    csv_path = tmp_path / "rows.csv"
    csv_path.write_text("question,answer\nq1,#### 1\nq2,#### 2,extra\n,#### 3\n")
    r = validate(str(csv_path))
    assert r.returncode == 1
    assert r.stdout.splitlines()[:2] == [
        f"{csv_path}: line 3: 2 columns in the header, a different number in this row",
        f"{csv_path}: line 4: the prompt is empty"]


def test_validate_missing_file_is_one_line():
    r = validate("/no/such/data.jsonl")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        "python -m grpo.data: error: '/no/such/data.jsonl' does not exist; pass a dataset file or folder"]
