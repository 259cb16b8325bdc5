"""bench/device_bg.sh: a plan started in its own session outlives the call that started it; `wait`
returns when it ends (or at its bound), with its exit status, and packs what it wrote."""
import os
import subprocess
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "device_bg.sh"


def bg(*args, env, cwd=None):
    """The script run from `cwd` (the checkout `start` copies; default: an empty folder of its own)."""
    if cwd is None:
        cwd = Path(env["DEVICE_BG_DIR"]).parent / "checkout"
        cwd.mkdir(exist_ok=True)
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


def test_a_plan_runs_on_after_start_returns_and_wait_collects_it(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "DEVICE_BG_DIR": str(tmp_path / "bg"), "OUT": str(out)}
    plan = f"echo made > {tmp_path}/bg/out/result.txt; sleep 4; echo late >> {tmp_path}/bg/out/result.txt; exit 3"
    t0 = time.monotonic()
    started = bg("start", plan, env=env)
    assert started.returncode == 0 and time.monotonic() - t0 < 3       # start does not wait for the plan
    again = bg("start", "true", env=env)
    assert again.returncode == 2 and "still running" in again.stderr   # one plan at a time
    made = tmp_path / "bg" / "out" / "result.txt"
    deadline = time.monotonic() + 10
    while not made.exists() and time.monotonic() < deadline:   # the plan's first line, written at once
        time.sleep(0.05)
    early = bg("wait", "0", env=env)
    assert "still running after 0 s of waiting" in early.stdout
    done = bg("wait", "30", env=env)
    assert "the plan ended, exit 3" in done.stdout
    # each wait packs what is there so far, under the next free name
    with tarfile.open(out / "bg_0.tgz") as tar:
        assert tar.extractfile("out/result.txt").read().decode() == "made\n"
    with tarfile.open(out / "bg_1.tgz") as tar:
        assert tar.extractfile("out/result.txt").read().decode() == "made\nlate\n"
        assert "log" in tar.getnames()


def test_the_plan_reads_its_scripts_from_the_copy_start_took(tmp_path):
    # The device tool re-copies the checkout at every call: a plan reading a script from it while
    # that copy is under way found it missing. Removed and changed after `start`, the plan still
    # runs the script as it was, and chunk folders (carried one a call) are not copied.
    checkout, out = tmp_path / "checkout", tmp_path / "out"
    (checkout / "bench").mkdir(parents=True)
    (checkout / ".chunks" / "m" / "c00").mkdir(parents=True)
    (checkout / ".chunks" / "m" / "c00" / "part").write_bytes(b"x")
    (checkout / "bench" / "step.sh").write_text("echo first step\n")
    out.mkdir()
    env = {**os.environ, "DEVICE_BG_DIR": str(tmp_path / "bg"), "OUT": str(out), "SNAP": str(tmp_path / "none")}
    plan = "sleep 2; bash bench/step.sh; ls .chunks 2>&1 | head -1"   # (step.sh is removed within the 2 s)
    assert bg("start", plan, env=env, cwd=checkout).returncode == 0
    (checkout / "bench" / "step.sh").unlink()
    done = bg("wait", "30", env=env, cwd=checkout)
    assert "the plan ended, exit 0" in done.stdout
    log = (tmp_path / "bg" / "log").read_text().splitlines()
    assert log[0] == "first step" and "No such file" in log[1]


def test_start_without_a_plan_is_refused_in_one_line(tmp_path):
    env = {**os.environ, "DEVICE_BG_DIR": str(tmp_path / "bg")}
    r = bg("start", env=env)
    assert r.returncode == 2 and r.stderr.strip() == "device_bg: start needs the plan's command line"


def test_wait_packs_the_small_files_of_rows_still_running_without_their_weights(tmp_path):
    # benchmark.sh copies a row's files to out/ only once it is scored: a machine lost before then
    # must still leave the running rows' logs and metrics in the last pack a wait returned.
    out, work = tmp_path / "out", tmp_path / "rw"
    out.mkdir()
    (work / "row" / "weights" / "step_3").mkdir(parents=True)
    (work / "row" / "weights" / "step_3" / "model.safetensors").write_bytes(b"w" * 100)
    (work / "row" / "checkpoints").mkdir()
    (work / "row" / "checkpoints" / "state.pt").write_bytes(b"c")
    (work / "row" / "metrics.jsonl").write_text('{"step": 3}\n')
    (work / "row" / "big.bin").write_bytes(b"\0" * (21 << 20))
    env = {**os.environ, "DEVICE_BG_DIR": str(tmp_path / "bg"), "OUT": str(out), "SNAP": str(work)}
    assert bg("start", "sleep 30", env=env).returncode == 0
    try:
        r = bg("wait", "0", env=env)
        assert "still running" in r.stdout
        with tarfile.open(out / "bg_0.tgz") as tar:
            files = sorted(n for n in tar.getnames() if tar.getmember(n).isfile() and n.startswith("snap/"))
            assert files == ["snap/row/metrics.jsonl"]
            assert tar.extractfile("snap/row/metrics.jsonl").read() == b'{"step": 3}\n'
    finally:
        pid = (tmp_path / "bg" / "pid").read_text().strip()
        subprocess.run(["kill", "--", f"-{pid}"], capture_output=True)


def test_a_wait_cut_off_leaves_its_latest_pack(tmp_path):
    # The device tool returns what is under $OUT when it kills a call at its limit (the session's device
    # time spent): a wait packs again every PACK_EVERY seconds, so that pack is at most that old.
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "DEVICE_BG_DIR": str(tmp_path / "bg"), "OUT": str(out), "PACK_EVERY": "1",
           "SNAP": str(tmp_path / "none")}
    progress = tmp_path / "bg" / "out" / "progress.txt"
    plan = f"for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do echo $i >> {progress}; sleep 1; done"
    assert bg("start", plan, env=env).returncode == 0
    waiter = subprocess.Popen(["bash", str(SCRIPT), "wait", "60"], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        time.sleep(13)
        os.killpg(waiter.pid, 9)   # cut off, as the device tool cuts a call: no final pack
        waiter.wait(timeout=10)
        with tarfile.open(out / "bg_0.tgz") as tar:   # whole (packed aside, moved in): it opens
            seen = tar.extractfile("out/progress.txt").read().decode().split()
        assert 5 <= len(seen) <= 13 and seen == [str(i) for i in range(1, len(seen) + 1)]
        assert sorted(p.name for p in out.iterdir()) == ["bg_0.tgz"]   # one pack, replaced in place
    finally:
        pid = (tmp_path / "bg" / "pid").read_text().strip()
        subprocess.run(["kill", "--", f"-{pid}"], capture_output=True)
