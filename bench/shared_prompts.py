"""The learner's pass with each prompt once (--share-prompts) against every row whole: one learner
step's forward and backward, timed both ways on the same rows, and the log-probs compared.

Usage (GPU machine, repo root):
    python bench/shared_prompts.py --model random:qwen2.5-1.5b --micro-tokens 10240
Local smoke check:
    python bench/shared_prompts.py --device cpu --model tiny-random --groups 2 --group-size 4 --min-new 4 --max-new 16 --reps 1

A step as the benchmark's rows train it: --groups GSM8K train prompts (the prompt rule the sampler
uses) with --group-size completions each, of random tokens and lengths drawn uniformly from
[--min-new, --max-new], packed by length into micro-batches of at most --micro-tokens padded tokens
(grpo.learner.batch.token_buckets, the learner's own packing), each micro-batch's log-probs
(grpo.model.logprobs.token_logprobs, under bf16 autocast on float32 weights on CUDA: the learner's
default precision) into a loss and its backward. The two ways alternate, --reps times each after
one warm-up each; the optimizer step is left out (the same for both). Writes
bench/results/shared_prompts_<model>_<device>.json: each way's median step seconds and peak
memory, the tokens, the distinct prompts per micro-batch, and the largest difference between the
two ways' log-probs.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import pick, sync, write_result  # noqa: E402

from grpo.data.prompts import problem_prompt  # noqa: E402
from grpo.data.sources import load_problems  # noqa: E402
from grpo.learner.batch import token_buckets  # noqa: E402
from grpo.model.load import load_causal_lm, load_tokenizer  # noqa: E402
from grpo.model.logprobs import right_pad, token_logprobs  # noqa: E402
from grpo.model.zoo import resolve_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="random:qwen2.5-1.5b")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dataset", default=str(ROOT.parent / "shared" / "data" / "gsm8k"))
    ap.add_argument("--groups", type=int, default=8, help="prompts in the step")
    ap.add_argument("--group-size", type=int, default=16, help="completions per prompt")
    ap.add_argument("--min-new", type=int, default=60, help="shortest completion, tokens")
    ap.add_argument("--max-new", type=int, default=480, help="longest completion, tokens")
    ap.add_argument("--micro-tokens", type=int, default=10240, help="padded tokens per micro-batch")
    ap.add_argument("--reps", type=int, default=3, help="timed steps each way")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default=None, help="result name (default shared_prompts_<model>)")
    ap.add_argument("--results-dir", default=None)
    return ap.parse_args(argv)


def build_rows(tok, problems, group_size: int, min_new: int, max_new: int, vocab: int, seed: int):
    """(rows of prompt + completion ids, each row's prompt length): every prompt's group_size rows."""
    g = torch.Generator().manual_seed(seed)
    rows, plens = [], []
    for p in problems:
        prompt = tok(problem_prompt(tok, p), add_special_tokens=False)["input_ids"]
        for _ in range(group_size):
            n = int(torch.randint(min_new, max_new + 1, (1,), generator=g))
            rows.append(prompt + torch.randint(3, vocab, (n,), generator=g).tolist())
            plens.append(len(prompt))
    return rows, plens


def step(model, rows, plens, micro, device, shared: bool, amp) -> float:
    """One step's forward and backward over the micro-batches; its seconds."""
    sync(device)
    t0 = time.perf_counter()
    for piece in micro:
        ids, mask = right_pad([rows[i] for i in piece], 0, device)
        first = torch.tensor([plens[i] - 1 for i in piece], device=device)
        with amp():
            lp = token_logprobs(model, ids, mask, 1.0, first=first, share_prompts=shared)   # [b, L-1]
        (lp.sum() / max(len(rows), 1)).backward()
    model.zero_grad(set_to_none=True)
    sync(device)
    return time.perf_counter() - t0


def main(argv=None) -> dict:
    args = parse(argv)
    device = pick(args.device)
    path = resolve_model(args.model)
    tok = load_tokenizer(path)
    model = load_causal_lm(path, device, torch.float32)   # the learner's autocast precision: fp32 weights
    model.config.use_cache = False
    model.train()
    cuda = device.type == "cuda"
    amp = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if cuda else contextlib.nullcontext
    problems = load_problems(args.dataset, "train", limit=args.groups, seed=args.seed)
    vocab = model.get_input_embeddings().weight.shape[0]
    rows, plens = build_rows(tok, problems, args.group_size, args.min_new, args.max_new, vocab, args.seed)
    micro = token_buckets([len(r) for r in rows], args.micro_tokens)
    distinct = [len({tuple(rows[i][:plens[i]]) for i in piece}) for piece in micro]

    with torch.no_grad():   # the two ways' log-probs on the first micro-batch
        piece = micro[0]
        ids, mask = right_pad([rows[i] for i in piece], 0, device)
        first = torch.tensor([plens[i] - 1 for i in piece], device=device)
        with amp():
            a = token_logprobs(model, ids, mask, 1.0, first=first, share_prompts=True)
            b = token_logprobs(model, ids, mask, 1.0, first=first)
        computed = b != 0
        diff = (a - b).abs()[computed]
        max_diff, mean_diff = float(diff.max()), float(diff.mean())

    times: dict[bool, list[float]] = {False: [], True: []}
    peak: dict[bool, float] = {}
    for shared in (False, True):   # warm-up, and each way's peak memory
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        step(model, rows, plens, micro, device, shared, amp)
        peak[shared] = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else 0.0
    for _ in range(args.reps):
        for shared in (False, True):
            times[shared].append(step(model, rows, plens, micro, device, shared, amp))
    plain_s, shared_s = statistics.median(times[False]), statistics.median(times[True])
    tokens = sum(map(len, rows))
    prompt_tokens = sum(plens)
    result = {"model": args.model, "seeds": [args.seed], "settings": {k: v for k, v in vars(args).items()
                                                                      if k not in ("name", "results_dir")},
              "rows": len(rows), "micro_batches": len(micro), "model_tokens": tokens, "prompt_tokens": prompt_tokens,
              "prompt_share": round(prompt_tokens / tokens, 4),
              "distinct_prompts_per_micro_batch": distinct, "rows_per_micro_batch": [len(p) for p in micro],
              "plain_step_s": round(plain_s, 4), "shared_step_s": round(shared_s, 4),
              "speedup": round(plain_s / shared_s, 3), "plain_steps_s": [round(x, 4) for x in times[False]],
              "shared_steps_s": [round(x, 4) for x in times[True]],
              "plain_peak_gib": round(peak[False], 2), "shared_peak_gib": round(peak[True], 2),
              "logprob_max_abs_diff": round(max_diff, 6), "logprob_mean_abs_diff": round(mean_diff, 7),
              "precision": "bf16 autocast on float32 weights" if cuda else "float32"}
    name = args.name or f"shared_prompts_{args.model.replace(':', '-').replace('/', '_')}"
    out = write_result(name, device, result, results_dir=Path(args.results_dir) if args.results_dir else None)
    print(f"{args.model}: {len(rows)} rows, {tokens:,} tokens ({prompt_tokens / tokens:.0%} prompt) in "
          f"{len(micro)} micro-batches, {sum(distinct)} distinct prompts among them; a step {plain_s:.3f} s every "
          f"row whole, {shared_s:.3f} s each prompt once ({plain_s / shared_s:.2f}x); peak {peak[False]:.1f} / "
          f"{peak[True]:.1f} GiB; log-probs differ by at most {max_diff:.2e} (mean {mean_diff:.2e}); wrote {out}")
    return result


if __name__ == "__main__":
    main()
