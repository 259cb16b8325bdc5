"""Transport load benchmark (CPU, loopback): N sampler processes push real-sized groups to one receiver.

Every sampler process builds real-sized groups (G completions of --gen-tokens tokens after a
--prompt-tokens prompt, with text, rewards and both log-prob arrays) and sends them with the
real DataSender (protocol.encode + PUSH) as fast as the receiver takes them. The receiver is
the learner's DataReceiver (PULL, MAXMSGSIZE, decode + full validation with vocab and group
size limits). It reports groups/s, MB/s and the receive+decode+validate time, per message and
per learner step (--step-completions completions, 16 by default); the receiver's waiting time
(nothing arrived yet) is not counted. Writes bench/results/transport_load_<host>.json.

    python bench/transport_load.py                  # 8 samplers, G=8, 256 tokens, 20 s
    python bench/transport_load.py --seconds 30 --samplers 8
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import socket
import sys
import time
from pathlib import Path

import msgpack
import numpy as np
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from grpo.wire import codec
from grpo.wire import messages as M  # noqa: E402
from grpo.wire.ports import free_port  # noqa: E402
from grpo.wire.transport import DataReceiver, DataSender  # noqa: E402

VOCAB = 49152  # SmolLM2's vocabulary


def make_group(rng: np.random.Generator, sampler_id: int, i: int, G: int, prompt: int, gen: int) -> M.Group:
    prefix = rng.integers(0, VOCAB, prompt, dtype=np.int32)
    comps = []
    for _ in range(G):
        ids = rng.integers(0, VOCAB, gen, dtype=np.int32)
        comps.append(M.Completion(
            generated_token_ids=ids, old_policy_log_probs=-rng.random(gen, dtype=np.float32),
            ref_policy_log_probs=-rng.random(gen, dtype=np.float32), whole_token_ids=np.concatenate([prefix, ids]),
            text="x" * (gen * 4), reward=float(rng.integers(0, 2)), reward_info={"correct": 1.0, "format": 0.0},
            is_finished=bool(rng.integers(0, 2))))
    return M.Group(sampler_id=sampler_id, group_id=f"s{sampler_id}-g{i}", policy_version=0, prefix="q" * (prompt * 4),
                   prefix_tokens=[f"t{t}" for t in prefix.tolist()], prefix_token_ids=prefix, completions=comps,
                   meta={"answer": "42"})


def sampler(port: int, sid: int, args: argparse.Namespace, start: mp.Event, stop: mp.Event, out: mp.Queue) -> None:
    rng = np.random.default_rng(sid)
    groups = [make_group(rng, sid, i, args.G, args.prompt_tokens, args.gen_tokens) for i in range(4)]
    sender = DataSender("127.0.0.1", port, hwm=args.hwm)
    start.wait()
    n = 0
    encode_s = 0.0
    while not stop.is_set():
        g = groups[n % len(groups)]
        t0 = time.perf_counter()
        sent = sender.send(g, timeout_s=0.5)  # encode + hand to zmq (blocks at the HWM)
        encode_s += time.perf_counter() - t0
        n += sent
    sender.send(M.SamplerStatus(sid, 0, n, True, {}), timeout_s=10)
    sender.close(linger_s=10)
    out.put({"sampler_id": sid, "groups_sent": n, "bytes_sent": sender.bytes_sent, "send_s": encode_s})


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--samplers", type=int, default=8)
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=160)
    ap.add_argument("--gen-tokens", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--hwm", type=int, default=16)
    ap.add_argument("--step-completions", type=int, default=16)
    ap.add_argument("--learner-step-s", type=float, default=0.6, help="GPU learner step to compare with (README)")
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    port = free_port()
    receiver = DataReceiver("127.0.0.1", port, M.Limits(group_size=args.G, vocab_size=VOCAB), max_message_bytes=64 << 20)
    ctx = mp.get_context("spawn")
    start, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=sampler, args=(port, i, args, start, stop, out)) for i in range(args.samplers)]
    for p in procs:
        p.start()
    time.sleep(2.0)  # every sampler has built its groups and connected
    one = make_group(np.random.default_rng(0), 0, 0, args.G, args.prompt_tokens, args.gen_tokens)
    group_bytes = sum(memoryview(f).nbytes for f in codec.encode(one))

    sock = receiver.sock
    groups = 0
    busy = []  # receive + decode + validate time of each group
    start.set()
    t_start = time.perf_counter()
    t_end = t_start + args.seconds
    while time.perf_counter() < t_end:
        if not sock.poll(100):
            continue
        t0 = time.perf_counter()
        msg = receiver._decode(sock.recv_multipart(copy=False))
        busy.append(time.perf_counter() - t0)
        assert isinstance(msg, M.Group), (msg, dict(receiver.rejected))
        groups += 1
    elapsed = time.perf_counter() - t_start
    bytes_in = receiver.bytes
    stop.set()
    finals = 0
    drain_deadline = time.monotonic() + 60
    while finals < args.samplers and time.monotonic() < drain_deadline:
        msg = receiver.receive(timeout_s=1.0)
        finals += isinstance(msg, M.SamplerStatus)
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    receiver.close()

    # The same decode + validation alone, with no sender competing for the CPU: its own cost.
    frames = [bytes(memoryview(f)) for f in codec.encode(one)]
    for _ in range(20):
        codec.decode(frames, receiver.limits)
    t0, reps = time.perf_counter(), 300
    for _ in range(reps):
        codec.decode(frames, receiver.limits)
    alone = (time.perf_counter() - t0) / reps

    busy_a = np.array(busy)
    groups_per_step = args.step_completions / args.G
    per_step = float(busy_a.mean()) * groups_per_step
    rec = {
        "bench": "transport_load", "host": socket.gethostname(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "group_bytes": group_bytes,
        "groups_received": groups, "seconds": elapsed,
        "groups_per_s": groups / elapsed, "MB_per_s": bytes_in / elapsed / 1e6,
        "receiver_busy_fraction": float(busy_a.sum()) / elapsed,
        "receive_decode_validate_ms": {"per_group_mean": float(busy_a.mean()) * 1e3,
                                       "per_group_p50": float(np.percentile(busy_a, 50)) * 1e3,
                                       "per_group_p99": float(np.percentile(busy_a, 99)) * 1e3,
                                       "per_step_mean": per_step * 1e3},
        "per_step_vs_learner_step": per_step / args.learner_step_s,
        "decode_validate_alone_ms": {"per_group": alone * 1e3, "per_step": alone * groups_per_step * 1e3,
                                     "MB_per_s": group_bytes / alone / 1e6,
                                     "per_step_vs_learner_step": alone * groups_per_step / args.learner_step_s},
        "receiver_capacity_MB_per_s": group_bytes / float(busy_a.mean()) / 1e6,
        "rejected": dict(receiver.rejected),
        "samplers": sorted(results, key=lambda r: r["sampler_id"]),
        "machine": {"cpus": os.cpu_count(), "loadavg_after": os.getloadavg(), "platform": platform.platform(),
                    "processor": platform.processor()},
        "versions": {"python": platform.python_version(), "pyzmq": zmq.__version__, "libzmq": zmq.zmq_version(),
                     "numpy": np.__version__, "msgpack": ".".join(map(str, msgpack.version))},
    }
    path = Path(args.out) if args.out else (Path(__file__).parent / "results" / f"transport_load_{socket.gethostname()}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec, indent=2) + "\n")
    print(f"{groups} groups of {group_bytes / 1e3:.0f} kB in {elapsed:.1f} s from {args.samplers} samplers: "
          f"{rec['groups_per_s']:.0f} groups/s, {rec['MB_per_s']:.0f} MB/s; receive+decode+validate "
          f"{rec['receive_decode_validate_ms']['per_group_mean']:.3f} ms/group (p99 "
          f"{rec['receive_decode_validate_ms']['per_group_p99']:.3f}), {per_step * 1e3:.3f} ms per "
          f"{args.step_completions}-completion step = {100 * rec['per_step_vs_learner_step']:.2f}% of a "
          f"{args.learner_step_s} s learner step; receiver busy {100 * rec['receiver_busy_fraction']:.0f}%, "
          f"capacity {rec['receiver_capacity_MB_per_s']:.0f} MB/s; decode+validate alone {alone * 1e3:.3f} ms/group "
          f"({group_bytes / alone / 1e6:.0f} MB/s, {100 * alone * groups_per_step / args.learner_step_s:.2f}% of a step) "
          f"-> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
