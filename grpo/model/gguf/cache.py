"""Which cache folder a GGUF file converts to, and the builder that converts it there.

The default model's folder has a fixed name (grpo.model.zoo); any other file's is named by the
file's size and content hash, so that the same bytes under another name or path reuse one folder
and a changed file gets one of its own. The hash is remembered per path, size and mtime (in the
cache's GGUF_DIGESTS), so that a large file is not read again at every start.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

from grpo.model.gguf.convert import convert_gguf
from grpo.model.load import cache_dir, locked, write_build_stamp

log = logging.getLogger(__name__)


def gguf_builder(gguf_path, label: str, chat_eos: bool = False, where: str | None = None, source: dict | None = None):
    """A builder (dest -> None) converting a GGUF file: gguf_path is a Path or a callable giving one."""
    def build(dest: Path) -> None:
        gguf = gguf_path() if callable(gguf_path) else gguf_path
        tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
        try:
            convert_gguf(gguf, tmp, label, chat_eos=chat_eos, where=where)
            write_build_stamp(tmp, source)
            tmp.rename(dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)   # gone already after the rename; half-written after a failure
    return build


GGUF_DIGESTS = "gguf-digests.json"


def gguf_digest(path: Path) -> str:
    """sha256 of the file's bytes, remembered in the cache's GGUF_DIGESTS by (real path, size, mtime_ns):
    a multi-GB file is read once, not at every start. One process hashes while others wait for it."""
    real = os.path.realpath(path)
    st = os.stat(real)
    key = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    index_path = cache_dir() / GGUF_DIGESTS
    with locked(cache_dir() / f"{GGUF_DIGESTS}.lock"):
        try:
            index = json.loads(index_path.read_text())
            if not isinstance(index, dict):
                index = {}
        except (OSError, ValueError):
            index = {}
        entry = index.get(real)
        if isinstance(entry, dict) and {k: entry.get(k) for k in key} == key and entry.get("sha256"):
            return entry["sha256"]
        log.info("hashing %s (%.2f GB; once per file version)", real, st.st_size / 1e9)
        with open(real, "rb") as fh:
            digest = hashlib.file_digest(fh, "sha256").hexdigest()
        # files gone or changed since are dropped, so the index stays as small as the set of files in use
        index = {p: e for p, e in index.items() if p != real and isinstance(e, dict) and os.path.isfile(p)
                 and os.path.getsize(p) == e.get("size")}
        index[real] = {**key, "sha256": digest}
        tmp = index_path.with_name(f"{GGUF_DIGESTS}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(index, indent=1) + "\n")
        tmp.replace(index_path)
    return digest


def gguf_folder_name(size: int, digest: str) -> str:
    """The cache folder of a GGUF file's conversion: its size and content hash, so that the same bytes
    under another name or path reuse it, and a changed file gets a folder of its own."""
    return f"gguf-{size}-{digest[:16]}"
