"""Code-execution reward: run the completion's Python with the dataset's tests in a sandbox.

The reward is the fraction of tests passed. The `tests` column holds either a list of
statements (usually asserts), each run on its own so one failure does not hide the rest, or
one test program (a string), which scores 1.0 when it runs to the end and 0.0 otherwise.

Each completion runs in its own process, started as
    unshare --net --pid --fork --kill-child -- python -I harness.py job.json
(with --map-root-user added when the trainer is not root). What is enforced:
- no network: a fresh network namespace without interfaces (only when `unshare` works; else the
  harness's socket guard, which refuses to create sockets from Python, plus no proxy variables);
- wall time: the process group is SIGKILLed after `timeout_s`; in a PID namespace every process
  the code forked dies with it (setsid cannot escape), without one the process group is killed;
- CPU time (RLIMIT_CPU), address space (RLIMIT_AS), file size (RLIMIT_FSIZE), no core dumps;
- process count (RLIMIT_NPROC) against fork bombs: as root the harness drops to the unprivileged
  user `nobody` first, because root ignores RLIMIT_NPROC; the limit counts all of that user's
  processes, so concurrent sandboxes share it;
- files: the cwd (and TMPDIR, HOME) is a fresh scratch folder, removed afterwards; as root the
  code runs as `nobody`, so it cannot delete or write the trainer's files. Without root there is
  no uid to drop to and file protection is only the scratch cwd: say so in your threat model.
Not a defence against reward hacking by a model that reads the harness (it shares the process).
"""
from __future__ import annotations

import functools
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["SandboxLimits", "code_reward", "extract_code", "run_tests", "sandbox_features"]

_FENCE_RE = re.compile(r"```[ \t]*(?P<lang>[\w+-]*)[^\n]*\n(?P<body>.*?)```", re.DOTALL)

HARNESS = r'''
import json, os, resource, sys
job = json.load(open(sys.argv[1]))
out = os.open(job["out"], os.O_WRONLY | os.O_APPEND)
nonce, main = job["nonce"], os.getpid()
def report(line):
    if os.getpid() == main:  # forked copies of this process must not add results
        os.write(out, ("%s %s\n" % (nonce, line)).encode())
mb = 1 << 20
for name, value in (("RLIMIT_AS", job["memory_mb"] * mb), ("RLIMIT_CPU", job["cpu_s"]),
                    ("RLIMIT_FSIZE", job["fsize_mb"] * mb), ("RLIMIT_NPROC", job["nproc"]),
                    ("RLIMIT_CORE", 0)):
    resource.setrlimit(getattr(resource, name), (value, value))
os.chdir(job["scratch"])
if job["uid"] is not None:
    # The interpreter may live under a folder nobody cannot enter (/root/.pyenv): keep each
    # import folder reachable through a read-only descriptor opened while still root.
    moved = {}
    for entry in sys.path:
        try:
            moved[entry] = "/proc/self/fd/%d" % os.open(entry, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            pass
    def _moved(path):
        for old, new in moved.items():
            if path == old or path.startswith(old + os.sep):
                return new + path[len(old):]
        return path
    sys.path[:] = list(moved.values())
    for module in list(sys.modules.values()):  # packages imported at startup, e.g. collections
        if isinstance(getattr(module, "__path__", None), list):
            module.__path__[:] = [_moved(p) for p in module.__path__]
    sys.path_importer_cache.clear()
    # Root ignores RLIMIT_NPROC and may delete any file: run the code as nobody.
    os.setgroups([])
    os.setgid(job["gid"])
    os.setuid(job["uid"])
import socket
class _NoNetwork(socket.socket):
    def __init__(self, *a, **k):
        raise PermissionError("network access is disabled in the code sandbox")
socket.socket = _NoNetwork
socket.create_connection = lambda *a, **k: _NoNetwork()
devnull = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(devnull, fd)
namespace = {"__name__": "__main__", "__builtins__": __builtins__}
try:
    exec(compile(job["code"], "solution.py", "exec"), namespace)
except BaseException:
    report("SOLUTION_ERROR")
    os._exit(0)
for i, test in enumerate(job["tests"]):
    try:
        exec(compile(test, "test_%d.py" % i, "exec"), namespace)
        report("PASS %d" % i)
    except BaseException:
        report("FAIL %d" % i)
report("DONE")
os._exit(0)
'''


@dataclass
class SandboxLimits:
    """Resource limits of one sandboxed run."""

    timeout_s: float = 5.0
    memory_mb: int = 1024
    nproc: int = 64
    fsize_mb: int = 16
    max_workers: int = 4

    @property
    def cpu_s(self) -> int:
        return int(self.timeout_s) + 1


