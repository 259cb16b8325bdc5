"""The suite's fresh machine: before anything is imported, tests/conftest.py (isolate) points HOME,
GRPO_CACHE and every cache a library of ours keeps (Hugging Face, torch and its compilers,
matplotlib) at one empty folder made for the session, so that a model converted, a GGUF fetched or
a dataset downloaded on this machine earlier can never hide a test's dependence on it.

The first process makes the folder (without pytest-xdist, the only one; with it, the controller,
which loads conftest.py before it starts the workers) and removes it at the end; the workers, and
every subprocess a test starts, inherit the environment, so they share it: the default model
converts once a session (grpo.model.load.build_cached locks the folder while one process builds it;
the others wait). A test that gives a child a hand-made environment adds child_env()'s variables.
"""
from __future__ import annotations

import os
import re
import tempfile
import time
from pathlib import Path

SESSION_ENV = "GRPO_TEST_SESSION_DIR"     # the session's folder: every cache below is inside it
SESSION_START_ENV = "GRPO_TEST_SESSION_START"   # when it was made (time.time()): nothing in it is older

# Variables that would send a library's cache somewhere else than the folders session_caches sets.
_CACHE_VARS = re.compile(r"^(HF|HUGGINGFACE|TRANSFORMERS|PYTORCH_TRANSFORMERS|PYTORCH_PRETRAINED_BERT)_\w*CACHE$")
# Where a developer's own files would otherwise be used: the default model's GGUF, the benchmark's
# GGUFs; triton's cache (without these, under HOME).
_MACHINE_VARS = ("GRPO_GGUF_PATH", "GRPO_GGUF_DIR", "TRITON_HOME", "TRITON_CACHE_DIR")
# With the caches empty, a test that fetched a model or dataset would depend on the hub, not on the
# repository, ../shared or itself: none may reach it.
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

_owner: bool | None = None    # isolate()'s answer, once a process


def session_caches(session: Path) -> dict[str, str]:
    """The folders isolate sets, each inside `session`."""
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


def child_env() -> dict[str, str]:
    """The session's variables, for a child started with an environment of its own making."""
    keys = (SESSION_ENV, SESSION_START_ENV, *session_caches(Path(os.environ[SESSION_ENV])), *OFFLINE)
    return {k: os.environ[k] for k in keys}


def isolate() -> bool:
    """Set the session's environment (once a process); True in the process that made the folder,
    which removes it at the end."""
    global _owner
    if _owner is not None:
        return _owner
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        if not os.environ.get(SESSION_ENV):
            raise RuntimeError(f"pytest-xdist worker {worker} has no {SESSION_ENV}: its controller did not load "
                               f"tests/conftest.py before starting it (remote workers are not supported)")
        _owner = False
        return _owner
    # A fresh folder for every run, even one started inside a test or with SESSION_ENV left in the shell.
    os.environ[SESSION_START_ENV] = repr(time.time())
    os.environ[SESSION_ENV] = tempfile.mkdtemp(prefix="grpo-tests-")
    for k in [k for k in os.environ if _CACHE_VARS.match(k)] + list(_MACHINE_VARS):
        os.environ.pop(k, None)
    caches = session_caches(Path(os.environ[SESSION_ENV]))
    os.environ.update(caches, **OFFLINE)
    for d in caches.values():
        os.makedirs(d, exist_ok=True)
    _owner = True
    return _owner
