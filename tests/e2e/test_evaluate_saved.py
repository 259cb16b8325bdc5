"""`python -m grpo.evaluate` on what real runs saved (CPU, tiny-random, run_distributed.py), and
evaluation of a user's own one-file data set.

Two short runs, one per module fixture:
- LoRA (--lora-r 8): its checkpoint folder, the checkpoint's hf/ (adapter files only) and the run's
  lora_adapter/ must each evaluate, to the same completions, which are not the base model's (the
  adapter was merged, not dropped).
- Full fine-tuning on one JSONL file with --eval-every: training must see every row but the held-out
  ones (a reward records every prompt it scores), sampler 0 and the learner evaluate on the
  held-out rows, and the checkpoint folder evaluates to the learner's own final completions.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from netutil import free_ports

ROOT = Path(__file__).resolve().parents[2]
GSM8K = ROOT.parent / "shared" / "data" / "gsm8k"
TOKENS = ["--max-new-tokens", "8"]
ENV = dict(os.environ, PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")

# A reward of the completion's own token ids: the tiny random model never answers right, and groups
# need signal for the steps to move the weights. RECORD (when set) gets every prompt scored.
VARIED = """import os
def varied(prompts, completions, completion_ids, **kw):
    if os.environ.get("RECORD"):
        with open(os.environ["RECORD"], "a") as fh:
            fh.writelines(p + "\\n" for p in prompts)
    return [float(sum(ids) % 2) for ids in completion_ids]
"""


def launch(tmp_path: Path, name: str, *flags: str, env: dict | None = None) -> Path:
    """A short run through run_distributed.py on free ports; its folder."""
    d, s = free_ports(2)
    run_dir = tmp_path / name
    (tmp_path / "varied.py").write_text(VARIED)
    r = subprocess.run([sys.executable, "run_distributed.py", "--device", "cpu", "--model", "tiny-random",
                        "--no-deepspeed", "--data-port", str(d), "--sync-port", str(s), "--run-dir", str(run_dir),
                        "--reward", f"{tmp_path / 'varied.py'}:varied", "--learning-rate", "5e-2", *TOKENS, *flags],
                       cwd=ROOT, env=env or ENV, capture_output=True, text=True, timeout=600)
    logs = "".join(p.read_text() for p in run_dir.glob("*.log")) if run_dir.exists() else ""
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:] + logs[-3000:]
    return run_dir


def evaluate(out_dir: Path, *calls: list) -> list[subprocess.CompletedProcess]:
    """`python -m grpo.evaluate ARGS` for each ARGS of `calls` at once (each is mostly its interpreter's
    start, which they can share the cores for); each result's JSON is at its .out."""
    procs = []
    for args in calls:
        out = out_dir / f"eval{len(list(out_dir.glob('eval*.json'))) + len(procs)}.json"
        p = subprocess.Popen([sys.executable, "-m", "grpo.evaluate", *map(str, args), "--device", "cpu",
                              "--out", str(out), *TOKENS], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        procs.append((p, out))
    done = []
    try:
        for p, out in procs:
            stdout, stderr = p.communicate(timeout=300)
            r = subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)
            r.out = out
            done.append(r)
    finally:
        for p, _ in procs:
            p.kill()
    return done


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("lora")
    return launch(tmp_path, "run", "--lora-r", "8", "--max-steps", "2", "--num-generations", "4",
                  "--prompts-per-round", "2", "--train-batch-size", "8", "--dataset", str(GSM8K),
                  "--dataset-limit", "16"), tmp_path


