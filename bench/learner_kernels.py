"""The learner's forward and backward with Liger-Kernel's fused layers against Hugging Face's own: what
a step of micro-batches costs each way, and how far the log-probs and gradients move.

Usage (GPU machine with liger-kernel installed, repo root):
    python bench/learner_kernels.py --shape qwen2.5-0.5b [--micro-batches 5 --rows 20 --length 512] [--padded]

Both copies run the learner's passes over the real tokens only (padding-free); --padded: over the
right-padded rows, as with --no-padding-free.

Two copies of one model at Qwen2.5's shapes (random weights, float32 as the learner keeps them, bf16
autocast as it trains): one as Hugging Face builds it, one with Liger's RMSNorm, SwiGLU MLP and
rotary embedding in place of Hugging Face's (liger_kernel's instance patch; the rotary function is
the modelling module's, so it is set for each copy's passes). The micro-batches are right-padded
rows of random tokens, each row's length drawn between --length / 4 and --length, as the
learner's (grpo.model.logprobs.token_logprobs, its chunked head). --reps steps each way,
alternating, after one untimed each; each step is every micro-batch's forward and backward,
between device synchronisations (no optimizer step: bench/optimizer_step.py times that). Before
any timing, the first micro-batch's log-probs and the gradients of its mean are compared between
the copies. Writes bench/results/learner_kernels_<shape>_<device>.json.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import pick, sync, write_result  # noqa: E402
from optimizer_step import SHAPES, build  # noqa: E402

from grpo.model.logprobs import right_pad, token_logprobs  # noqa: E402


def micro_batches(n: int, rows: int, length: int, vocab: int, device: torch.device, seed: int = 1):
    """n right-padded micro-batches of `rows` random rows, lengths drawn in [length // 4, length]."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        lens = torch.randint(length // 4, length + 1, (rows,), generator=gen).tolist()
        seqs = [torch.randint(3, vocab, (k,), generator=gen).tolist() for k in lens]
        out.append(right_pad(seqs, 0, device))   # ([rows, L] ids, [rows, L] mask)
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted(SHAPES))
    ap.add_argument("--device", default="auto")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--micro-batches", type=int, default=5)
    ap.add_argument("--rows", type=int, default=20)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--padded", action="store_true",
                    help="the passes over right-padded rows (--no-padding-free), not over the real tokens only")
    ap.add_argument("--results-dir", default=None)
    args = ap.parse_args(argv)
    device = pick(args.device)
    from liger_kernel.transformers import _apply_liger_kernel_to_instance
    from liger_kernel.transformers.rope import liger_rotary_pos_emb
    from transformers.models.qwen2 import modeling_qwen2

    hf_rope = modeling_qwen2.apply_rotary_pos_emb
    torch.manual_seed(0)
    plain = build(args.shape, device)
    liger = build(args.shape, device)
    liger.load_state_dict(plain.state_dict())
    _apply_liger_kernel_to_instance(liger, rope=False, rms_norm=True, swiglu=True, cross_entropy=False,
                                    fused_linear_cross_entropy=False)
    ropes = {"plain": hf_rope, "liger": liger_rotary_pos_emb}
    models = {"plain": plain, "liger": liger}
    batches = micro_batches(args.micro_batches, args.rows, args.length, plain.config.vocab_size, device)
    tokens = sum(int(m.sum()) for _, m in batches)

    def passes(mode: str, grads: bool = True):
        modeling_qwen2.apply_rotary_pos_emb = ropes[mode]
        model = models[mode]
        for ids, mask in batches:   # [rows, L]
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                lp = token_logprobs(model, ids, mask, 1.0, padding_free=not args.padded)   # [rows, L - 1]
            if not grads:
                return lp
            (-(lp * mask[:, 1:]).sum() / mask[:, 1:].sum()).backward()
        return None

    # How far the log-probs and the gradients move: the first micro-batch, before any step
    from importlib.metadata import version
    result = {"shape": args.shape, "seeds": [0, 1], "reps": args.reps, "tokens": tokens,
              "padded_tokens": sum(m.numel() for _, m in batches), "padding_free": not args.padded,
              "liger_kernel": version("liger-kernel"),
              "step_shape": {"micro_batches": args.micro_batches, "rows": args.rows, "length": args.length}}
    with torch.no_grad():
        valid = batches[0][1][:, 1:].bool()
        a, b = passes("plain", grads=False), passes("liger", grads=False)
        result["logprob_max_abs_diff"] = float((a - b).abs()[valid].max())
        result["logprob_mean_plain"] = float(a[valid].mean())
    for mode in models:
        models[mode].zero_grad(set_to_none=True)
        passes(mode)
    rel = {}
    for (name, p), q in zip(plain.named_parameters(), liger.parameters()):
        if p.grad is not None and q.grad is not None:
            rel[name] = float((p.grad - q.grad).norm() / p.grad.norm().clamp_min(1e-30))
    result["grad_rel_diff_max"] = max(rel.values())
    result["grad_rel_diff_median"] = statistics.median(rel.values())

    times = {m: [] for m in models}
    for _ in range(args.reps + 1):
        for mode in models:
            models[mode].zero_grad(set_to_none=True)
            sync(device)
            t0 = time.perf_counter()
            passes(mode)
            sync(device)
            times[mode].append(time.perf_counter() - t0)
    modeling_qwen2.apply_rotary_pos_emb = hf_rope
    for mode, ts in times.items():
        result[f"{mode}_forward_backward_s"] = [round(x, 4) for x in ts[1:]]
        result[f"{mode}_median_s"] = round(statistics.median(ts[1:]), 4)
    result["speedup"] = round(result["plain_median_s"] / result["liger_median_s"], 3)
    if device.type == "cuda":
        result["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    out = write_result(f"learner_kernels_{args.shape}{'_padded' if args.padded else ''}", device, result,
                       results_dir=Path(args.results_dir) if args.results_dir else None)
    print(f"{args.shape}: {tokens} tokens, forward and backward {result['plain_median_s']:.3f} s plain, "
          f"{result['liger_median_s']:.3f} s with Liger ({result['speedup']}x); log-probs within "
          f"{result['logprob_max_abs_diff']:.2e}, gradients within {result['grad_rel_diff_max']:.2e} (relative); wrote {out}")
    return result


if __name__ == "__main__":
    main()
