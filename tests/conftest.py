"""tests/ mirrors the package (tests/wire, tests/weights, ...); the helpers beside this file
(builders, netutil, faultutil, benchload, scripted) are importable from every folder.

The suite runs as on a fresh machine: before anything is imported, this file points HOME, GRPO_CACHE
and every cache a library of ours keeps (Hugging Face, torch and its compilers, matplotlib) at one
empty folder made for the session, so that a model converted, a GGUF fetched or a dataset
downloaded on this machine earlier can never hide a test's dependence on it. The first process
makes the folder (without pytest-xdist, the only one; with it, the controller, which loads this file
before it starts the workers) and removes it at the end; the workers, and every subprocess a test
starts, inherit the environment, so they share it: the default model converts once a session
(grpo.model.load.build_cached locks the folder while one process builds it; the others wait).
"""
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

SESSION_ENV = "GRPO_TEST_SESSION_DIR"     # the session's folder: every cache below is inside it
SESSION_START_ENV = "GRPO_TEST_SESSION_START"   # when it was made (time.time()): nothing in it is older

# Variables that would send a library's cache somewhere else than the folders set below.
_CACHE_VARS = re.compile(r"^(HF|HUGGINGFACE|TRANSFORMERS|PYTORCH_TRANSFORMERS|PYTORCH_PRETRAINED_BERT)_\w*CACHE$")
# Where a developer's own files would otherwise be used: the default model's GGUF, the benchmark's
# GGUFs; triton's cache (without these, under HOME).
_MACHINE_VARS = ("GRPO_GGUF_PATH", "GRPO_GGUF_DIR", "TRITON_HOME", "TRITON_CACHE_DIR")


def session_caches(session: Path) -> dict[str, str]:
    """The variables this file sets, each a folder inside `session`."""
    home = session / "home"
    return {"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"), "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_DATA_HOME": str(home / ".local" / "share"),
            "GRPO_CACHE": str(session / "grpo-cache"),
            "HF_HOME": str(home / ".cache" / "huggingface"),
            "TORCH_HOME": str(home / ".cache" / "torch"),
            "TORCH_EXTENSIONS_DIR": str(home / ".cache" / "torch_extensions"),
            # inductor's default is /tmp/torchinductor_<user>, outside HOME
            "TORCHINDUCTOR_CACHE_DIR": str(session / "torchinductor"),
            "MPLCONFIGDIR": str(home / ".config" / "matplotlib")}


def _isolate() -> bool:
    """Set the session's environment; True in the process that made the folder (it removes it)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        if not os.environ.get(SESSION_ENV):
            raise RuntimeError(f"pytest-xdist worker {worker} has no {SESSION_ENV}: its controller did not load "
                               f"tests/conftest.py before starting it (remote workers are not supported)")
        return False
    # A fresh folder for every run, even one started inside a test or with SESSION_ENV left in the shell.
    os.environ[SESSION_START_ENV] = repr(time.time())
    os.environ[SESSION_ENV] = tempfile.mkdtemp(prefix="grpo-tests-")
    for k in [k for k in os.environ if _CACHE_VARS.match(k)] + list(_MACHINE_VARS):
        os.environ.pop(k, None)
    os.environ.update(session_caches(Path(os.environ[SESSION_ENV])))
    # No test reaches the network for a model or dataset: with the caches empty, one that tried
    # would depend on the hub, not on the repository, ../shared or itself.
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    for d in session_caches(Path(os.environ[SESSION_ENV])).values():
        os.makedirs(d, exist_ok=True)
    return True


_OWNER = _isolate()


def pytest_unconfigure(config):
    if _OWNER:
        shutil.rmtree(os.environ[SESSION_ENV], ignore_errors=True)
