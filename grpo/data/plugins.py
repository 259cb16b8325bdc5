"""Loading user code named on the command line as "module:function" (rewards, dataset transforms).

The module part is a dotted module importable from the current directory or PYTHONPATH
("my_rewards:length_penalty", "pkg.rewards:score"), or a path to a .py file
("./rewards.py:score"). Errors are PluginError: one line naming the spec and what is wrong.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Callable

from grpo.config.cli import did_you_mean

__all__ = ["PluginError", "load_callable"]


class PluginError(ValueError):
    """A "module:function" spec that cannot be used; the message is one line with the fix."""


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _import_file(path: Path, flag: str) -> Any:
    name = f"_grpo_user_{path.stem}_{abs(hash(str(path.resolve()))) % 10**8}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise PluginError(f"{flag}: cannot import {str(path)!r} as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - any error in user code is the user's to fix
        del sys.modules[name]
        raise PluginError(f"{flag}: importing {str(path)!r} failed: {_one_line(exc)}") from exc
    return module


def load_callable(spec: str, flag: str) -> Callable[..., Any]:
    """The callable that `spec` ("module:function" or "path/file.py:function") names.

    `flag` (e.g. "--reward") starts every error message so the user knows which option to fix.
    """
    module_part, sep, attr = spec.strip().rpartition(":")
    if not sep or not module_part or not attr:
        raise PluginError(f"{flag}: {spec!r} is not of the form module:function "
                          "(e.g. my_rewards:length_penalty or ./my_rewards.py:length_penalty)")
    if module_part.endswith(".py") or os.sep in module_part:
        path = Path(module_part).expanduser()
        if not path.is_file():
            raise PluginError(f"{flag}: file {module_part!r} does not exist")
        module = _import_file(path, flag)
    else:
        # The launch directory is where users keep their reward files; python -m adds it too,
        # but worker entry scripts run from elsewhere do not.
        if os.getcwd() not in sys.path:
            sys.path.append(os.getcwd())
        try:
            module = importlib.import_module(module_part)
        except ModuleNotFoundError as exc:
            if exc.name and module_part.startswith(exc.name):
                raise PluginError(f"{flag}: no module named {module_part!r} (put {module_part}.py in "
                                  "the current directory or on PYTHONPATH)") from exc
            raise PluginError(f"{flag}: importing {module_part!r} failed: {_one_line(exc)}") from exc
        except Exception as exc:  # noqa: BLE001 - any error in user code is the user's to fix
            raise PluginError(f"{flag}: importing {module_part!r} failed: {_one_line(exc)}") from exc
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            # the nearest public callable where this part was looked up: a misspelt function's name
            names = [n for n in dir(target) if not n.startswith("_") and callable(getattr(target, n, None))]
            raise PluginError(f"{flag}: module {module_part!r} has no attribute {attr!r}"
                              f"{did_you_mean(part, names)}")
        target = getattr(target, part)
    if not callable(target):
        raise PluginError(f"{flag}: {spec!r} is a {type(target).__name__}, not a function")
    return target
