"""Weight-sync benchmark: the real publishers and receivers, two processes, next to the raw floors.

Usage (2 GPUs, from the repo root; the learner on GPU 1, the sampler on GPU 0 as the launcher
places them):
  python bench/weight_sync.py                       # smollm2-135m and qwen2.5-3b shapes, tcp and ipc
  python bench/weight_sync.py --models tiny --syncs 3 --out /tmp/ws.json    # a quick check (1 GPU is enough)
  python bench/weight_sync.py --learner-layout zero2   # learner weights in one flat buffer, as under DeepSpeed

Models are random-initialised with the real shapes (nothing to download). For each model and
method the learner publishes `--syncs` versions, changing every weight between them as an
optimizer step would, and waits until the sampler runs each one. Reported per method (medians):
  stall_ms    learner host time inside publish(), i.e. from step end to the learner continuing
  copy_ms     GPU time of the learner-side snapshot copy (ipc), measured with CUDA events
  apply_ms    sampler time to apply a version (tcp: host-to-device copies; ipc: one peer copy)
  e2e_ms      from the start of publish() to the sampler running the version (one host clock)
Floors, same bytes, same run: raw peer copy learner GPU -> sampler GPU, raw copy within one
GPU, and a raw NCCL broadcast between the two processes. Every run ends with the sampler's
weights compared bit for bit with the learner's (weights_checksum).
Writes bench/results/weight_sync_<device>.json (or --out) and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

SHAPES = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1024),
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152),
}


def build(name: str, device):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    with device:
        if name == "qwen2.5-3b":
            from grpo.model.zoo import QWEN25_3B_SHAPES

            return Qwen2ForCausalLM(Qwen2Config(**QWEN25_3B_SHAPES)).to(torch.bfloat16)
        return LlamaForCausalLM(LlamaConfig(**SHAPES[name], tie_word_embeddings=True)).to(torch.bfloat16)


def flatten_like_zero2(model):
    """Re-point the parameters into one flat buffer, back to back in parameters() order: how
    DeepSpeed ZeRO-1/2 keeps the bf16 weights (stage_1_and_2.py, _update_model_bit16_weights),
    so the publishers see the layout they get in training (a plain model has one storage each)."""
    import torch

    params = list(model.parameters())
    flat = torch.empty(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
    off = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            flat[off:off + n].copy_(p.reshape(-1))
            p.data = flat[off:off + n].view(p.shape)
            off += n
    return flat


def _median_ms(xs):
    return statistics.median(xs) * 1e3 if xs else None


def learner(args) -> None:
    import torch

    from grpo.model.load import weights_checksum
    from grpo.weights.slots import SlotPublisher
    from grpo.weights.tcp import TcpPublisher
    from grpo.wire.transport import SyncServer

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    out = {}
    port = args.port
    for model_name in args.models.split(","):
        model = build(model_name, dev)
        if args.learner_layout == "zero2":
            flatten_like_zero2(model)
        params = [p for p in model.parameters()]
        total = sum(p.numel() * p.element_size() for p in params)
        for method in args.methods.split(","):
            server = SyncServer("127.0.0.1", port)
            if method == "shared":
                from grpo.weights.shared import SharedPublisher

                pub = SharedPublisher(server, model, port)
            elif method in ("ipc", "nccl"):
                pub = SlotPublisher(server, model, torch.bfloat16, method=method)
            else:
                pub = TcpPublisher(server, model, torch.bfloat16)
            stalls, starts, copies = [], {}, []
            for v in range(1, args.syncs + 1):
                with torch.no_grad():   # every weight changes, as after an optimizer step
                    torch._foreach_add_(params, 1e-3 if v % 2 else -1e-3)
                torch.cuda.synchronize()
                ev0 = torch.cuda.Event(enable_timing=True)
                ev0.record()
                starts[v] = time.time()
                with pub.guard():   # shared: the step's update and publish happen under the lock
                    t_pub = time.perf_counter()
                    pub.publish(v, model)
                    stalls.append(time.perf_counter() - t_pub + (pub.guard_waits_s[-1] if method == "shared" else 0.0))
                ev1 = torch.cuda.Event(enable_timing=True)
                ev1.record()
                ev1.synchronize()
                copies.append(ev0.elapsed_time(ev1) / 1e3)
                deadline = time.monotonic() + 120
                while pub.sampler_versions.get(0, -1) < v and time.monotonic() < deadline:
                    time.sleep(0.0002)
            pub.stop_samplers()
            time.sleep(1.0)   # the sampler's next request is answered with stop
            pub.close()
            out[f"{model_name}/{method}"] = {"bytes": total, "stall_s": stalls, "copy_s": copies, "starts": starts,
                                             "checksum": weights_checksum(model)}
            port += 1
        if "nccl" in args.floors:
            out[f"{model_name}/nccl_floor"] = _nccl(rank=0, nbytes=total, args=args, port=port)
            port += 1
        del model, params
        torch.cuda.empty_cache()
    Path(args.role_out).write_text(json.dumps(out))


def _nccl(rank: int, nbytes: int, args, port: int) -> list[float]:
    """Raw broadcast of nbytes from the learner to the sampler: a standalone NCCL group of two."""
    import torch
    import torch.distributed as dist

    try:
        store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=timedelta(seconds=120))
        pg = dist.ProcessGroupNCCL(store, rank, 2, dist.ProcessGroupNCCL.Options())
        buf = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
        flag = torch.zeros(1, device="cuda:0")
        times = []
        for i in range(args.syncs + 2):
            # (pg.barrier() would guess the device from the rank: cuda:1 here is the learner's GPU)
            pg.allreduce([flag]).wait()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            pg.broadcast(buf, 0).wait()
            torch.cuda.synchronize()
            if i >= 2:
                times.append(time.perf_counter() - t0)
        pg.allreduce([flag]).wait()
        return times
    except Exception as exc:  # noqa: BLE001 - a floor that fails is reported, the methods' results kept
        print(f"nccl floor failed: {type(exc).__name__}: {str(exc).splitlines()[0]}", file=sys.stderr)
        return []


def sampler(args) -> None:
    import torch

    from grpo.model.load import weights_checksum
    from grpo.weights.ipc import IpcReceiver
    from grpo.sync.client import request_weights
    from grpo.weights.tcp import apply_weights
    from grpo.wire import messages as M
    from grpo.wire.transport import SyncClient

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    peer = torch.device("cuda", 1) if torch.cuda.device_count() > 1 else dev
    out = {}
    port = args.port
    for model_name in args.models.split(","):
        model = build(model_name, dev)
        total = sum(p.numel() * p.element_size() for p in model.parameters())
        for method in args.methods.split(","):
            if method == "shared":
                from grpo.weights.shared import SharedReceiver

                rx = SharedReceiver(model, port)
            elif method == "nccl":
                from grpo.weights.nccl import NcclReceiver

                rx = NcclReceiver(model, torch.bfloat16)
            else:
                rx = IpcReceiver(model, torch.bfloat16) if method == "ipc" else None
            client = SyncClient("127.0.0.1", port, M.weights_limits(total + (64 << 20)))
            version, rid, applied, apply_s = 0, 0, {}, []
            while True:
                rid += 1
                answered, newest, stop = request_weights(client, 0, version, rid, 30.0, method)
                if stop is not None:
                    break
                if newest is None:
                    continue
                t0 = time.perf_counter()
                if rx is not None:
                    if not rx.apply(newest):
                        continue
                else:
                    apply_weights(model, newest)
                    torch.cuda.synchronize()
                apply_s.append(time.perf_counter() - t0)
                applied[newest.version] = time.time()
                version = newest.version
            client.close()
            if hasattr(rx, "close"):
                rx.close()
            out[f"{model_name}/{method}"] = {"apply_s": apply_s, "applied": applied,
                                             "checksum": weights_checksum(model), "version": version}
            port += 1
        floors = {}
        for name, (a, b) in {"raw_peer_copy": (peer, dev), "raw_copy_same_gpu": (dev, dev)}.items():
            src = torch.empty(total, dtype=torch.uint8, device=a)
            dst = torch.empty(total, dtype=torch.uint8, device=b)
            times = []
            for i in range(args.syncs + 2):
                torch.cuda.synchronize(a)
                torch.cuda.synchronize(b)
                t0 = time.perf_counter()
                dst.copy_(src)
                torch.cuda.synchronize(b)
                if i >= 2:
                    times.append(time.perf_counter() - t0)
            floors[name] = times
            del src, dst
        if "nccl" in args.floors:
            floors["raw_nccl_broadcast"] = _nccl(rank=1, nbytes=total, args=args, port=port)
            port += 1
        out[f"{model_name}/floors"] = floors
        del model
        torch.cuda.empty_cache()
    Path(args.role_out).write_text(json.dumps(out))


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2-135m,qwen2.5-3b")
    ap.add_argument("--methods", default="ipc,nccl,tcp", help="shared needs --same-gpu")
    ap.add_argument("--floors", default="nccl")
    ap.add_argument("--syncs", type=int, default=10)
    ap.add_argument("--port", type=int, default=47000)
    ap.add_argument("--out", default="")
    ap.add_argument("--same-gpu", action="store_true", help="learner and sampler both on GPU 0 (for shared)")
    ap.add_argument("--learner-layout", choices=("plain", "zero2"), default="plain",
                    help="zero2: the learner's weights are views of one flat buffer, as DeepSpeed ZeRO-2 leaves them")
    ap.add_argument("--role", default="")
    ap.add_argument("--role-out", default="")
    args = ap.parse_args()
    if args.role:
        (learner if args.role == "learner" else sampler)(args)
        return 0

    import torch
    from benchutil import versions

    n = torch.cuda.device_count()
    if n == 0:
        print("weight_sync.py needs CUDA GPUs (ipc and nccl are GPU methods)", file=sys.stderr)
        return 2
    learner_gpu, sampler_gpu = ("1", "0") if n > 1 and not args.same_gpu else ("0", "0")
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    procs = []
    for role, visible in (("learner", learner_gpu), ("sampler", ",".join(dict.fromkeys([sampler_gpu, learner_gpu])))):
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=visible, NCCL_NVLS_ENABLE="0", PYTHONUNBUFFERED="1")
        cmd = [sys.executable, __file__, "--role", role, "--role-out", str(tmp / f"ws_{role}.json"),
               "--models", args.models, "--methods", args.methods, "--floors", args.floors,
               "--syncs", str(args.syncs), "--port", str(args.port), "--learner-layout", args.learner_layout]
        procs.append(subprocess.Popen(cmd, env=env, cwd=ROOT))
    rcs = [p.wait(timeout=1800) for p in procs]
    if any(rcs):
        print(f"role exit codes {rcs}", file=sys.stderr)
        return 1
    lrn = json.loads((tmp / "ws_learner.json").read_text())
    smp = json.loads((tmp / "ws_sampler.json").read_text())
    results = {}
    print(f"\n{'model':14} {'method':22} {'MB':>8} {'stall ms':>9} {'copy ms':>8} {'apply ms':>9} {'e2e ms':>8} exact")
    for model_name in args.models.split(","):
        floors = {k: _median_ms(v) for k, v in smp[f"{model_name}/floors"].items() if v}
        if lrn.get(f"{model_name}/nccl_floor"):
            floors["raw_nccl_broadcast_root"] = _median_ms(lrn[f"{model_name}/nccl_floor"])
        entry = {"floors_ms": floors, "methods": {}}
        for method in args.methods.split(","):
            a, b = lrn[f"{model_name}/{method}"], smp[f"{model_name}/{method}"]
            e2e = [b["applied"][v] - a["starts"][v] for v in a["starts"] if v in b["applied"]]
            m = {"bytes": a["bytes"], "syncs": len(a["stall_s"]), "versions_applied": len(b["apply_s"]),
                 "stall_ms": _median_ms(a["stall_s"]), "copy_ms": _median_ms(a["copy_s"]),
                 "apply_ms": _median_ms(b["apply_s"]), "e2e_ms": _median_ms(e2e),
                 "bit_exact": a["checksum"] == b["checksum"], "final_version": b["version"]}
            entry["methods"][method] = m
            print(f"{model_name:14} {method:22} {m['bytes'] / 1e6:8.1f} {m['stall_ms']:9.3f} {m['copy_ms']:8.3f} "
                  f"{m['apply_ms']:9.3f} {m['e2e_ms']:8.3f} {m['bit_exact']}")
        for k, v in floors.items():
            print(f"{model_name:14} {k:22} {'':8} {'':9} {'':8} {v:9.3f}")
        results[model_name] = entry
    device = f"{n}x {torch.cuda.get_device_name(0)}"
    doc = {"device": device, "versions": versions(("zmq",)), "syncs": args.syncs, "learner_layout": args.learner_layout,
           "placement": {"learner_gpu": learner_gpu, "sampler_gpu": sampler_gpu}, "results": results}
    path = Path(args.out) if args.out else ROOT / "bench" / "results" / \
        f"weight_sync_{device.replace(' ', '_').replace('/', '_')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {path}")
    return 0 if all(m["bit_exact"] for r in results.values() for m in r["methods"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
