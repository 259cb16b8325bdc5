"""Generated problems kept on disk: a warm start reads a reasoning-gym split from a JSON file
instead of importing reasoning-gym and generating it again.

The import alone is most of a sampler's "problems" stage: 0.86 s on the 2-core CPU here and
about 1.1 s on an H100 machine (it brings sympy and, through cellpylib, matplotlib), on the path
to the first optimizer step. Tasks whose answers are numbers (letter_counting, basic_arithmetic,
gsm_symbolic...) are scored by the GSM8K rules (grpo.data.rewards), so a sampler that reads its
problems from here never imports reasoning-gym at all; other tasks import it for their scorer.

The key is everything a split depends on: the task spec, the split's size and seed, the
curriculum levels, reasoning-gym's version and this file's format. A split is written only when
it reads back exactly (tuples, common in reasoning-gym's metadata, are written tagged; an entry
holding a non-string key, a set or a NaN is not cached, and that split is generated every time),
so what is read is what was generated, value for value. A file is written whole under a temporary name and renamed, so concurrent
samplers never read half of one; one that cannot be read is generated again and rewritten.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FORMAT = 1   # bump when what a file holds changes: older files then miss


def cache_root() -> Path:
    """GRPO_CACHE (as grpo.model.cache_dir, without importing torch), else ~/.cache/grpo."""
    return Path(os.environ.get("GRPO_CACHE") or Path.home() / ".cache" / "grpo")


def split_key(spec: str, size: int, seed: int, levels: dict[str, int] | None) -> str | None:
    """The file name of one generated split, or None where there is no reasoning-gym
    distribution to name a version by (nothing is cached then)."""
    try:
        version = metadata.version("reasoning_gym")
    except metadata.PackageNotFoundError:
        return None
    ident = json.dumps({"format": FORMAT, "spec": spec, "size": size, "seed": seed,
                        "levels": None if levels is None else dict(sorted(levels.items())),
                        "reasoning_gym": version}, sort_keys=True)
    return f"rg-{hashlib.sha256(ident.encode()).hexdigest()[:24]}.json"


def read(key: str) -> list[dict[str, Any]] | None:
    """The rows written under `key`, or None (not there, or not readable)."""
    path = cache_root() / "problems" / key
    try:
        rows = _loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.info("problem cache %s unreadable (%s): generating the split again", path, exc)
        return None
    return rows if isinstance(rows, list) else None


def write(key: str, rows: list[dict[str, Any]]) -> bool:
    """Keep `rows` under `key` when JSON gives them back exactly; True if written."""
    try:
        text = json.dumps(_tagged(rows), allow_nan=False)
    except (TypeError, ValueError):   # a value JSON has no form for (a set, an object, a NaN)
        return False
    if _loads(text) != rows:          # a non-string key, say: JSON would give back another value
        return False
    folder, tmp = cache_root() / "problems", None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, folder / key)
    except OSError as exc:   # a read-only home, a full disk: the run goes on, uncached
        log.info("problem cache not written under %s (%s)", folder, exc)
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        return False
    return True


# reasoning-gym's entries keep tuples in their metadata (letter_counting's difficulty: {"words": (5, 15)}),
# which JSON alone would give back as lists: they are written tagged and read back as tuples.
_TUPLE = "__tuple__"


def _tagged(value: Any) -> Any:
    if isinstance(value, tuple):
        return {_TUPLE: [_tagged(v) for v in value]}
    if isinstance(value, list):
        return [_tagged(v) for v in value]
    if isinstance(value, dict):
        return {k: _tagged(v) for k, v in value.items()}
    return value


def _loads(text: str) -> Any:
    return json.loads(text, object_hook=lambda d: tuple(d[_TUPLE]) if len(d) == 1 and _TUPLE in d else d)
