"""Flags are taken only as spelled, in every entry point: argparse's prefix matching once read
`--max-step 3` as `--max-steps 3` without a word. A flag no parser knows is one line, exit code 2,
naming the nearest real flag, with one pointer to --help; so is a misspelt reward. Real processes,
as a user starts them, each in an empty folder that must stay empty."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo.config.cli import ArgumentParser, unknown_arguments, unknown_flag

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
HEAVY = ("torch", "transformers", "deepspeed", "datasets", "reasoning_gym", "numpy", "zmq")


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`python ARGS` in `cwd`, a user's folder outside the repository (the package importable)."""
    return subprocess.run([PY, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def one_error_line(r: subprocess.CompletedProcess) -> str:
    """The process's only stderr line, after checking it refused the start (exit 2, no stdout)."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and not r.stdout, r.stdout + r.stderr
    return lines[0]


def test_launcher_refuses_a_prefix_before_loading_anything(tmp_path):
    """--max-step is a prefix of --max-steps (and of nothing else the launcher takes): refused at
    once, by name, with no module of a worker's imported and no folder made."""
    code = ("import runpy, sys\n"
            f"sys.argv = ['run_distributed.py', '--max-step', '3', '--device', 'cpu']\n"
            "try:\n"
            f"    runpy.run_path({str(ROOT / 'run_distributed.py')!r}, run_name='__main__')\n"
            "except SystemExit as e:\n"
            f"    print(e.code, sorted(m for m in {HEAVY!r} if m in sys.modules))\n")
    r = run(["-c", code], tmp_path)
    assert r.stdout.strip() == "2 []", r.stdout + r.stderr
    assert r.stderr.splitlines() == [("run_distributed.py: error: unknown flag --max-step; did you mean "
                                      "--max-steps? (see --help)")], r.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args,typed,meant", [
    (["run_distributed.py", "--device", "cpu", "--max-step", "3"], "--max-step", "--max-steps"),
    (["training_worker.py", "--device", "cpu", "--max-step=3"], "--max-step", "--max-steps"),
    (["sampling_worker.py", "--device", "cpu", "--temperatur", "0.7"], "--temperatur", "--temperature"),
    (["communication_test.py", "--data-por", "5999"], "--data-por", "--data-port"),
    (["-m", "grpo.evaluate", "--eval-siz", "3"], "--eval-siz", "--eval-size"),
    (["-m", "grpo.data", "validate", "rows.jsonl", "--transfor", "m:f"], "--transfor", "--transform"),
    (["-m", "grpo.obs.report", "runs/x", "--ou", "out"], "--ou", "--out"),
])
def test_every_entry_point_takes_flags_only_as_spelled(tmp_path, args, typed, meant):
    """Each prefix here is of exactly one flag, so argparse took it for that flag before: now each
    entry point refuses it and names the flag meant."""
    script = [str(ROOT / args[0])] if args[0].endswith(".py") else args[:2]
    rest = args[1:] if args[0].endswith(".py") else args[2:]
    r = run([*script, *rest], tmp_path)
    line = one_error_line(r)
    assert f"error: unknown flag {typed}; did you mean {meant}? (see --help)" in line, line
    assert list(tmp_path.iterdir()) == []


def test_a_worker_flag_misspelt_on_the_launcher_names_it_with_one_pointer_to_help(tmp_path):
    """--learning-rat is no launcher flag and no worker's: the launcher's message names the learner's
    --learning-rate, and points at --help once (it did twice: its own and the parser's)."""
    line = one_error_line(run([str(ROOT / "run_distributed.py"), "--device", "cpu", "--learning-rat", "1e-5"],
                              tmp_path))
    assert line == "run_distributed.py: error: unknown flag --learning-rat; did you mean --learning-rate? (see --help)"
    assert line.count("see --help") == 1
    made_up = one_error_line(run([str(ROOT / "run_distributed.py"), "--device", "cpu", "--bogus-x", "2"], tmp_path))
    assert made_up == "run_distributed.py: error: unknown flag --bogus-x (see --help)"   # nothing near: no guess
    assert list(tmp_path.iterdir()) == []


