"""Where a process writes: the run directory, its resolved config file, and the log format."""
from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import asdict, is_dataclass
from pathlib import Path


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"


def make_run_dir(run_dir: str) -> Path:
    path = Path(run_dir) if run_dir else Path("runs") / new_run_id()
    path.mkdir(parents=True, exist_ok=True)
    return path


def setup_logging(name: str, log_file: str = "") -> None:
    """Log lines to stderr (the launcher captures it per process) and optionally a file."""
    fmt = logging.Formatter(f"%(asctime)s {name} %(levelname)s %(message)s", "%H:%M:%S")
    root = logging.getLogger()
    root.handlers.clear()
    root.setLevel(logging.INFO)
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_file))
    for h in handlers:
        h.setFormatter(fmt)
        root.addHandler(h)
    for noisy in ("DeepSpeed", "deepspeed", "torch.distributed", "urllib3", "httpx", "datasets",
                  "transformers", "filelock", "huggingface_hub"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def save_config(run_dir: Path, name: str, cfg) -> None:
    data = asdict(cfg) if is_dataclass(cfg) else dict(cfg)
    (run_dir / f"config_{name}.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
