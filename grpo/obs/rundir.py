"""Where a process writes: the run directory, its resolved config file, and the log format; and its
exit once all of that is written (freeze_for_exit)."""
from __future__ import annotations

import functools
import gc
import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import is_dataclass
from pathlib import Path

from grpo.config.sections import flat

ROOT = Path(__file__).resolve().parents[2]   # the tree that holds the grpo package
COMMIT_ENV = "GRPO_GIT_COMMIT"


def git_head(root: Path) -> tuple[str | None, bool | None]:
    """The commit of the git tree at `root` and whether tracked files differ from it; (None, None)
    without git or a .git (a copy carried to another machine). Reads only (no index refresh)."""
    def git(*a: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "--no-optional-locks", "-C", str(root), *a], capture_output=True,
                              text=True, timeout=10)
    try:
        head = git("rev-parse", "HEAD")
        if head.returncode:
            return None, None
        status = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.TimeoutExpired):
        return None, None
    return head.stdout.strip(), (bool(status.stdout.strip()) if status.returncode == 0 else None)


@functools.cache
def code_commit() -> str | None:
    """This code's commit: $GRPO_GIT_COMMIT where the tree has no .git (a copy carried to another
    machine, whose caller exports the commit it carried; the launcher exports it for its
    children, so git runs once a run), else git_head's of the tree holding this package, with
    "-dirty" when tracked files differ; None when neither says."""
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV]
    head, dirty = git_head(ROOT)
    return head and head + ("-dirty" if dirty else "")


def provenance() -> dict:
    """What made a file of the run: this process's command line and the code's commit."""
    return {"command": shlex.join([sys.executable, *sys.argv]), "commit": code_commit()}


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"


def make_run_dir(run_dir: str) -> Path:
    return create_run_dir(run_dir)[0]


def create_run_dir(run_dir: str) -> tuple[Path, Path | None]:
    """The run folder (made where it is not there), and the outermost folder this made: the run
    folder itself, or a parent that was not there either (runs/ on a first run); None when the run
    folder existed. A refused start removes them again (remove_created): it leaves nothing behind."""
    path = Path(run_dir) if run_dir else Path("runs") / new_run_id()
    top = None
    for folder in (path, *path.parents):
        if folder.exists():
            break
        top = folder
    path.mkdir(parents=True, exist_ok=True)
    return path, top


def remove_created(run_dir: Path, top: Path | None) -> None:
    """Undo create_run_dir: the run folder and all in it, then each parent up to `top` that is left
    empty (one that another run has put its own folder in meanwhile, runs/ say, is kept)."""
    if top is None:
        return

    run_dir, top = run_dir.resolve(), top.resolve()
    shutil.rmtree(run_dir, ignore_errors=True)
    for folder in run_dir.parents:
        if folder != top and top not in folder.parents:
            break   # above what this run made
        try:
            folder.rmdir()
        except OSError:
            break   # not empty: another run's


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
    # flat, as flags spell the fields: the run folders written before sections were nested read the same
    data = {**(flat(cfg) if is_dataclass(cfg) else dict(cfg)), **provenance()}
    (run_dir / f"config_{name}.json").write_text(json.dumps(data, indent=2, default=str) + "\n")


def freeze_for_exit() -> None:
    """Called last by a process whose output is written and closed (the workers, the evaluate
    command): frozen, the objects torch and transformers made are skipped by the interpreter's last
    collection at exit, which would otherwise walk them all only to free memory the OS takes back
    anyway: seconds on a busy CPU that the launcher (or whoever waits for this process) waits too."""
    gc.freeze()
