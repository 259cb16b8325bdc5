"""grpo.model's face: a package docstring that says which module holds which name, an __init__ that
imports nothing (callers import from the defining module), and a launcher-side import (the package,
the GGUF header reader, the hub check) that loads no torch, transformers or numpy."""
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import grpo.model

ROOT = Path(__file__).resolve().parents[1]


def table() -> dict[str, list[str]]:
    """The docstring's table: a module name at two spaces, then its names; a deeper line goes on."""
    doc = grpo.model.__doc__
    lines = doc[doc.index("reads this table):"):].splitlines()[1:]
    rows: dict[str, list[str]] = {}
    module = None
    for line in lines:
        if not line.strip():
            continue
        if line.startswith("  ") and not line.startswith("   "):
            module, *names = line.split()
            rows[module] = names
        else:
            rows[module] += line.split()
    return rows


def test_each_name_lives_in_the_module_the_docstring_says():
    rows = table()
    assert set(rows) == {"gguf.header", "gguf.convert", "gguf.cache", "zoo", "hub", "load", "logprobs", "saved"}
    for module, names in rows.items():
        home = importlib.import_module(f"grpo.model.{module}")
        for name in names:
            value = getattr(home, name)
            # defined there, not imported from elsewhere (a constant has no __module__)
            assert getattr(value, "__module__", home.__name__) == home.__name__, (module, name)
    assert {"resolve_model", "load_causal_lm", "token_logprobs", "weights_checksum",
            "ModelUnavailable"} <= {n for names in rows.values() for n in names}


def test_the_package_exports_nothing():
    assert not hasattr(grpo.model, "__getattr__")
    assert not hasattr(grpo.model, "__all__")
    with pytest.raises(ImportError):
        exec("from grpo.model import resolve_model", {})


def test_the_launchers_model_imports_load_no_torch():
    code = ("import sys\n"
            "import grpo.model\n"
            "from grpo.model.gguf.header import ModelUnavailable, gguf_model_file\n"
            "from grpo.model.hub import check_hub_model\n"
            "print(sorted(n for n in ('torch', 'transformers', 'numpy') if n in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.stdout == "[]\n", out.stderr
