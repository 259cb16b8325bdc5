"""grpo.rules imports no torch, numpy or zmq: the launcher applies these rules before any worker
starts, and every role imports them at the top of its modules. In a fresh interpreter, so that no
other test's imports count; every module of the package is imported, one found later included."""
import pkgutil
import subprocess
import sys
from pathlib import Path

import grpo.rules

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "numpy", "zmq")


def test_every_rules_module_imports_no_torch_numpy_or_zmq():
    modules = sorted(m.name for m in pkgutil.walk_packages(grpo.rules.__path__, "grpo.rules."))
    assert {"grpo.rules.staleness", "grpo.rules.methods", "grpo.rules.memory"} <= set(modules)   # the walk sees them
    code = ("import importlib, sys\n"
            f"for name in {modules!r}:\n"
            "    importlib.import_module(name)\n"
            f"print(sorted(n for n in {HEAVY!r} if n in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"grpo.rules imported {out.stdout.strip()}"
