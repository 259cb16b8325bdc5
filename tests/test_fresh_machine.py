"""The suite runs as on a fresh machine (tests/freshenv.py, which tests/conftest.py applies): every
place a library of ours would read a cached model, GGUF, dataset or build from is inside this
session's own folder, in this process and in the processes tests start, and nothing in that folder
is older than the session: a file left on this machine by an earlier run cannot stand in for one the
repository, ../shared or a test makes."""
import json
import os
import pwd
import subprocess
import sys
import tempfile
from pathlib import Path

from benchload import load_bench
from freshenv import SESSION_ENV, SESSION_START_ENV, session_caches

ROOT = Path(__file__).resolve().parents[1]

# Each library's cache folders as that library computes them, in a process of its own (a test's
# subprocess inherits the environment; the libraries read it at import).
PROBE = r"""
import json, os, sys
from pathlib import Path
sys.path.insert(0, "bench")
import datasets.config, huggingface_hub.constants as hub, matplotlib, torch.hub
import torch.utils.cpp_extension as ext
from torch._inductor.runtime.cache_dir_utils import cache_dir as inductor_dir
from fetch_models import default_dest
from grpo.model.load import cache_dir
print(json.dumps({
    "home": str(Path.home()), "expanduser": os.path.expanduser("~"), "grpo cache": str(cache_dir()),
    "benchmark gguf": str(default_dest()), "hub": hub.HF_HUB_CACHE, "hub offline": hub.HF_HUB_OFFLINE,
    "datasets": datasets.config.HF_DATASETS_CACHE, "torch hub": torch.hub.get_dir(),
    "torch extensions": ext.get_default_build_root(), "inductor": inductor_dir(),
    "matplotlib cache": matplotlib.get_cachedir(), "matplotlib config": matplotlib.get_configdir()}, default=str))
"""


def session() -> Path:
    assert os.environ.get(SESSION_ENV), f"tests/conftest.py did not set {SESSION_ENV}: the caches are the machine's"
    return Path(os.environ[SESSION_ENV]).resolve()


def test_every_cache_is_the_sessions_own_in_this_process_and_its_children():
    s = session()
    real_home = Path(pwd.getpwuid(os.getuid()).pw_dir).resolve()
    assert s.parent == Path(tempfile.gettempdir()).resolve() and s.name.startswith("grpo-tests-")
    assert not s.is_relative_to(real_home) and not real_home.is_relative_to(s)
    for var, folder in session_caches(s).items():
        assert os.environ[var] == folder and Path(folder).is_dir(), var
    for var in ("GRPO_GGUF_PATH", "GRPO_GGUF_DIR"):   # a developer's own GGUF files are not looked up
        assert var not in os.environ, var
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    where = json.loads(out.stdout.strip().splitlines()[-1])
    assert where.pop("hub offline") is True       # with empty caches, a test that fetched would need the network
    outside = {k: v for k, v in where.items() if not Path(v).resolve().is_relative_to(s)}
    assert not outside, f"caches outside the session's folder {s}: {outside}"
    assert Path(where["home"]).resolve() != real_home


def test_the_sessions_folder_holds_only_what_this_session_made():
    """No file older than the session, and no link out of it: so the default model's converted folder
    (made once in it by the first test that needs it) and anything else cached came from this run."""
    s = session()
    start = float(os.environ[SESSION_START_ENV])
    old, links = [], []
    for dirpath, dirnames, filenames in os.walk(s):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            try:
                st = p.lstat()
            except FileNotFoundError:      # a test's process removed it meanwhile
                continue
            if p.is_symlink() and not p.resolve().is_relative_to(s):
                links.append(str(p))
            elif st.st_mtime < start - 1:
                old.append(str(p))
    assert not old and not links, f"older than the session: {old[:5]}; links out of it: {links[:5]}"


def test_the_benchmark_finds_no_qwen_gguf_of_this_machine(monkeypatch, tmp_path):
    """bench/benchmark.py's 0.5b row: with only the session's folders to look in (its receive folder,
    /tmp/gguf, made the test's own), the GGUF is not found, however often this machine fetched it."""
    rw = load_bench("benchmark")
    monkeypatch.setattr(rw.fetch, "RECEIVE_DIR", tmp_path)
    try:
        found = rw.model_path("0.5b")
    except SystemExit as e:
        assert "is in none of" in str(e)
    else:
        raise AssertionError(f"the 0.5B GGUF was found at {found}")
