"""What one optimizer step costs the learner at a model's size: DeepSpeed's ZeRO-2 engine as the
learner builds it (deepspeed.json, autocast precision: float32 weights and AdamW state), and plain
torch.optim.AdamW as --no-deepspeed runs it, on one rank, gradients already in place; and with
--micro-batches, what a whole learner step's forward and backward cost through each engine (ZeRO-2
takes every gradient through its hooks).

Usage (GPU machine, repo root):
    python bench/optimizer_step.py --shape qwen2.5-1.5b [--micro-batches 5 --rows 20 --length 512]
Local smoke check:
    python bench/optimizer_step.py --device cpu --shape tiny --reps 2 --micro-batches 2 --rows 2 --length 8

The model is built from Qwen2.5's shapes (random weights: no files), then --reps optimizer steps
timed each way, each after a backward of 16 tokens through the engine (not timed; the device
synchronised around each step). With --micro-batches M, --reps learner steps each way as well: M
micro-batches of --rows x --length random tokens, each the learner's forward (bf16 autocast on CUDA,
the chunked log-probs of grpo.model.logprobs) and the engine's backward, then its step; the
forward and backward are timed together, the step apart. Writes
bench/results/optimizer_step_<shape>_<device>.json.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import pick, sync, write_result  # noqa: E402

from grpo.learner.engine import (DeepSpeedEngine, TorchEngine, init_process_group, load_ds_config,  # noqa: E402
                                 resolve_ds_config)
from grpo.wire.ports import free_port  # noqa: E402

# Qwen2.5's shapes (config.json of each): hidden, layers, intermediate, heads, kv heads, vocab
SHAPES = {"qwen2.5-0.5b": (896, 24, 4864, 14, 2, 151936), "qwen2.5-1.5b": (1536, 28, 8960, 12, 2, 151936),
          "tiny": (64, 2, 128, 4, 2, 1000)}


def build(shape: str, device: torch.device) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hidden, layers, inter, heads, kv, vocab = SHAPES[shape]
    cfg = Qwen2Config(hidden_size=hidden, num_hidden_layers=layers, intermediate_size=inter,
                      num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab, tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg).to(device=device, dtype=torch.float32)


def timed_steps(engine, model, reps: int, device: torch.device) -> list[float]:
    """reps optimizer steps, each after a backward of a small batch through the engine (left out of
    the time: ZeRO-2 takes gradients through its own hooks)."""
    out = []
    ids = torch.randint(3, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0)).to(device)
    for _ in range(reps + 1):   # the first is a warm-up (state allocation)
        engine.backward(model(input_ids=ids, use_cache=False).logits.float().mean())
        sync(device)
        t0 = time.perf_counter()
        engine.step()
        sync(device)
        out.append(time.perf_counter() - t0)
    return out[1:]


def timed_passes(engine, model, reps: int, micro: int, rows: int, length: int,
                 device: torch.device) -> tuple[list[float], list[float]]:
    """reps learner steps through the engine, after one untimed: (seconds of the micro
    forwards and backwards, seconds of the step), each between device synchronisations."""
    from grpo.model.logprobs import token_logprobs

    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(3, model.config.vocab_size, (rows, length), generator=gen).to(device)
               for _ in range(micro)]
    mask = torch.ones(rows, length, dtype=torch.long, device=device)
    passes, steps = [], []
    for _ in range(reps + 1):
        sync(device)
        t0 = time.perf_counter()
        for ids in batches:   # [rows, length]
            with amp:
                lp = token_logprobs(model, ids, mask, 1.0)   # [rows, length - 1]
            engine.backward(-lp.mean())
        sync(device)
        t1 = time.perf_counter()
        engine.step()
        sync(device)
        passes.append(t1 - t0)
        steps.append(time.perf_counter() - t1)
    return passes[1:], steps[1:]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--shape", default="qwen2.5-1.5b", choices=sorted(SHAPES))
    ap.add_argument("--device", default="auto")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--results-dir", default=None)
    ap.add_argument("--micro-batches", type=int, default=0,
                    help="also time learner steps of this many micro-batches through each engine (0: not)")
    ap.add_argument("--rows", type=int, default=20, help="rows of a micro-batch (with --micro-batches)")
    ap.add_argument("--length", type=int, default=512, help="tokens of each row (with --micro-batches)")
    args = ap.parse_args(argv)
    device = pick(args.device)
    cuda = device.type == "cuda"
    raw = load_ds_config("deepspeed.json")
    ds_cfg, _ = resolve_ds_config(raw, 1, 128, 16, 2e-6, cuda, precision="autocast" if cuda else "fp32",
                                  token_micro_batches=True)
    # seed 0: the weights and the optimizer-step batch; 1: the learner steps' tokens
    result = {"shape": args.shape, "seeds": [0, 1] if args.micro_batches else [0], "reps": args.reps}
    if args.micro_batches:
        result["step_shape"] = {"micro_batches": args.micro_batches, "rows": args.rows, "length": args.length,
                                "tokens": args.micro_batches * args.rows * args.length}

    torch.manual_seed(0)
    model = build(args.shape, device)
    result["parameters"] = sum(p.numel() for p in model.parameters())
    plain = TorchEngine(model, ds_cfg, device)
    result["torch_adamw_s"] = [round(x, 4) for x in timed_steps(plain, model, args.reps, device)]
    if args.micro_batches:
        passes, steps = timed_passes(plain, model, args.reps, args.micro_batches, args.rows, args.length, device)
        result["torch_forward_backward_s"] = [round(x, 4) for x in passes]
        result["torch_step_after_passes_s"] = [round(x, 4) for x in steps]
    del plain
    model.zero_grad(set_to_none=True)

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1",
                      LOCAL_RANK=str(device.index or 0))
    init_process_group(device, 600.0)
    ds = DeepSpeedEngine(model, ds_cfg)
    module = ds.module
    result["deepspeed_zero2_s"] = [round(x, 4) for x in timed_steps(ds, module, args.reps, device)]
    if args.micro_batches:
        passes, steps = timed_passes(ds, module, args.reps, args.micro_batches, args.rows, args.length, device)
        result["deepspeed_forward_backward_s"] = [round(x, 4) for x in passes]
        result["deepspeed_step_after_passes_s"] = [round(x, 4) for x in steps]
    for k in [k for k in list(result) if k.endswith("_s") and isinstance(result[k], list)]:
        result[k[:-2] + "_median_s"] = round(statistics.median(result[k]), 4)
    name = f"optimizer_step_{args.shape}" + (f"_passes{args.micro_batches}x{args.rows}x{args.length}"
                                             if args.micro_batches else "")
    out = write_result(name, device, result, results_dir=Path(args.results_dir) if args.results_dir else None)
    print(f"{args.shape} ({result['parameters'] / 1e9:.2f}B parameters): an optimizer step {result['torch_adamw_median_s']:.3f} s "
          f"with torch AdamW, {result['deepspeed_zero2_median_s']:.3f} s with DeepSpeed ZeRO-2; wrote {out}")
    if args.micro_batches:
        print(f"  a step of {result['step_shape']['tokens']} tokens: forward and backward "
              f"{result['torch_forward_backward_median_s']:.3f} s plain, {result['deepspeed_forward_backward_median_s']:.3f} s "
              f"through ZeRO-2; its step {result['torch_step_after_passes_median_s']:.3f} s / "
              f"{result['deepspeed_step_after_passes_median_s']:.3f} s")
    return result


if __name__ == "__main__":
    main()
