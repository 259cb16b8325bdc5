"""A learner group on two "nodes", started by DeepSpeed's own launcher without ssh, and a sampler
on a third: three network namespaces joined by a bridge, each namespace a machine with one address.

Node A runs learner rank 0 (it binds the data and sync ports on A's address and is the
rendezvous master), node B rank 1, which reaches A only over the bridge; node C's sampler
connects to A with --weight-sync tcp. The run dir is one directory every node sees, as the
shared filesystem of docs/operations.md's worked example. The test checks the books, that both
ranks end with the same weights, and that every process exits 0 within a bound.

The bridge sits in a fourth namespace, so the host's own namespace gets no interface or address.
Everything is named with the test's pid (parallel runs do not clash) and removed at teardown.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from faultutil import GSM8K, check_books

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
SUBNET = "10.77.0"   # exists only on the test's own bridge, so any subnet does
A, B, C = f"{SUBNET}.1", f"{SUBNET}.2", f"{SUBNET}.3"
# Fixed ports are safe: the namespaces are new and private, nothing else binds in them.
MASTER_PORT, DATA_PORT, SYNC_PORT = 29500, 5555, 5556
IP_TIMEOUT_S = 30
RUN_TIMEOUT_S = 300   # the whole run; it takes under a minute on 2 loaded cores


def _ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {(r.stderr or r.stdout).strip()}")


def _root_net() -> list[str]:
    """The root namespace's interface names and addresses, to show the test left them alone."""
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, timeout=IP_TIMEOUT_S).stdout
    addrs = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, timeout=IP_TIMEOUT_S).stdout
    return sorted([line.split(":")[1].strip() for line in links.splitlines()]
                  + [" ".join(line.split()[1:4]) for line in addrs.splitlines()])


