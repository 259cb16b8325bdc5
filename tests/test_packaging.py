"""pyproject.toml agrees with the tree: each console command names a function that exists, the same
one its root script calls, and its dependencies are requirements.txt's packages, each pin there
within the bound here. (`pip install -e .` itself is checked by `make install` on a fresh clone.)"""
import ast
import importlib
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

# console command -> the root script a user may run instead
SCRIPTS = {"grpo-run": "run_distributed.py", "grpo-sampler": "sampling_worker.py",
           "grpo-learner": "training_worker.py", "grpo-comm-test": "communication_test.py"}


def requirements(lines: list[str]) -> dict[str, Requirement]:
    reqs = [Requirement(line.split("#")[0].strip()) for line in lines if line.split("#")[0].strip()]
    return {canonicalize_name(r.name): r for r in reqs}


@pytest.mark.parametrize("command", sorted(PROJECT["scripts"]))
def test_each_console_command_names_a_function(command):
    module, _, name = PROJECT["scripts"][command].partition(":")
    assert callable(getattr(importlib.import_module(module), name)), command


@pytest.mark.parametrize("command", sorted(SCRIPTS))
def test_each_root_script_calls_its_commands_function(command):
    """The root script only imports the function the console command runs (and sys) and calls it."""
    tree = ast.parse((ROOT / SCRIPTS[command]).read_text())
    imports = {(n.module, a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    module, _, name = PROJECT["scripts"][command].partition(":")
    assert imports == {(module, name)}, (SCRIPTS[command], imports)
    assert len([n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]) == 0


def test_dependencies_are_requirements_txt_packages_within_their_bounds():
    pinned = requirements((ROOT / "requirements.txt").read_text().splitlines())
    declared = requirements(PROJECT["dependencies"] + PROJECT["optional-dependencies"]["dev"])
    assert sorted(declared) == sorted(pinned)
    for name, req in pinned.items():
        (version,) = [s.version for s in req.specifier]     # requirements.txt pins each exactly
        assert declared[name].specifier.contains(version), (name, version, str(declared[name].specifier))
