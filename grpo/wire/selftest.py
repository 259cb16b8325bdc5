"""communication_test.py: prove both channels work between two processes on this host.

No GPU, no model, no torch: the parent plays the learner (binds PULL on the data port and
ROUTER on the sync port), a child process plays a sampler (PUSH + DEALER), exactly as the
real workers do. Checks, each printed with its result:
  1. the sampler's groups arrive intact (every array and field compared by checksum),
  2. a malformed message is rejected with a counted reason and does not stop the receiver,
  3. weights requested on the sync port arrive intact (tcp method, bf16 + fp32 buckets),
  4. the sampler reports the version it applied, and stops when told to.
"""
from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np

from grpo.config import DATA_PORT, SYNC_PORT
from grpo.config.cli import ArgumentParser
from grpo.wire import codec
from grpo.wire import messages as M
from grpo.wire.transport import DataReceiver, DataSender, PortInUse, SyncClient, SyncServer, bind_each

G, N_GROUPS = 4, 8
WEIGHT_BYTES = 32 << 20
ROOT = Path(__file__).resolve().parents[2]   # the tree that holds the grpo package
# What the receiver logs for the one malformed message the sampler side sends on purpose (check 2).
EXPECTED_DROP = "dropped a bad data message (bad_header)"


class HeldLog(logging.Handler):
    """The receiver's log lines, held rather than written to stderr as they come: its warning for
    the malformed message sent on purpose read, after '5 passed', like a failure. The test prints it
    as expected beside check 2; any other line is a real warning, written to stderr at the end."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def make_group(i: int, sampler_id: int) -> M.Group:
    rng = np.random.default_rng(i)
    prefix = rng.integers(0, 1000, size=17, dtype=np.int32)
    comps = []
    for k in range(G):
        gen = rng.integers(0, 1000, size=5 + k, dtype=np.int32)
        comps.append(M.Completion(
            generated_token_ids=gen, old_policy_log_probs=-rng.random(len(gen), dtype=np.float32),
            ref_policy_log_probs=-rng.random(len(gen), dtype=np.float32),
            whole_token_ids=np.concatenate([prefix, gen]), text=f"completion {k} #### {k}",
            reward=float(k % 2), reward_info={"correct": float(k % 2)}, is_finished=bool(k % 2)))
    return M.Group(sampler_id=sampler_id, group_id=f"check-{i}", policy_version=0, prefix=f"prompt {i}",
                   prefix_tokens=[str(t) for t in prefix], prefix_token_ids=prefix, completions=comps, meta={})


def checksum(frames: list) -> int:
    crc = 0
    for f in frames:
        crc = zlib.crc32(memoryview(f).cast("B"), crc)
    return crc


def make_weights(version: int) -> M.WeightsAnnounce:
    rng = np.random.default_rng(version)
    a = rng.integers(0, 256, size=WEIGHT_BYTES // 2, dtype=np.uint8)   # a "bfloat16" bucket
    b = rng.integers(0, 256, size=WEIGHT_BYTES // 2, dtype=np.uint8)   # a "float32" bucket
    layout = [M.TensorSpec("embed.weight", "bfloat16", (len(a) // 2,), 0, 0),
              M.TensorSpec("head.weight", "float32", (len(b) // 4,), 1, 0)]
    return M.WeightsAnnounce(version=version, method="tcp", layout=layout, bucket_dtypes=["bfloat16", "float32"],
                             bucket_nbytes=[len(a), len(b)], buckets=[memoryview(a), memoryview(b)])


# ---------------------------------------------------------------------- the sampler side (child)
def child(host: str, data_port: int, sync_port: int) -> int:
    data = DataSender(host, data_port, hwm=64)
    sync = SyncClient(host, sync_port, M.weights_limits(WEIGHT_BYTES + (1 << 20)))
    for i in range(N_GROUPS):
        data.send(make_group(i, sampler_id=7), timeout_s=10)
    data.sock.send_multipart([b"\x93not a header", b"junk"])  # malformed on purpose
    version, crc = -1, 0
    while True:
        sync.send(M.WeightsRequest(sampler_id=7, have_version=version))
        msg = sync.receive(timeout_s=10)
        if msg is None:
            return 3
        if isinstance(msg, M.Stop):
            break
        if isinstance(msg, M.WeightsAnnounce):
            version, crc = msg.version, checksum(msg.buckets)
            data.send(M.SamplerStatus(sampler_id=7, policy_version=version, groups_sent=N_GROUPS, final=False,
                                      stats={"weights_crc": float(crc)}), timeout_s=10)
        time.sleep(0.01)
    data.send(M.SamplerStatus(sampler_id=7, policy_version=version, groups_sent=N_GROUPS, final=True,
                              stats={"weights_crc": float(crc)}), timeout_s=10)
    data.close()
    sync.close()
    return 0


# ---------------------------------------------------------------------- the learner side (parent)
def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="communication_test.py", description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1", help="address to bind and connect (default 127.0.0.1)")
    ap.add_argument("--data-port", type=int, default=DATA_PORT, help=f"data port (default {DATA_PORT})")
    ap.add_argument("--sync-port", type=int, default=SYNC_PORT, help=f"sync port (default {SYNC_PORT})")
    ap.add_argument("--role", default="learner", choices=["learner", "sampler"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.role == "sampler":
        return child(args.host, args.data_port, args.sync_port)


    try:   # both tried before either is refused, as the learner binds them: one line for every taken port
        data, sync = bind_each(
            lambda: DataReceiver(args.host, args.data_port, M.Limits(group_size=G), max_message_bytes=1 << 24),
            lambda: SyncServer(args.host, args.sync_port))
    except PortInUse as exc:
        print(f"communication_test.py: error: {exc}", file=sys.stderr)
        return 2
    held = HeldLog()
    receiver_log = logging.getLogger("grpo.wire.transport")
    receiver_log.addHandler(held)
    receiver_log.propagate = False
    try:
        return learner_side(args, data, sync, held)
    finally:
        receiver_log.removeHandler(held)
        receiver_log.propagate = True
        data.close()
        sync.close()


def learner_side(args: argparse.Namespace, data, sync, held: HeldLog) -> int:
    results: list[tuple[bool, str]] = []

    def check(ok: bool, what: str) -> None:
        results.append((ok, what))
        print(f"  [{'ok' if ok else 'FAIL'}] {what}", flush=True)

    print(f"learner side bound data {args.host}:{args.data_port} (PULL) and sync {args.host}:{args.sync_port} "
          f"(ROUTER); starting a sampler-side process, which sends {N_GROUPS} groups and then one malformed "
          f"message on purpose (the receiver must drop it and go on)", flush=True)
    # the package importable in the child wherever this was started from (`python path/to/communication_test.py`)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    proc = subprocess.Popen([sys.executable, "-m", "grpo.wire.selftest", "--role", "sampler", "--host", args.host,
                             "--data-port", str(args.data_port), "--sync-port", str(args.sync_port)], env=env)
    t0 = time.perf_counter()
    groups, statuses = [], []
    deadline = time.monotonic() + 30
    while len(groups) < N_GROUPS and time.monotonic() < deadline:
        msg = data.receive(timeout_s=0.5)
        if isinstance(msg, M.Group):
            groups.append(msg)
    t_data = time.perf_counter() - t0
    intact = [checksum(codec.encode(g)) == checksum(codec.encode(make_group(i, 7))) for i, g in enumerate(groups)]
    check(len(groups) == N_GROUPS and all(intact),
          f"data channel: {len(groups)}/{N_GROUPS} groups of {G} completions arrived intact in {t_data * 1e3:.1f} ms")

    weights = make_weights(version=3)
    want_crc = checksum(weights.buckets)
    served, t_sync = 0, time.perf_counter()
    final_status = None
    deadline = time.monotonic() + 30
    while final_status is None and time.monotonic() < deadline:
        got = sync.receive(timeout_s=0.05)
        if got is not None:
            identity, req = got
            done = any(s.policy_version == 3 for s in statuses)
            if done:
                sync.reply(identity, M.Stop(version=3, reason="communication test finished"))
            elif req.have_version < 3:
                served += sync.reply(identity, weights)
            else:
                sync.reply(identity, M.NoUpdate(version=3))
        msg = data.receive(timeout_s=0.01)
        if isinstance(msg, M.SamplerStatus):
            statuses.append(msg)
            if msg.final:
                final_status = msg
    t_sync = time.perf_counter() - t_sync
    got_crc = [s.stats.get("weights_crc") for s in statuses if s.policy_version == 3]
    check(data.rejected.get("bad_header", 0) == 1 and len(groups) == N_GROUPS,
          f"malformed message rejected and counted ({dict(data.rejected)}); the receiver kept going")
    for line in [x for x in held.lines if x.startswith(EXPECTED_DROP)]:
        print(f"       expected: {line}", flush=True)
    check(bool(got_crc) and got_crc[0] == float(want_crc),
          f"sync channel: {WEIGHT_BYTES >> 20} MiB of weights (bf16 + fp32 buckets) arrived intact "
          f"({served / 1e6:.1f} MB served, {t_sync * 1e3:.0f} ms round trip incl. stop)")
    check(final_status is not None and final_status.policy_version == 3,
          "sampler reported the version it applied (3) and stopped when told to")
    try:
        rc = proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = -9
    check(rc == 0, f"sampler-side process exited cleanly (exit code {rc})")
    for line in [x for x in held.lines if not x.startswith(EXPECTED_DROP)]:
        print(f"communication_test.py: warning: {line}", file=sys.stderr, flush=True)
    failed = sum(not ok for ok, _ in results)
    print(f"communication test: {len(results) - failed} passed, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