def test_a_misspelt_reward_gets_the_right_name(tmp_path):
    """A built-in's typo names the built-in; a user file's function typo names the function the
    file has; both before any worker starts (exit 2, the folder left empty but for the file)."""
    rewards = tmp_path / "my_rewards.py"
    rewards.write_text("import math\n\n\ndef length_penalty(completions, **kw):\n    return [0.0 for _ in completions]\n")
    launcher = str(ROOT / "run_distributed.py")
    line = one_error_line(run([launcher, "--device", "cpu", "--reward", "correctnes"], tmp_path))
    assert line.startswith("run_distributed.py: error: --reward: unknown reward 'correctnes'; did you mean "
                           "correctness? (the built-ins are correctness, "), line
    line = one_error_line(run([launcher, "--device", "cpu", "--reward", "correctness,./my_rewards.py:lenght_penalty"],
                              tmp_path))
    assert line == ("run_distributed.py: error: --reward: module './my_rewards.py' has no attribute 'lenght_penalty'; "
                    "did you mean length_penalty?"), line
    assert [p.name for p in tmp_path.iterdir()] == ["my_rewards.py"]


def test_unknown_flag_compares_names_without_their_dashes():
    known = ["--max-steps", "--max-staleness", "--learning-rate", "--no-scale-rewards", "-h", "--help"]
    assert unknown_flag("--max-step=3", known) == "unknown flag --max-step; did you mean --max-steps?"
    assert unknown_flag("--learning_rate", known) == "unknown flag --learning_rate; did you mean --learning-rate?"
    assert unknown_flag("--zzz", known) == "unknown flag --zzz"
    assert unknown_arguments(["3"], known) == "unexpected argument '3'; flags look like --name value"
    assert unknown_arguments(["3", "--max-stalenes", "1"], known) == \
        "unknown flag --max-stalenes; did you mean --max-staleness?"


def test_the_parser_refuses_what_argparse_would_abbreviate(capsys):
    parser = ArgumentParser(prog="p")
    parser.add_argument("--max-steps", type=int, default=1)
    assert parser.parse_args(["--max-steps", "3"]).max_steps == 3
    with pytest.raises(SystemExit) as e:
        parser.parse_args(["--max-step", "3"])
    assert e.value.code == 2
    assert capsys.readouterr().err == "p: error: unknown flag --max-step; did you mean --max-steps? (see --help)\n"


# Files whose parsers users and the docs' commands reach: the package, the entry scripts, bench/.
SOURCES = [*sorted((ROOT / "grpo").rglob("*.py")), *sorted(ROOT.glob("*.py")), *sorted((ROOT / "bench").rglob("*.py"))]


def test_every_parser_in_the_repository_is_exact():
    """A parser made later with plain argparse would bring prefixes back: every argparse.ArgumentParser
    call passes allow_abbrev=False, and a bare ArgumentParser is the shared one (grpo.config.cli)."""
    loose = []
    for path in SOURCES:
        tree = ast.parse(path.read_text())
        shared = any(isinstance(n, ast.ImportFrom) and n.module in ("grpo.config.cli", "grpo.flags")
                     and any(a.name == "ArgumentParser" for a in n.names) for n in ast.walk(tree))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            exact = any(k.arg == "allow_abbrev" and isinstance(k.value, ast.Constant) and k.value.value is False
                        for k in node.keywords)
            plain = isinstance(f, ast.Attribute) and f.attr == "ArgumentParser"   # argparse.ArgumentParser(...)
            bare = isinstance(f, ast.Name) and f.id == "ArgumentParser" and not shared
            if (plain or bare) and not exact:
                loose.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert loose == [], loose
