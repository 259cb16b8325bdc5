"""Every entry point's --help prints and exits 0: argparse formats each help string with %, so a
field's doc that says "10%" once ended run_distributed.py --help in a TypeError. And --help stays short:
the launcher's under 250 lines, no field's doc over 200 characters (the reasons live in
docs/configuration.md), every flag still listed."""
import subprocess
import sys
from pathlib import Path

import pytest
from freshenv import child_env

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("cmd", [["run_distributed.py"], ["sampling_worker.py"], ["training_worker.py"],
                                 ["communication_test.py"], ["-m", "grpo.evaluate"], ["-m", "grpo.data"]])
def test_every_entry_point_prints_its_help(cmd):
    r = subprocess.run([sys.executable, *cmd, "--help"], cwd=ROOT, env=child_env(), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("usage:") and "Traceback" not in r.stderr


def test_a_percent_in_a_fields_doc_reaches_the_help_as_written():
    r = subprocess.run([sys.executable, "sampling_worker.py", "--help"], cwd=ROOT, env=child_env(),
                       capture_output=True, text=True, timeout=120)
    flat = " ".join(r.stdout.split())
    assert "held-out 10% of rows" in flat and "i % num_samplers" in flat, flat[:300]


# The goals for --help: one screen a section, one line an option where its help is short.
MOST_LINES = 250
LONGEST_DOC = 200


def help_text(script: str) -> str:
    """`script --help` as a pipe reads it (no terminal: the formatter's 120 columns, whatever COLUMNS says here)."""
    env = {k: v for k, v in child_env().items() if k not in ("COLUMNS", "LINES")}
    r = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_the_launchers_help_is_under_250_lines():
    lines = help_text("run_distributed.py").splitlines()
    assert len(lines) < MOST_LINES, f"{len(lines)} lines"
    assert max(map(len, lines)) <= 120


def config_dataclasses() -> list[type]:
    """Every dataclass of every module under grpo/config (sections, role configs, EvalConfig)."""
    import dataclasses
    import importlib
    import pkgutil

    import grpo.config

    found: dict[str, type] = {}
    for mod in pkgutil.iter_modules(grpo.config.__path__):
        module = importlib.import_module(f"grpo.config.{mod.name}")
        for obj in vars(module).values():
            if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__.startswith("grpo.config"):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return list(found.values())


def test_no_fields_doc_is_over_200_characters():
    """A help is what the option is, its unit and choices; the reasons are in docs/configuration.md."""
    from grpo.flags import field_docs

    classes = config_dataclasses()
    assert len(classes) >= 20
    long = {f"{cls.__name__}.{name}": len(doc) for cls in classes for name, doc in field_docs(cls).items()
            if len(doc) > LONGEST_DOC}
    assert not long, long


@pytest.mark.parametrize("script", ["run_distributed.py", "sampling_worker.py", "training_worker.py"])
def test_every_flag_is_in_the_help(script):
    """Every option its parser takes is listed; a switch with its negation as --[no-]name."""
    import argparse

    from grpo.config import LearnerConfig, SamplerConfig
    from grpo.flags import build_parser
    from grpo.launch.plan import launcher_parser

    parser = {"run_distributed.py": lambda: launcher_parser(with_workers=True),
              "sampling_worker.py": lambda: build_parser(SamplerConfig, script),
              "training_worker.py": lambda: build_parser(LearnerConfig, script)}[script]()
    listed = set(help_text(script).replace(",", " ").split())
    missing = []
    for action in parser._actions:
        for flag in action.option_strings:
            if isinstance(action, argparse.BooleanOptionalAction):
                shown = "--[no-]" + flag.removeprefix("--no-").removeprefix("--")
            else:
                shown = flag
            if shown not in listed:
                missing.append(flag)
    assert not missing, missing
    assert len(parser._actions) > 40
