"""The code-execution reward: scores from real sandboxed runs, and hostile code that must score 0
promptly without touching the trainer, its files or the network, leaving no process behind."""
import os
import socket
import time
from pathlib import Path

import pytest

from grpo.data.sandbox import SandboxLimits, code_reward, extract_code, run_tests, sandbox_features

LIMITS = SandboxLimits(timeout_s=3.0, memory_mb=512)
TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(5, 1) == 6", "assert add(7, 1) == 8"]
GOOD = "def add(a, b):\n    return a + b\n"
HALF = "def add(a, b):\n    return a + b if a < 5 else 0\n"  # passes the first two tests only


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}```\nDone."


def survivors(marker: str) -> list[int]:
    """Processes whose command line mentions `marker` (the per-test sandbox folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


@pytest.fixture
def sandbox_root(tmp_path):
    root = tmp_path / "sandboxes"
    root.mkdir()
    yield str(root)
    assert survivors(str(root)) == [], "a sandboxed process outlived its run"
    assert list(root.iterdir()) == [], "the scratch folder was not removed"


def test_extract_code():
    assert extract_code(fenced(GOOD)) == GOOD
    two = "```python\nx = 1\n```\ntext\n```py\nx = 2\n```"
    assert extract_code(two) == "x = 2\n"  # the last python block
    assert extract_code("```\nplain = 1\n```") == "plain = 1\n"  # any fence when none says python
    assert extract_code("def add(a, b): return a + b") is None


def test_correct_and_half_correct(sandbox_root):
    assert run_tests(GOOD, TESTS, LIMITS, tmp_root=sandbox_root) == 1.0
    assert run_tests(HALF, TESTS, LIMITS, tmp_root=sandbox_root) == 0.5
    # A test program (one string) is all or nothing.
    assert run_tests(GOOD, "assert add(1, 2) == 3\nassert add(0, 0) == 0", LIMITS, tmp_root=sandbox_root) == 1.0
    assert run_tests(GOOD, "assert add(1, 2) == 3\nassert add(0, 0) == 1", LIMITS, tmp_root=sandbox_root) == 0.0
    # Tests stored as JSON text (CSV / Parquet exports) are a list.
    assert run_tests(HALF, '["assert add(1, 1) == 2", "assert add(9, 1) == 10"]', LIMITS,
                     tmp_root=sandbox_root) == 0.5


def test_trl_convention_over_a_batch():
    completions = [fenced(GOOD), fenced(HALF), "no code at all", fenced("raise SystemExit(0)")]
    scores = code_reward(prompts=["p"] * 4, completions=completions, tests=[TESTS] * 4, limits=LIMITS)
    assert scores == [1.0, 0.5, 0.0, 0.0]


HOSTILE = {
    "infinite_loop": "while True:\n    pass\n",
    "fork_bomb": "import os\nwhile True:\n    os.fork()\n",
    "huge_allocation": "block = bytearray(64 * 2**30)\n",
    "sleep_then_setsid": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nwhile True:\n    pass\n",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_code_scores_zero_promptly(name, sandbox_root):
    code = HOSTILE[name] + GOOD  # would pass every test if it ever got past the attack
    start = time.monotonic()
    score = run_tests(code, TESTS, LIMITS, tmp_root=sandbox_root)
    elapsed = time.monotonic() - start
    assert score == 0.0
    assert elapsed < LIMITS.timeout_s + 20, f"{name} took {elapsed:.1f} s"
    # The trainer process is unharmed: it can still allocate and start a fresh sandbox.
    assert len(bytearray(16 << 20)) == 16 << 20
    assert run_tests(GOOD, TESTS[:1], LIMITS, tmp_root=sandbox_root) == 1.0


def test_cannot_delete_a_file_outside_its_scratch_dir(tmp_path, sandbox_root):
    if not sandbox_features()["runs_as_nobody"]:
        pytest.skip("file protection needs the trainer to run as root (the code then runs as nobody)")
    outside = tmp_path / "outside"
    outside.mkdir()
    sentinel = outside / "sentinel.txt"
    sentinel.write_text("keep me")
    code = f"import os\nos.remove({str(sentinel)!r})\n" + GOOD
    assert run_tests(code, TESTS, LIMITS, tmp_root=sandbox_root) == 0.0
    assert sentinel.read_text() == "keep me"
    # Writing its own scratch folder is allowed.
    own = "open('notes.txt', 'w').write('x')\n" + GOOD
    assert run_tests(own, TESTS, LIMITS, tmp_root=sandbox_root) == 1.0


def test_no_network(sandbox_root):
    if not sandbox_features()["network_namespace"]:
        pytest.skip("unshare cannot create a network namespace here; only the socket guard applies")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]
    try:
        # _socket is below the Python-level socket guard: only the namespace stops this one.
        code = f"import _socket\ns = _socket.socket()\ns.connect(('127.0.0.1', {port}))\n" + GOOD
        assert run_tests(code, TESTS, LIMITS, tmp_root=sandbox_root) == 0.0
        guarded = f"import socket\nsocket.create_connection(('127.0.0.1', {port}))\n" + GOOD
        assert run_tests(guarded, TESTS, LIMITS, tmp_root=sandbox_root) == 0.0
        # A completed connect would wait in the listen backlog: there must be none.
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()


def test_bad_tests_column():
    with pytest.raises(ValueError, match="tests"):
        run_tests(GOOD, 42, LIMITS)
    with pytest.raises(ValueError, match="no 'tests' column"):
        code_reward(prompts=["p"], completions=[fenced(GOOD)], limits=LIMITS)


def test_limits_apply_inside(sandbox_root):
    # The process sees the configured limits (so the hostile cases fail for the stated reason).
    probe = ("import resource\n"
             "AS = resource.getrlimit(resource.RLIMIT_AS)[0]\n"
             "NPROC = resource.getrlimit(resource.RLIMIT_NPROC)[0]\n"
             "FSIZE = resource.getrlimit(resource.RLIMIT_FSIZE)[0]\n")
    tests = [f"assert AS == {LIMITS.memory_mb << 20}", f"assert NPROC == {LIMITS.nproc}",
             f"assert FSIZE == {LIMITS.fsize_mb << 20}", "import os\nassert os.getcwd().endswith('scratch')"]
    assert run_tests(probe, tests, LIMITS, tmp_root=sandbox_root) == 1.0
    if sandbox_features()["runs_as_nobody"]:
        assert run_tests("import os\nUID = os.getuid()", ["assert UID != 0"], LIMITS, tmp_root=sandbox_root) == 1.0
    assert os.getuid() == os.geteuid()  # the trainer's own identity is untouched
