"""grpo.model's names: each one callers import from the package is its defining module's object, found
on first use, and importing the GGUF header reader does not import torch (the launcher's promise)."""
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import grpo.model

ROOT = Path(__file__).resolve().parents[1]


def test_every_exported_name_is_its_modules_object():
    for name in grpo.model.__all__:
        home = importlib.import_module(grpo.model._HOME[name])
        assert getattr(grpo.model, name) is getattr(home, name), name
    assert {"resolve_model", "load_causal_lm", "token_logprobs", "weights_checksum",
            "ModelUnavailable"} <= set(grpo.model.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        grpo.model.nothing_here  # noqa: B018


def test_the_header_reader_and_the_package_import_no_torch():
    code = ("import sys\n"
            "import grpo.model\n"
            "from grpo.model import ModelUnavailable\n"
            "from grpo.model.gguf.header import gguf_model_file\n"
            "print(sorted(n for n in ('torch', 'transformers', 'numpy') if n in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.stdout == "[]\n", out.stderr