@pytest.mark.slow
def test_every_folder_a_lora_run_saved_evaluates_to_the_same_merged_policy(lora_run):
    run, tmp_path = lora_run
    step = run / "checkpoints" / "step_2"
    assert not (step / "hf" / "config.json").exists()           # hf/ holds the adapter alone: the case at hand
    assert (step / "hf" / "adapter_config.json").is_file() and (run / "lora_adapter" / "adapter_config.json").is_file()
    models = [step, step / "hf", run / "lora_adapter", "tiny-random"]
    results = evaluate(tmp_path, *[["--model", m, "--dataset", GSM8K, "--eval-size", "4"] for m in models])
    for m, r in zip(models, results):
        assert r.returncode == 0, (m, r.stderr[-3000:])
    got = [json.loads(r.out.read_text()) for r in results]
    keys = ("n", "correct", "accuracy", "mean_completion_len", "completions_sha256")
    assert [g["n"] for g in got] == [4] * 4
    assert [g[k] for k in keys for g in got[:3]] == [got[0][k] for k in keys for _ in range(3)]
    # the adapter is applied: the trained policy decodes otherwise than its base model
    assert got[3]["completions_sha256"] != got[0]["completions_sha256"]
    assert "merged into tiny-random" in got[0]["loaded"] and "config_learner.json" in got[0]["loaded"]
    assert got[0]["loaded"].startswith(f"LoRA adapter {step / 'hf'} ")


@pytest.mark.slow
def test_an_adapter_away_from_its_run_takes_its_base_from_base_model(lora_run):
    """lora_adapter/ copied out of its run folder, its own record of the base pointing nowhere: refused
    in one line naming --base-model; with --base-model it decodes as in the run folder."""
    run, tmp_path = lora_run
    moved = tmp_path / "elsewhere" / "adapter"
    shutil.copytree(run / "lora_adapter", moved)
    cfg = json.loads((moved / "adapter_config.json").read_text())
    (moved / "adapter_config.json").write_text(json.dumps(dict(cfg, base_model_name_or_path="/gone/base")))
    common = ["--dataset", GSM8K, "--eval-size", "2"]
    refused, ok, home = evaluate(moved.parent, ["--model", moved, *common],
                                 ["--model", moved, "--base-model", "tiny-random", *common],
                                 ["--model", run / "lora_adapter", *common])
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    line = refused.stderr.strip().splitlines()[-1]
    assert line.startswith("python -m grpo.evaluate: error:") and "/gone/base" in line and "--base-model" in line
    assert home.returncode == 0, home.stderr[-3000:]
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert json.loads(ok.out.read_text())["completions_sha256"] == json.loads(home.out.read_text())["completions_sha256"]


def test_a_folder_that_holds_no_model_is_refused_in_one_line_naming_what_it_takes(tmp_path):
    """An empty folder and a run folder (which names its newest checkpoint): exit 2, one line, before
    torch is imported."""
    run = tmp_path / "run"
    (run / "checkpoints" / "step_2" / "hf").mkdir(parents=True)
    (run / "checkpoints" / "step_10" / "hf").mkdir(parents=True)
    (run / "checkpoints" / "step_10" / "hf" / "config.json").write_text("{}")
    empty = tmp_path / "empty"
    empty.mkdir()
    code = ("import sys\nfrom grpo.evaluate import _main\n"
            f"rc = [_main(['--model', m, '--dataset', {str(GSM8K)!r}, '--device', 'cpu']) for m in sys.argv[1:]]\n"
            "print(rc, sorted(n for n in ('torch', 'transformers') if n in sys.modules))\n")
    r = subprocess.run([sys.executable, "-c", code, str(empty), str(run)], cwd=ROOT, env=ENV, capture_output=True,
                       text=True, timeout=120)
    assert r.stdout.strip() == "[2, 2] []", r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 2, r.stderr
    for line, m in zip(lines, (empty, run)):
        assert line.startswith(f"python -m grpo.evaluate: error: --model {m} holds no model"), line
        assert "runs/<id>/checkpoints/step_N" in line and "lora_adapter/" in line and "hf/" in line
    assert f"its newest checkpoint is {run / 'checkpoints' / 'step_10'})" in lines[1]


QUESTION = "What is {} plus one?"


