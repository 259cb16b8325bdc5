"""A one-minute GPU check of the fast rollout engine: does the decode step capture as a CUDA
graph (and if not, why), do greedy graph and eager decoding agree, and what does sampling
run at. Prints one JSON line per check and writes bench/results/engine_probe_<device>.json
(bench/rollout.py is the benchmark; this is the diagnosis).

  python bench/engine_probe.py [--model random:qwen2.5-3b|smollm2] [--rows 256] [--new 128] [--compile]
                               [--profile] [--name engine_probe]

--compile adds a sampling row with RolloutEngine(compile_decode=True): the decode step through
torch.compile (meant to fuse the many small elementwise kernels), then captured.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import write_result  # noqa: E402

from grpo.model import compute_dtype, left_pad, load_causal_lm, load_tokenizer, resolve_model  # noqa: E402
from grpo.generate.engine import RolloutEngine  # noqa: E402


@torch.no_grad()
def profile(model, tok, prompts, new: int) -> dict:
    """Top kernels of eager decode steps (a captured graph hides its kernels from the profiler)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    engine = RolloutEngine(model, [], tok.pad_token_id, cuda_graphs=False, buckets=(len(prompts),), prompt_multiple=64)
    engine.generate(prompts, 8, temperature=1.0)          # allocate the slot
    slot = next(iter(engine.slots.values()))
    ids, mask = left_pad(prompts, engine.pad_id, engine.device, width=slot.width, rows=slot.rows)
    engine._prefill(slot, ids, mask.bool(), 1.0, False)
    torch.cuda.synchronize()
    with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(4):
            engine._decode(slot, False)
        torch.cuda.synchronize()
    print(p.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=60))
    rows = [{"op": e.key[:80], "device_ms": getattr(e, "device_time_total", 0.0) / 1e3, "calls": e.count}
            for e in p.key_averages()]
    return {"eager_decode_steps": 4, "top_ops": sorted(rows, key=lambda r: -r["device_ms"])[:18]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="random:qwen2.5-3b")
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--profile", action="store_true", help="also print the top CUDA kernels of 4 eager decode steps")
    ap.add_argument("--compile", action="store_true", help="also measure sampling with compile_decode=True")
    ap.add_argument("--name", default="engine_probe", help="result file bench/results/<name>_<device>.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    device = torch.device("cuda", 0)
    path = resolve_model(args.model)
    tok = load_tokenizer(path)
    model = load_causal_lm(path, device, compute_dtype(device)).eval()
    setup = {"model": args.model, "dtype": str(next(model.parameters()).dtype),
             "attn": model.config._attn_implementation, "params": sum(p.numel() for p in model.parameters())}
    print(json.dumps(setup))
    checks = []
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 1000, (int(n),), generator=g).tolist()
               for n in torch.randint(40, 120, (args.rows,), generator=g)]
    torch.manual_seed(0)
    for greedy, compiled in ((True, False), (False, False)) + (((False, True),) if args.compile else ()):
        # no EOS: every row makes `new` tokens
        engine = RolloutEngine(model, [], tok.pad_token_id, compile_decode=compiled)
        first = engine.generate(prompts, args.new, greedy=greedy)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = engine.generate(prompts, args.new, greedy=greedy)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        rec = {"greedy": greedy, "compile_decode": compiled, "rows": args.rows, "new": args.new,
               "tok_s": round(out.stats["tokens"] / dt),
               "first_call_s": round(first.stats["gen_s"], 2), "cuda_graphs": out.stats["cuda_graphs"],
               "graph_failures": out.stats.get("graph_failures", [])}
        if greedy:
            eager = RolloutEngine(model, [], tok.pad_token_id, cuda_graphs=False, buckets=engine.buckets,
                                  prompt_multiple=engine.prompt_multiple)
            e = eager.generate(prompts[:64], 32, greedy=True)
            gr = engine.generate(prompts[:64], 32, greedy=True)
            rec["graph_equals_eager_64x32"] = e.token_ids == gr.token_ids
            eager.clear()
        print(json.dumps(rec), flush=True)
        checks.append(rec)
        engine.clear()
    prof = profile(model, tok, prompts, args.new) if args.profile else None
    torch.randn(4, device=device).sum().item()  # the default CUDA generator still usable
    print(json.dumps({"default_rng_ok": True}), flush=True)
    print("wrote", write_result(args.name, device, {"setup": setup, "checks": checks, "profile": prof}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
