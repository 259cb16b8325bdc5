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

sys.path.insert(0, str(Path(__file__).resolve().parent))

import freshenv  # noqa: E402  (the folder above on sys.path)

_OWNER = freshenv.isolate()


def pytest_unconfigure(config):
    if _OWNER:
        shutil.rmtree(os.environ[freshenv.SESSION_ENV], ignore_errors=True)