@pytest.fixture(scope="module")
def file_run(tmp_path_factory):
    """Full fine-tuning on one 20-row JSONL file with --eval-every 1: 2 rows held out, 18 trained; 3 steps
    of 6 prompts take the stream through all 18 (one epoch)."""
    tmp_path = tmp_path_factory.mktemp("file")
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps({"question": QUESTION.format(i), "answer": f"#### {i + 1}"}) + "\n"
                            for i in range(20)))
    record = tmp_path / "prompts.txt"
    run = launch(tmp_path, "run", "--dataset", str(data), "--eval-every", "1", "--max-steps", "3",
                 "--num-generations", "2", "--prompts-per-round", "6", "--train-batch-size", "12",
                 env=dict(ENV, RECORD=str(record)))
    return run, data, record, tmp_path


@pytest.mark.slow
def test_one_file_trains_on_all_but_its_held_out_rows_and_evaluates_on_those(file_run):
    import datasets

    run, data, record, _ = file_run
    # The oracle: datasets' own train_test_split, the documented rule, on the file's rows.
    split = datasets.Dataset.from_json(str(data)).train_test_split(test_size=0.1, seed=42)
    held, train = set(split["test"]["question"]), set(split["train"]["question"])
    assert len(held) == 2 and len(train) == 18
    trained = set(record.read_text().splitlines())
    assert trained == train                       # every training row scored, and nothing else
    assert not trained & held
    evals = [json.loads(x) for x in (run / "eval.jsonl").read_text().splitlines()]
    assert {e["by"] for e in evals} == {"sampler0", "learner"}
    assert all(e["n"] == 2 for e in evals), evals
    said = (run / "sampler0.log").read_text()
    assert "training on 18 of its 20 rows; 2 are held out for evaluation" in said
    assert "evaluating on its 2 held-out rows of 20" in said


@pytest.mark.slow
def test_a_full_fine_tuning_checkpoint_folder_evaluates_as_the_learner_did(file_run):
    """The checkpoint folder itself (not its hf/) on the same file: its held-out rows, and the learner's
    final completions exactly."""
    run, data, _, tmp_path = file_run
    (r,) = evaluate(tmp_path, ["--model", run / "checkpoints" / "step_3", "--dataset", data])
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.out.read_text())
    final = [json.loads(x) for x in (run / "eval.jsonl").read_text().splitlines()]
    final = [e for e in final if e["by"] == "learner"]
    assert [e["version"] for e in final] == [3]
    assert (got["n"], got["split"]) == (2, "held-out")
    assert got["completions_sha256"] == final[0]["completions_sha256"]
    assert "greedy pass@1" in r.stdout and "2 held-out problems" in r.stdout


def test_a_run_that_cannot_evaluate_its_data_is_refused_before_anything_starts(tmp_path):
    """--eval-every on a file too small to hold rows out (or a folder without a test split): the
    launcher's one line names --eval-dataset, before any process starts; with --eval-dataset, or without
    --eval-every, the same data passes its checks."""
    from grpo.launch.main import check_sampler_flags

    small = tmp_path / "small.jsonl"
    small.write_text("".join(json.dumps({"question": f"q{i}?", "answer": f"#### {i}"}) + "\n" for i in range(5)))
    only_train = tmp_path / "only_train"
    only_train.mkdir()
    shutil.copy(small, only_train / "train.jsonl")
    r = subprocess.run([sys.executable, "run_distributed.py", "--device", "cpu", "--model", "tiny-random",
                        "--dataset", str(small), "--eval-every", "1", "--run-dir", str(tmp_path / "run")],
                       cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and not (tmp_path / "run").exists(), r.stdout + r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("run_distributed.py: error: Dataset file") and "has 5 rows" in line
    assert "--eval-dataset PATH" in line
    assert "--eval-dataset PATH" in check_sampler_flags(["--dataset", str(only_train), "--eval-every", "1"])
    assert check_sampler_flags(["--dataset", str(small), "--eval-every", "1", "--eval-dataset", str(GSM8K)]) is None
    assert check_sampler_flags(["--dataset", str(small)]) is None
