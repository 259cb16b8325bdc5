"""Learner throughput and MFU: forward + backward + AdamW step of the GRPO loss on one device.

Usage (GPU machine, repo root):   python bench/learner.py            (full, < 3 min on one H100)
                                  python bench/learner.py --quick
Local smoke check:                python bench/learner.py --device cpu --quick --model tiny-random

One step = a GRPO batch of `--seqs` sequences (a prompt of ~150 tokens plus a completion of
uniformly 32..256 tokens, like GSM8K rollouts), bucketed by length into micro-batches of at
most `--micro-tokens` padded tokens (sorted by length, so padding stays small; the padding
fraction is reported), each: chunked token log-probs (grpo.model.token_logprobs) -> GRPO
loss (grpo.loss) -> backward; then one fused AdamW step. The same path as the learner's
--no-deepspeed engine: fp32 master weights, bf16 autocast on CUDA.

MFU = 6 * N * (real tokens / s) / peak, N = all parameters (tied embeddings counted once:
they are the LM head's matmul), peak = 989e12 bf16 FLOP/s (H100 SXM / H200 dense). Attention
score FLOPs are not counted (the usual 6N convention), nor is the LM-head recompute of the
chunked log-prob backward. Writes bench/results/learner_<device>.json.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import PEAK_BF16_FLOPS, Timer, pick, sync, table, write_result  # noqa: E402

from grpo.loss import grpo_token_loss, reduce_loss  # noqa: E402
from grpo.model import load_causal_lm, resolve_model, token_logprobs  # noqa: E402


def make_batch(n: int, vocab: int, seed: int, prompt_len=(120, 180), gen_len=(32, 256)):
    g = torch.Generator().manual_seed(seed)
    seqs = []
    for _ in range(n):
        p = int(torch.randint(prompt_len[0], prompt_len[1] + 1, (), generator=g))
        c = int(torch.randint(gen_len[0], gen_len[1] + 1, (), generator=g))
        seqs.append((torch.randint(3, vocab, (p + c,), generator=g), p))
    return seqs


def buckets(seqs, micro_tokens: int):
    """Sort by length and cut into micro-batches whose padded size stays under micro_tokens."""
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i][0]))
    out, cur = [], []
    for i in order:
        longest = len(seqs[i][0])  # sorted: the newcomer is the longest
        if cur and longest * (len(cur) + 1) > micro_tokens:
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out


def tensors(seqs, idx, device, pad=2):
    width = max(len(seqs[i][0]) for i in idx)
    ids = torch.full((len(idx), width), pad, dtype=torch.long)
    att = torch.zeros_like(ids)
    gen = torch.zeros((len(idx), width - 1), dtype=torch.float32)
    for r, i in enumerate(idx):
        s, p = seqs[i]
        ids[r, :len(s)] = s
        att[r, :len(s)] = 1
        gen[r, p - 1:len(s) - 1] = 1.0  # positions predicting completion tokens
    return ids.to(device), att.to(device), gen.to(device)


def bench_model(name: str, device, args, micro_tokens: int = 0) -> dict:
    cuda = device.type == "cuda"
    model = load_causal_lm(resolve_model(name), device, torch.float32)
    model.config.use_cache = False
    model.train()
    if args.grad_checkpointing:
        model.gradient_checkpointing_enable()
    n_params = sum(p.numel() for p in model.parameters())
    vocab = model.get_input_embeddings().weight.shape[0]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=cuda)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()
    # 3B: fp32 weights + grads + AdamW states take ~50 GB; 2,048-token micro-batches keep
    # activations near 11 GB so an 80 GB H100 has room.
    micro_tokens = micro_tokens or (2048 if n_params > 1e9 else 16384)
    seqs = make_batch(args.seqs, min(vocab, 49152), seed=0)
    groups = buckets(seqs, micro_tokens)
    real = sum(len(s) for s, _ in seqs)
    padded = sum(len(g) * max(len(seqs[i][0]) for i in g) for g in groups)
    adv = torch.randn(len(seqs), generator=torch.Generator().manual_seed(1))
    total_gen = int(sum(len(s) - p for s, p in seqs))

    def step():
        for g in groups:
            ids, att, gen = tensors(seqs, g, device)
            with amp:
                logp = token_logprobs(model, ids, att, 1.0)
            old = logp.detach()
            tl = grpo_token_loss(logp, old, old, adv[g].to(device), gen, beta=0.04)
            loss = reduce_loss(tl.loss, gen, "grpo", len(seqs), total_gen, 256)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    row = {"model": name, "params_m": n_params / 1e6, "seqs": len(seqs), "tokens": real,
           "micro_batches": len(groups), "micro_tokens": micro_tokens, "pad_frac": 1 - real / padded}
    try:
        t0 = time.perf_counter()
        for _ in range(args.warmup):
            step()
        sync(device)
        row["warmup_s"] = time.perf_counter() - t0
        with Timer(device) as t:
            for _ in range(args.steps):
                step()
    except torch.cuda.OutOfMemoryError as exc:
        row["error"] = f"OOM: {str(exc).splitlines()[0][:200]} (try --micro-tokens smaller or --grad-checkpointing)"
        return row
    finally:
        del opt
    tok_s = real * args.steps / t.s
    row.update({"step_s": t.s / args.steps, "tok_s": tok_s, "peak_gib": t.peak_gib,
                "mfu": 6 * n_params * tok_s / PEAK_BF16_FLOPS if cuda else None})
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", help="auto, cuda or cpu")
    ap.add_argument("--quick", action="store_true", help="fewer steps (CPU: a tiny smoke run)")
    ap.add_argument("--model", action="append", help="models (default: smollm2 and random:qwen2.5-3b)")
    ap.add_argument("--seqs", type=int, default=0, help="sequences per step (default 128; CPU quick 8)")
    ap.add_argument("--micro-tokens", default="0",
                    help="padded tokens per micro-batch, or a comma list (one row each); default 16384, 2048 above 1B params")
    ap.add_argument("--name", default="learner", help="result file bench/results/<name>_<device>.json")
    ap.add_argument("--grad-checkpointing", action="store_true", help="recompute activations (lower memory, lower MFU)")
    args = ap.parse_args()
    device = pick(args.device)
    cpu_quick = device.type == "cpu" and args.quick
    args.seqs = args.seqs or (8 if cpu_quick else 128)
    args.warmup, args.steps = (1, 1) if cpu_quick else ((1, 2) if args.quick else (2, 4))
    models = args.model or (["tiny-random"] if device.type == "cpu" else ["smollm2", "random:qwen2.5-3b"])
    rows = []
    for name in models:
        for micro in [int(x) for x in str(args.micro_tokens).split(",")]:
            rows.append(bench_model(name, device, args, micro))
            print(table(rows[-1:], list(rows[-1])), flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    cols = ["model", "params_m", "tokens", "micro_batches", "pad_frac", "step_s", "tok_s", "mfu", "peak_gib"]
    print("\n" + table(rows, cols))
    out = write_result(args.name, device, {
        "settings": {"quick": args.quick, "seqs_per_step": args.seqs, "warmup_steps": args.warmup,
                     "timed_steps": args.steps, "precision": "fp32 master weights, bf16 autocast (CUDA)",
                     "optimizer": "torch.optim.AdamW(fused on CUDA), grad clip 1.0",
                     "lengths": "prompt 120..180 + completion 32..256 tokens, uniform; length-bucketed micro-batches",
                     "grad_checkpointing": args.grad_checkpointing,
                     "mfu": f"6 * params * tokens/s / {PEAK_BF16_FLOPS:.0f} (H100/H200 dense bf16 peak)"},
        "rows": rows})
    print(f"wrote {out}")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
