"""Which reasoning-gym task (and settings) should the demo train on? Measured on *train* problems
only: choosing from the test subset would be tuning on it.

For each --dataset spec: greedy accuracy on P train problems (the model as it is), then G sampled
completions of each at temperature 1 (the sampler's round): accuracy, the fraction of groups with
any signal (what --filter-zero-signal keeps), length and truncation. The demo wants a task whose
greedy accuracy is low but not zero (room to double) and whose groups mostly carry signal.

  python bench/task_probe.py [--specs 'rg:letter_counting;rg:basic_arithmetic:max_terms=2'] [--prompts 256]
                             [-G 16] [--max-new-tokens 256]

Writes bench/results/task_probe_<device>.json. CPU smoke run: --device cpu --model tiny-random
--prompts 2 -G 2 --max-new-tokens 4.
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import write_result  # noqa: E402
from signal_probe import sample, signal_stats  # noqa: E402

from grpo.data.rewards import correctness_reward  # noqa: E402
from grpo.data.sources import load_problems  # noqa: E402
from grpo.model import compute_dtype, eos_ids, load_causal_lm, load_tokenizer, resolve_model  # noqa: E402
from grpo.generate.engine import RolloutEngine  # noqa: E402

SPECS = ("rg:letter_counting;"
         "rg:basic_arithmetic:min_terms=2,max_terms=2,max_digits=1,operators=[+,-],allow_parentheses=false;"
         "rg:basic_arithmetic:min_terms=2,max_terms=2,max_digits=1;"
         "rg:chain_sum:min_terms=2,max_terms=2,min_digits=1,max_digits=1;"
         "rg:leg_counting:min_animals=1,max_animals=2;"
         "rg:letter_counting:min_words=5,max_words=7")


def score(tok, problems, tokens, G: int) -> list[float]:
    """The run's correctness reward (reasoning-gym's own scorer for non-numeric answers)."""
    rows = [problems[k // G] for k in range(len(tokens))]
    texts = [tok.decode(t, skip_special_tokens=True) for t in tokens]
    return correctness_reward([""] * len(rows), texts, [p.answer for p in rows],
                              rg_task=[p.columns.get("rg_task") for p in rows],
                              rg_entry=[p.columns.get("rg_entry") for p in rows])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--specs", default=SPECS, help="--dataset values separated by ';'")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("-G", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    device = torch.device(args.device)
    path = resolve_model(args.model)
    tok = load_tokenizer(path)
    model = load_causal_lm(path, device, compute_dtype(device)).eval()
    engine = RolloutEngine(model, eos_ids(tok, model), tok.pad_token_id, cuda_graphs=device.type == "cuda")
    rows = []
    for spec in [s.strip() for s in args.specs.split(";") if s.strip()]:
        t0 = time.perf_counter()
        problems = random.Random(args.seed).sample(load_problems(spec, "train", limit=2000, seed=42), args.prompts)
        torch.manual_seed(args.seed)
        greedy_tokens, greedy_fin, _ = sample(engine, tok, problems, 1, 0.0, args.max_new_tokens, args.rows)
        greedy = score(tok, problems, greedy_tokens, 1)
        tokens, finished, gen_s = sample(engine, tok, problems, args.G, 1.0, args.max_new_tokens, args.rows)
        rewards = score(tok, problems, tokens, args.G)
        row = {"spec": spec, "greedy_accuracy": round(sum(greedy) / len(greedy), 4),
               "greedy_truncated_frac": round(1 - sum(greedy_fin) / len(greedy_fin), 4),
               **signal_stats(rewards, args.G, [len(t) for t in tokens], finished),
               "gen_s": round(gen_s, 2), "seconds": round(time.perf_counter() - t0, 1)}
        rows.append(row)
        print(row, flush=True)
    print("wrote", write_result("task_probe", device, {
        "model": args.model, "data": f"train split (seed 42), {args.prompts} problems sampled with seed {args.seed}",
        "G": args.G, "temperature": 1.0, "max_new_tokens": args.max_new_tokens, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
