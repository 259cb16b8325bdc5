"""The decode step's attention alone: grpo.generate.decode_attention's Triton kernel against SDPA as
rollout_attention calls it (the G query heads of a KV head as G query rows, the engine's additive
mask), at Qwen2.5's head shapes, on a ring's cache, each captured in a CUDA graph as the engine
replays it.

Usage (GPU machine, repo root; torch and Triton only, no model file):
    python bench/decode_attention.py [--rows 64,160,320,640] [--slots 768] [--sizes 0.5b,1.5b,3b,7b]
Local smoke check:   TRITON_INTERPRET=1 python bench/decode_attention.py --device cpu --rows 2 --slots 70 --sizes 0.5b

Per size and rows count: one layer's call, per_call_us for each (the mean of `--calls` calls in a
graph, replayed `--replays` times; on CPU, eager), gb_per_s (the keys and values each call reads
over its time: the memory-bound rate), and max_abs_err of each against a float32 SDPA. Each row
has a random share of its slots masked out at the front, as a left-padded ring's rows do.
Writes bench/results/decode_attention_<device>.json (or --name).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import capture, per_call_ms, pick, table, write_result  # noqa: E402

from grpo.generate.decode_attention import decode_attention  # noqa: E402
from grpo.model.zoo import QWEN25_SHAPES  # noqa: E402


def sdpa(q, key, value, mask, scale):   # rollout_attention's GQA decode path without the kernel
    return torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=scale)


def per_call_us(fn, device: torch.device, calls: int, replays: int) -> float:
    """One call's time: `calls` calls captured in one graph (so a replay's own launch is spread over
    them), the graph replayed `replays` times (on CPU, eager)."""
    many = capture(lambda: [fn() for _ in range(calls)])
    return per_call_ms(many, replays, device) * 1e3 / calls


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", help="auto, cuda or cpu")
    ap.add_argument("--rows", default="64,160,320,640", help="comma-separated rows counts")
    ap.add_argument("--slots", type=int, default=768, help="cache slots each call reads (the ring's length)")
    ap.add_argument("--sizes", default="0.5b,1.5b,3b,7b", help=f"Qwen2.5 head shapes, of {','.join(QWEN25_SHAPES)}")
    ap.add_argument("--calls", type=int, default=20, help="calls captured in one graph")
    ap.add_argument("--replays", type=int, default=20, help="graph replays timed")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="decode_attention", help="result file bench/results/<name>_<device>.json")
    ap.add_argument("--out-dir", type=Path, default=None, help="folder for the result (default bench/results)")
    args = ap.parse_args(argv)
    device = pick(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(args.seed)
    records = []
    for size in args.sizes.split(","):
        shape = QWEN25_SHAPES[size]
        heads, kv_heads = shape["num_attention_heads"], shape["num_key_value_heads"]
        dim = shape["hidden_size"] // heads
        for rows in (int(r) for r in args.rows.split(",")):
            n = args.slots
            q = torch.randn(rows, kv_heads, heads // kv_heads, dim, device=device, dtype=dtype)
            key, value = (torch.randn(rows, kv_heads, n, dim, device=device, dtype=dtype) for _ in range(2))
            pad = torch.randint(0, n // 2, (rows, 1), device=device)
            allowed = torch.arange(n, device=device)[None, :] >= pad                        # [rows, n]
            mask = torch.where(allowed, 0.0, torch.finfo(dtype).min).to(dtype).view(rows, 1, 1, n)
            scale = dim ** -0.5
            want = sdpa(q.float(), key.float(), value.float(), mask.float(), scale)
            rec = {"size": size, "rows": rows, "slots": n, "heads": heads, "kv_heads": kv_heads, "head_dim": dim}
            moved = 2 * key.numel() * key.element_size()                                   # keys and values read
            for name, fn in (("sdpa", lambda: sdpa(q, key, value, mask, scale)),
                             ("kernel", lambda: decode_attention(q, key, value, mask, scale))):
                rec[f"{name}_max_abs_err"] = round((fn().float() - want).abs().max().item(), 5)
                us = per_call_us(fn, device, args.calls, args.replays)
                rec[f"{name}_us"] = round(us, 2)
                rec[f"{name}_gb_per_s"] = round(moved / us / 1e3, 1)
            rec["speedup"] = round(rec["sdpa_us"] / rec["kernel_us"], 3)
            records.append(rec)
            print(table([rec], ["size", "rows", "sdpa_us", "kernel_us", "speedup", "sdpa_gb_per_s", "kernel_gb_per_s",
                                "sdpa_max_abs_err", "kernel_max_abs_err"]), flush=True)
    path = write_result(args.name, device, {"seed": args.seed, "dtype": str(dtype).replace("torch.", ""),
                                            "calls": args.calls, "replays": args.replays, "records": records},
                        extra_versions=("triton",), results_dir=args.out_dir)
    print("wrote", path)


if __name__ == "__main__":
    main()
