"""tests/ mirrors the package (tests/wire, tests/weights, ...); the helpers beside this file
(builders, netutil, faultutil, benchload, scripted, freshenv) are importable from every folder.

Loaded first in every test process, this file makes the session's machine a fresh one before
anything else is imported (freshenv: HOME, GRPO_CACHE and the libraries' caches in one empty folder
for the session, which the process that made it removes at the end).
"""
import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import freshenv  # noqa: E402  (the folder above on sys.path)

_OWNER = freshenv.isolate()


def pytest_unconfigure(config):
    if _OWNER:
        shutil.rmtree(os.environ[freshenv.SESSION_ENV], ignore_errors=True)


@pytest.fixture(autouse=True)
def _hub_offline_as_it_was():
    """A test that resolves a hub id in this process may turn offline mode on for the process
    (grpo.model.hub.go_offline: the variable and huggingface_hub's constant); put both back, so the
    next test in this worker sees the machine as it was, whichever order the tests run in."""
    before = os.environ.get("HF_HUB_OFFLINE")
    yield
    if before is None:
        os.environ.pop("HF_HUB_OFFLINE", None)
    else:
        os.environ["HF_HUB_OFFLINE"] = before
    if (hub := sys.modules.get("huggingface_hub.constants")) is not None:
        hub.HF_HUB_OFFLINE = (before or "").upper() in {"1", "ON", "YES", "TRUE"}
