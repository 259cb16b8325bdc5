"""Real learner and sampler processes for the fault-injection tests (CPU, tiny-random model).

Each process writes its log to RUN/<name>.log; the helpers wait on log lines and on
metrics.jsonl with generous timeouts (the test machine may be heavily loaded), and every
process started is killed at the end, whatever happened.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from netutil import free_ports

ROOT = Path(__file__).resolve().parents[1]
GSM8K = ROOT.parent / "shared" / "data" / "gsm8k"
PY = sys.executable
WAIT_S = 240.0  # a process start (torch + transformers imports) can take a minute on a busy machine


def alive(pid: int) -> bool:
    """Whether process `pid` still exists (a zombie counts until its parent reaps it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def finish(proc: subprocess.Popen, timeout: float = 120) -> str:
    """A launcher's output (the file start() gave it, proc.out_path), once it has exited (killed if
    it has not within `timeout`)."""
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.out_path.read_text()


class Cluster:
    def __init__(self, tmp_path: Path, num_samplers: int, common: list[str]):
        self.run_dir = tmp_path / "run"
        self.run_dir.mkdir(parents=True)
        self.data_port, self.sync_port = free_ports(2)
        self.num_samplers = num_samplers
        self.common = ["--device", "cpu", "--model", "tiny-random", "--data-port", str(self.data_port),
                       "--sync-port", str(self.sync_port), "--run-dir", str(self.run_dir), *common]
        self.procs: dict[str, subprocess.Popen] = {}
        self._restarts: dict[str, int] = {}

    # ------------------------------------------------------------------ processes
    def _start(self, name: str, args: list[str]) -> subprocess.Popen:
        n = self._restarts.get(name, -1) + 1
        self._restarts[name] = n
        log = self.run_dir / (f"{name}.log" if n == 0 else f"{name}.{n}.log")
        env = dict(os.environ, PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
        with open(log, "w") as fh:
            p = subprocess.Popen([PY, *args], cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT)
        p.log_path = log  # type: ignore[attr-defined]
        self.procs[name] = p
        return p

    def learner(self, *extra: str) -> subprocess.Popen:
        return self._start("learner", ["training_worker.py", *self.common, "--no-deepspeed", *extra])

    def sampler(self, sid: int, *extra: str) -> subprocess.Popen:
        return self._start(f"sampler{sid}", ["sampling_worker.py", *self.common, "--dataset", str(GSM8K),
                                             "--sampler-id", str(sid), "--num-samplers", str(self.num_samplers),
                                             *extra])

    def signal(self, name: str, sig: int) -> None:
        self.procs[name].send_signal(sig)

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
                p.wait(timeout=30)

    # ------------------------------------------------------------------ observations
    def log(self, name: str) -> str:
        return Path(self.procs[name].log_path).read_text(errors="replace")  # type: ignore[attr-defined]

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-25:])
                         for p in sorted(self.run_dir.glob("*.log")))

    def steps(self) -> list[dict]:
        path = self.run_dir / "metrics.jsonl"
        if not path.exists():
            return []
        rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        return [r for r in rows if not r.get("final")]

    def summary(self) -> dict:
        return json.loads((self.run_dir / "summary.json").read_text())

    def wait(self, what: str, cond, timeout: float = WAIT_S, alive: tuple[str, ...] = ("learner",)):
        """Poll cond() until true; fail early with the logs if a process that must live has exited."""
        deadline = time.monotonic() + timeout
        while True:
            got = cond()
            if got:
                return got
            for name in alive:
                p = self.procs.get(name)
                assert p is None or p.poll() is None, f"{name} exited ({p.returncode}) waiting for {what}\n{self.logs()}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}\n{self.logs()}"
            time.sleep(0.2)

    def count(self, name: str, pattern: str) -> int:
        return len(re.findall(pattern, self.log(name)))

    def wait_log(self, name: str, pattern: str, count: int = 1, **kw) -> None:
        self.wait(f"{count}x {pattern!r} in {name}", lambda: self.count(name, pattern) >= count, **kw)


def peak_rss_kb(pid: int) -> int:
    """The process's peak resident set size so far (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def check_books(acc: dict) -> None:
    """The identity every fault test must keep: sent = trained + dropped (by reason) + queued."""
    assert acc["sent"] == acc["trained"] + sum(acc["dropped"].values()) + acc["queued"], acc
    assert acc["balanced"] is True, acc
    # What this learner (and a checkpoint it resumed from) received valid is trained, dropped by
    # the learner, or still queued; the other reasons count groups no living learner received,
    # or received malformed ("rejected").
    learner_drops = {k: v for k, v in acc["dropped"].items()
                     if not k.startswith(("sampler_", "lost_in_flight", "lost_with_learner", "rejected"))}
    assert acc["received"] == acc["trained"] + sum(learner_drops.values()) + acc["queued"], acc
