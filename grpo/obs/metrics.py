"""metrics.jsonl: one JSON object per learner step, then the final record (docs/operations.md, Run directory).

Line-buffered, so a crash loses no finished step; NaN and infinities become null so every
line parses with a strict JSON reader.
"""
from __future__ import annotations

import json
import math
from pathlib import Path


def _clean(value):
    """JSON-safe: NaN/inf become null so every line parses with a strict reader."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


class MetricsWriter:
    def __init__(self, run_dir: Path):
        self.path = run_dir / "metrics.jsonl"
        self._fh = open(self.path, "a", buffering=1)  # line-buffered: a crash loses no finished step

    def write(self, record: dict) -> None:
        self._fh.write(json.dumps(_clean(record)) + "\n")

    def close(self) -> None:
        self._fh.close()
