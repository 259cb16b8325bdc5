"""The in-flight decode step taken apart: what one captured step of the ring (RolloutEngine.stream)
costs, and where the time goes. bench/rollout.py times whole workloads; this says why.

Usage (GPU machine, repo root):
    python bench/decode_step.py --model /tmp/gguf/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf [--rows 64,160,320,640]
                                [--width 256] [--new 512] [--compile]
Local smoke check:   python bench/decode_step.py --device cpu --model tiny-random --rows 4 --width 8 --new 8

Per rows count, on a ring of width + new cache slots (the sampler's: the longest prompt rounded up
to 64, plus max new tokens), each part captured as its own CUDA graph and replayed `--steps` times:

* step_ms: the ring's own captured step (what the sampler replays);
* forward_ms: the model's forward to the last logits, with the ring's mask and cache bookkeeping;
* body_ms: the same without the output layer (lm_head), so lm_head_ms = forward_ms - body_ms;
* sample_ms: sample_step on a [rows, vocab] logits buffer (temperature 1, Gumbel-max, log-prob);
* forward_ms_attend_<n>: the forward with attention reading only the first n slots (the rest is
  what attending every slot of the ring costs);
* sample_ms_fused: the fused Triton kernel (grpo.generate.fused_sampling) on the same buffer, where
  it runs; step_ms is the engine's step with it unless --no-fused-sampling;
* with --compile, sample_ms_compiled (sample_step through torch.compile, then captured) and
  step_ms_compiled (the engine's compile_decode=True, at the largest rows count only).

Then the kernels of the step at the middle rows count, from torch.profiler over eager steps (a
captured graph's kernels may be hidden from it): count per step, device ms per step, and the top
kernels, each put in a class (matmul, attention, rng, reduction, elementwise) by its name.
Writes bench/results/decode_step_<device>.json (or --name).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import capture, per_call_ms, pick, write_result  # noqa: E402

from grpo.generate.attention import layer_masks  # noqa: E402
from grpo.generate.engine import RolloutEngine  # noqa: E402
from grpo.generate.fused_sampling import fused_sample_step  # noqa: E402
from grpo.generate.sampling import sample_step  # noqa: E402
from grpo.model.load import compute_dtype, eos_ids, load_causal_lm, load_tokenizer  # noqa: E402
from grpo.model.zoo import resolve_model  # noqa: E402


def kernel_class(name: str) -> str:
    n = name.lower()
    if any(k in n for k in ("gemm", "cutlass", "nvjet", "sm90_xmma", "cublas", "matmul", "splitk")):
        return "matmul"
    if any(k in n for k in ("fmha", "flash", "attention", "attn", "cudnn")):
        return "attention"
    if any(k in n for k in ("exponential", "distribution", "philox", "uniform")):
        return "rng"
    if any(k in n for k in ("reduce", "argmax", "logsumexp", "softmax", "norm")):
        return "reduction"
    return "elementwise"


class Parts:
    """The pieces of RingStream.step, over one ring's buffers (grpo/generate/stream.py)."""

    def __init__(self, engine: RolloutEngine, ring):
        self.e, self.r = engine, ring
        self.logits = None

    def _advance(self):
        r = self.r
        for layer in r.cache.layers:           # as RingStream.step: wrap HF's write index with the ring's
            layer.cumulative_length.remainder_(r.length)
        r.t.add_(1).remainder_(r.length)
        r.pos.add_(1)

    def forward(self, body: bool = False, attend: int | None = None):
        r, e = self.r, self.e
        r.key_valid.index_fill_(1, r.t, True)
        distance = (r.t - r.key_index).remainder(r.length)
        valid = r.key_valid[:, :attend] if attend else r.key_valid
        mask = layer_masks(e.plan, e.dtype, valid.reshape(r.rows, 1, 1, -1), distance[:attend] if attend else distance)
        with e.passes():
            if body:
                out = e.model.model(input_ids=r.tok, position_ids=r.pos, attention_mask=mask, past_key_values=r.cache,
                                    use_cache=True).last_hidden_state
            else:
                out = e.model(input_ids=r.tok, position_ids=r.pos, attention_mask=mask, past_key_values=r.cache,
                              use_cache=True, logits_to_keep=1).logits[:, -1]
        self._advance()
        return out

    def sample(self):
        return sample_step(self.logits, self.r.inv_t, False, self.e.gen, self.r.finished, self.e.pad_id, self.e.eos)