@functools.lru_cache(maxsize=1)
def _unshare_prefix() -> tuple[str, ...] | None:
    """The unshare command that works here (network + PID namespaces), or None."""
    exe = shutil.which("unshare")
    if exe is None:
        return None
    cmd = [exe] + ([] if os.geteuid() == 0 else ["--map-root-user"])
    cmd += ["--net", "--pid", "--fork", "--kill-child", "--"]
    try:
        ok = subprocess.run(cmd + ["true"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return tuple(cmd) if ok else None


@functools.lru_cache(maxsize=1)
def _nobody() -> tuple[int, int] | None:
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return 65534, 65534


def sandbox_features() -> dict[str, bool]:
    """Which protections are in force on this machine (see the module docstring)."""
    ns = _unshare_prefix() is not None
    return {"network_namespace": ns, "pid_namespace": ns, "socket_guard": True,
            "runs_as_nobody": _nobody() is not None, "rlimits": True, "scratch_cwd": True}


def extract_code(completion: str) -> str | None:
    """The last ```python fenced block of a completion (else the last fenced block), or None."""
    blocks = list(_FENCE_RE.finditer(completion or ""))
    python = [b for b in blocks if b.group("lang").lower() in ("python", "py", "python3")]
    chosen = (python or blocks)[-1:] if blocks else []
    return chosen[0].group("body") if chosen else None


def _normalise_tests(tests: Any) -> tuple[list[str], bool] | None:
    """(statements, is_program) from a tests cell: a list of strings, a JSON list, or a program."""
    if isinstance(tests, str):
        text = tests.strip()
        if text.startswith("["):
            try:
                parsed = json.loads(text)
            except ValueError:
                parsed = None
            if isinstance(parsed, list):
                tests = parsed
        if isinstance(tests, str):
            return ([tests], True) if tests.strip() else None
    if isinstance(tests, (list, tuple)) and tests and all(isinstance(t, str) for t in tests):
        return list(tests), False
    return None


def run_tests(code: str, tests: Any, limits: SandboxLimits | None = None,
              tmp_root: str | None = None) -> float:
    """Fraction of `tests` that pass against `code`, run in a fresh sandboxed process."""
    limits = limits or SandboxLimits()
    normal = _normalise_tests(tests)
    if normal is None:
        raise ValueError(f"code reward: 'tests' must be a list of test strings or a test program, "
                         f"got {type(tests).__name__}")
    statements, is_program = normal
    base = Path(tempfile.mkdtemp(prefix="grpo-code-", dir=tmp_root))
    try:
        os.chmod(base, 0o711)  # nobody may enter its scratch folder, not list or write here
        scratch = base / "scratch"
        scratch.mkdir()
        who = _nobody()
        if who is not None:
            os.chown(scratch, *who)
        out = base / "results.txt"
        out.touch()
        nonce = secrets.token_hex(8)
        job = {"code": code, "tests": statements if not is_program else ["\n".join(statements)],
               "out": str(out), "nonce": nonce, "scratch": str(scratch),
               "memory_mb": limits.memory_mb, "cpu_s": limits.cpu_s, "fsize_mb": limits.fsize_mb,
               "nproc": limits.nproc, "uid": who[0] if who else None, "gid": who[1] if who else None}
        (base / "job.json").write_text(json.dumps(job))
        (base / "harness.py").write_text(HARNESS)
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(scratch), "TMPDIR": str(scratch),
               "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        argv = list(_unshare_prefix() or ()) + [sys.executable, "-I", str(base / "harness.py"),
                                                str(base / "job.json")]
        proc = subprocess.Popen(argv, env=env, cwd=str(scratch), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            proc.wait(timeout=limits.timeout_s)
        except subprocess.TimeoutExpired:
            pass
        finally:
            # Always kill the group: a finished harness leaves nothing, a running one loses all
            # its processes (and with a PID namespace, any that called setsid as well).
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        passed = set()
        for line in out.read_text(errors="replace").splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == nonce and parts[1] == "PASS":
                passed.add(parts[2])
        return len(passed) / (1 if is_program else len(statements))
    finally:
        shutil.rmtree(base, ignore_errors=True)


def code_reward(prompts: list[Any], completions: list[Any], tests: list[Any] | None = None,
                limits: SandboxLimits | None = None, **kwargs: Any) -> list[float]:
    """TRL-style reward: per completion, the fraction of its row's tests passed (0.0 without code).

    The tests come from the `tests` column (or MBPP's `test_list`).
    """
    if tests is None:
        tests = kwargs.get("test_list")
    if tests is None:
        raise ValueError("code reward: the dataset has no 'tests' column (list of asserts or a test program)")
    limits = limits or SandboxLimits()
    texts = [c[-1]["content"] if isinstance(c, list) else str(c) for c in completions]

    def one(i: int) -> float:
        code = extract_code(texts[i])
        return 0.0 if code is None else run_tests(code, tests[i], limits)

    with ThreadPoolExecutor(max_workers=max(1, limits.max_workers)) as pool:
        return list(pool.map(one, range(len(texts))))