class Net:
    """Namespaces {prefix}a, b, c (one host each, eth0 with A, B, C) and {prefix}br (the bridge)."""

    def __init__(self) -> None:
        self.prefix = f"grpomn{os.getpid()}"
        self.made: list[str] = []
        self.procs: list[subprocess.Popen] = []

    def ns(self, host: str) -> str:
        return f"{self.prefix}{host}"

    def setup(self) -> None:
        br = self.ns("br")
        try:
            _ip("netns", "add", br)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            pytest.skip(f"cannot make a network namespace: {str(exc).strip().splitlines()[-1]}")
        self.made.append(br)
        for name in (self.ns("a"), self.ns("b"), self.ns("c")):
            _ip("netns", "add", name)
            self.made.append(name)
        _ip("-n", br, "link", "add", "br0", "type", "bridge")
        _ip("-n", br, "link", "set", "br0", "up")
        for host, addr in (("a", A), ("b", B), ("c", C)):
            ns = self.ns(host)
            # The veth pair is made inside the bridge namespace and its far end moved straight
            # into the host's, so neither end ever appears in the root namespace.
            _ip("-n", br, "link", "add", f"v{host}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("-n", br, "link", "set", f"v{host}", "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def start(self, host: str, argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
        """argv in namespace `host`; its own session, so teardown can end it with its children."""
        with open(log, "w") as fh:
            p = subprocess.Popen(["ip", "netns", "exec", self.ns(host), *argv], cwd=ROOT, env=env,
                                 stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(p)
        return p

    def teardown(self) -> None:
        errors = []
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)   # the launcher, launch.py and the rank it started
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    errors.append(f"pid {p.pid} still alive 30 s after SIGKILL")
        for name in reversed(self.made):   # deleting a namespace deletes its veth ends and bridge
            try:
                _ip("netns", "del", name)
            except RuntimeError as exc:
                errors.append(str(exc))
        assert not errors, errors


@pytest.fixture
def net():
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if shutil.which("ip") is None:
        pytest.skip("network namespaces need iproute2's `ip`")
    before = _root_net()
    n = Net()
    try:
        n.setup()
        assert _root_net() == before, "the root namespace changed"
        yield n
    finally:
        n.teardown()
    assert _root_net() == before, "the root namespace changed"


def _tail(path: Path, lines: int = 40) -> str:
    if not path.exists():
        return f"--- {path.name}: missing"
    return f"--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@pytest.mark.slow
def test_two_node_deepspeed_learner_and_a_sampler_on_a_third_node(net, tmp_path):
    run_dir = tmp_path / "run"          # every node sees it: the shared filesystem
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(f"{A} slots=1\n{B} slots=1\n")
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               CUDA_VISIBLE_DEVICES="",
               # launch.py sets CUDA_VISIBLE_DEVICES to the node's slot ids ("0"), so on a host with
               # a GPU the ranks' DeepSpeed would pick its CUDA accelerator; --device cpu needs its CPU one.
               DS_ACCELERATOR="cpu",
               # gloo binds the address the hostname resolves to, which is the host's, not this
               # namespace's (it falls back to loopback, unreachable from the other node).
               GLOO_SOCKET_IFNAME="eth0")
    common = ["--device", "cpu", "--model", "tiny-random", "--dataset", str(GSM8K), "--num-generations", "4",
              "--max-new-tokens", "8", "--host", A, "--data-port", str(DATA_PORT), "--sync-port", str(SYNC_PORT),
              "--run-dir", str(run_dir), "--weight-sync", "tcp"]
    # The same command on each node, as without ssh one runs it by hand; `deepspeed` is this module's main.
    nodes = [net.start(host, [PY, "-m", "deepspeed.launcher.runner", "--hostfile", str(hostfile),
                              "--num_nodes", "2", "--num_gpus", "1", "--node_rank", str(k),
                              "--master_addr", A, "--master_port", str(MASTER_PORT), "--no_ssh", "--no_local_rank",
                              "training_worker.py", *common, "--max-steps", "3", "--train-batch-size", "8",
                              "--report-to", "none", "--dist-timeout-s", "120", "--shutdown-timeout-s", "60"],
                       tmp_path / f"node{k}.log", env)
             for k, host in enumerate("ab")]
    sampler = net.start("c", [PY, "sampling_worker.py", *common, "--sampler-id", "0", "--num-samplers", "1",
                              "--prompts-per-round", "2"], tmp_path / "sampler.log", env)
    names = {"node0": nodes[0], "node1": nodes[1], "sampler": sampler}

    def logs() -> str:
        return "\n".join(_tail(tmp_path / f"{n}.log") for n in names)

    t0 = time.monotonic()
    while any(p.poll() is None for p in names.values()):
        failed = {n: p.returncode for n, p in names.items() if p.returncode not in (None, 0)}
        assert not failed, f"exited with {failed} after {time.monotonic() - t0:.0f} s\n{logs()}"
        still = [n for n, p in names.items() if p.poll() is None]
        assert time.monotonic() - t0 < RUN_TIMEOUT_S, f"{still} still running after {RUN_TIMEOUT_S} s\n{logs()}"
        time.sleep(0.5)
    codes = {n: p.returncode for n, p in names.items()}
    assert codes == {"node0": 0, "node1": 0, "sampler": 0}, f"{codes}\n{logs()}"

    # Each node's launcher started one rank of a world of two, rank = node rank.
    for k in (0, 1):
        text = (tmp_path / f"node{k}.log").read_text(errors="replace")
        assert "dist_world_size=2" in text and f"node_rank={k}" in text, logs()
        assert f"learner{k} INFO" in text, logs()
    steps = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if not r.get("final")] == [1, 2, 3]
    summary = json.loads((run_dir / "summary.json").read_text())
    check_books(summary["groups"])
    assert summary["groups"]["trained"] == 3 * 2, summary["groups"]
    # ZeRO-2: every rank holds the full weights, updated alike; each rank's fingerprint, gathered by rank 0
    assert len(summary["rank_weight_checksums"]) == 2 and summary["ranks_identical"], summary
    assert summary["samplers"]["0"]["final"] and summary["samplers"]["0"]["version"] >= 1, summary["samplers"]
    out = (tmp_path / "sampler.log").read_text(errors="replace")
    assert "by tcp applied" in out and "learner says stop" in out, logs()
    # each rank wrote its own part of the final checkpoint into the shared run dir
    ckpt = run_dir / "checkpoints" / "step_3"
    for k in (0, 1):
        assert (ckpt / f"rng_rank{k}.json").exists(), sorted(ckpt.rglob("*"))
        assert (ckpt / "deepspeed" / "state" / f"zero_pp_rank_{k}_mp_rank_00_optim_states.pt").exists()