def busy_ring(engine: RolloutEngine, rows: int, width: int, new: int):
    """The engine's ring for this shape, its step captured, with every row busy (not finished) and
    every slot a key: the most a step reads (a row's validity does not change the work)."""
    ring = engine.ring._ring(rows, width, new, 1.0, False)
    ring.key_valid.fill_(True)
    ring.finished.fill_(False)
    ring.col.zero_()
    ring.tok.random_(100, 10_000)
    return ring


@torch.no_grad()
def measure(engine: RolloutEngine, rows: int, width: int, new: int, steps: int, device, compile_parts: bool) -> dict:
    ring = busy_ring(engine, rows, width, new)
    graph = ring.graphs.get(False)
    step = graph.replay if graph is not None else (lambda: engine.ring.step(ring, False))
    rec = {"rows": rows, "cache_slots": ring.length, "step_ms": per_call_ms(step, steps, device)}
    p = Parts(engine, ring)
    rec["forward_ms"] = per_call_ms(capture(lambda: p.forward()), steps, device)
    rec["body_ms"] = per_call_ms(capture(lambda: p.forward(body=True)), steps, device)
    rec["lm_head_ms"] = rec["forward_ms"] - rec["body_ms"]
    for n in (128, ring.length // 2):
        rec[f"forward_ms_attend_{n}"] = per_call_ms(capture(lambda n=n: p.forward(attend=n)), steps, device)
    p.logits = torch.randn(rows, engine.model.config.vocab_size, device=device, dtype=engine.dtype) * 3
    rec["sample_ms"] = per_call_ms(capture(p.sample, engine.gen), steps, device)
    if engine.seed is not None:
        rec["sample_ms_fused"] = per_call_ms(capture(lambda: fused_sample_step(
            p.logits, ring.inv_t, False, engine.seed, ring.finished, engine.pad_id, engine.eos)), steps, device)
    if compile_parts:
        fused = torch.compile(lambda: sample_step(p.logits, ring.inv_t, False, engine.gen, ring.finished,
                                                  engine.pad_id, engine.eos), dynamic=False)
        t0 = time.perf_counter()
        fused()
        rec["sample_compile_s"] = time.perf_counter() - t0
        rec["sample_ms_compiled"] = per_call_ms(capture(fused, engine.gen), steps, device)
    rec["rest_ms"] = rec["step_ms"] - rec["forward_ms"] - rec["sample_ms_fused" if engine.ring.fused else "sample_ms"]
    rec["tok_s"] = rows / rec["step_ms"] * 1e3
    print({k: round(v, 3) if isinstance(v, float) else v for k, v in rec.items()}, flush=True)
    return rec


@torch.no_grad()
def kernels(engine: RolloutEngine, rows: int, width: int, new: int, device, n: int = 4) -> dict:
    """torch.profiler over n eager ring steps: kernels per step, device ms per step, the top ones."""
    from torch.profiler import ProfilerActivity, profile

    ring = busy_ring(engine, rows, width, new)
    for _ in range(2):
        engine.ring.step(ring, False)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    if device.type == "cuda":
        torch.cuda.synchronize()
    with profile(activities=acts) as prof:
        for _ in range(n):
            engine.ring.step(ring, False)
        if device.type == "cuda":
            torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA] \
        if device.type == "cuda" else []
    by_name: dict[str, list] = {}
    for e in events:
        t = by_name.setdefault(e.name, [0, 0.0])
        t[0] += 1
        t[1] += e.device_time / 1e3 if hasattr(e, "device_time") else e.cuda_time / 1e3
    classes: dict[str, float] = {}
    for name, (_, ms) in by_name.items():
        classes[kernel_class(name)] = classes.get(kernel_class(name), 0.0) + ms / n
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:25]
    out = {"rows": rows, "eager_steps": n, "kernels_per_step": len(events) / n,
           "kernel_ms_per_step": sum(ms for _, ms in by_name.values()) / n,
           "by_class_ms_per_step": {k: round(v, 4) for k, v in sorted(classes.items(), key=lambda kv: -kv[1])},
           "top": [{"kernel": name[:120], "class": kernel_class(name), "calls_per_step": c / n, "ms_per_step": ms / n}
                   for name, (c, ms) in top]}
    print(f"kernels at {rows} rows: {out['kernels_per_step']:.0f} a step, {out['kernel_ms_per_step']:.3f} ms of kernels; "
          f"by class {out['by_class_ms_per_step']}", flush=True)
    for t in out["top"][:15]:
        print(f"  {t['ms_per_step']:.4f} ms  x{t['calls_per_step']:.0f}  [{t['class']}] {t['kernel'][:90]}", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", help="auto, cuda or cpu")
    ap.add_argument("--model", default="smollm2", help="a GGUF file, folder, hub id, smollm2 or tiny-random")
    ap.add_argument("--rows", default="64,160,320,640", help="comma-separated rows counts (default 64,160,320,640)")
    ap.add_argument("--width", type=int, default=256, help="prompt slots of the ring (default 256)")
    ap.add_argument("--new", type=int, default=512, help="max new tokens, the ring's other slots (default 512)")
    ap.add_argument("--steps", type=int, default=200, help="replays per timing (default 200)")
    ap.add_argument("--compile", action="store_true",
                    help="also sample_step through torch.compile, and the engine's compile_decode step at the largest rows")
    ap.add_argument("--no-fused-sampling", action="store_true",
                    help="the engine's step samples with torch's ops (the sampler's --no-fused-sampling)")
    ap.add_argument("--no-liger-decode", action="store_true",
                    help="Hugging Face's layers in the engine's model, not Liger-Kernel's (the sampler's --no-liger-decode)")
    ap.add_argument("--name", default="decode_step", help="result file bench/results/<name>_<device>.json")
    args = ap.parse_args()
    try:
        rows_list = [int(x) for x in args.rows.split(",")]
        assert rows_list and min(rows_list) > 0
    except (ValueError, AssertionError):
        print(f"bench/decode_step.py: error: --rows {args.rows!r}: give positive integers, e.g. 64,320", file=sys.stderr)
        return 2
    device = pick(args.device)
    torch.manual_seed(0)
    path = resolve_model(args.model)
    tok = load_tokenizer(path)
    model = load_causal_lm(path, device, compute_dtype(device)).eval()
    cfg = model.config
    setup = {"model": args.model, "dtype": str(next(model.parameters()).dtype), "layers": cfg.num_hidden_layers,
             "hidden": cfg.hidden_size, "heads": cfg.num_attention_heads, "kv_heads": cfg.num_key_value_heads,
             "vocab": cfg.vocab_size, "width": args.width, "new": args.new, "steps": args.steps, "seed": 0}
    engine = RolloutEngine(model, eos_ids(tok, model), tok.pad_token_id, fused_sampling=not args.no_fused_sampling,
                           liger_layers=not args.no_liger_decode)
    setup["fused_sampling"], setup["liger_layers"] = engine.fused, engine.layers is not None
    print(setup, flush=True)
    rows = [measure(engine, r, args.width, args.new, args.steps, device, args.compile and r == max(rows_list))
            for r in rows_list]
    if len(rows) >= 2:   # least squares step_ms = fixed + per_row * rows
        xs, ys = [r["rows"] for r in rows], [r["step_ms"] for r in rows]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / max(1e-12, sum((x - mx) ** 2 for x in xs))
        fit = {"fixed_ms": my - slope * mx, "per_row_us": slope * 1e3}
    else:
        fit = None
    middle = sorted(rows_list)[len(rows_list) // 2]
    prof = kernels(engine, middle, args.width, args.new, device)
    compiled = None
    if args.compile and device.type == "cuda":
        engine.clear()
        compiled = compiled_step(model, tok, max(rows_list), args.width, args.new, args.steps, device)
    print("wrote", write_result(args.name, device, {"setup": setup, "rows": rows, "fit": fit, "kernels": prof,
                                                    "compiled_step": compiled}))
    return 0


@torch.no_grad()
def compiled_step(model, tok, rows: int, width: int, new: int, steps: int, device) -> dict:
    """The ring's step with compile_decode=True (torch.compile, then captured): its first build and its time."""
    ce = RolloutEngine(model, eos_ids(tok, model), tok.pad_token_id, compile_decode=True)
    t0 = time.perf_counter()
    ring = busy_ring(ce, rows, width, new)
    graph = ring.graphs.get(False)
    out = {"rows": rows, "compile_and_capture_s": time.perf_counter() - t0, "graph_failures": ce.graph_failure_reasons,
           "step_ms_compiled": per_call_ms(graph.replay, steps, device) if graph is not None else None}
    print(out, flush=True)
    return out


if __name__ == "__main__":
    sys.exit(main())
