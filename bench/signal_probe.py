"""How much learning signal does a round carry, by sampling temperature? GSM8K *train* prompts
only (choosing a run's settings from the test subset would be tuning on it).

For each temperature: G completions for each of P fixed train prompts with the fast engine and
the sampler's own prompt and correctness reward, then the fraction correct, the fraction of
groups with any signal (not all rewards equal: what --filter-zero-signal keeps), length,
truncation and generation time. Rows are generated in chunks of --rows (the sampler's round).

  python bench/signal_probe.py [--model smollm2] [--prompts 320] [-G 16] [--temperatures 0.6,0.8,1.0]
                               [--max-new-tokens 512] [--rows 1024] [--dataset ../shared/data/gsm8k]

Writes bench/results/signal_probe_<device>.json. CPU smoke run: --device cpu --model tiny-random
--prompts 2 -G 2 --max-new-tokens 4 --rows 4.
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import ROOT, write_result  # noqa: E402

from grpo.data.prompts import problem_prompt  # noqa: E402
from grpo.data.rewards import score_correctness  # noqa: E402
from grpo.data.sources import load_problems
from grpo.loss import has_signal  # noqa: E402
from grpo.model import compute_dtype, eos_ids, load_causal_lm, load_tokenizer, resolve_model  # noqa: E402
from grpo.generate.engine import RolloutEngine  # noqa: E402

GSM8K = ROOT.parent / "shared" / "data" / "gsm8k"


def sample(engine: RolloutEngine, tok, problems, G: int, temperature: float, max_new: int, rows: int):
    """G completions of each problem's sampler prompt, in chunks of `rows` (temperature 0: greedy):
    (token ids per completion, problem by problem; finished flags; generation seconds)."""
    ids = [tok(problem_prompt(tok, p), add_special_tokens=False)["input_ids"] for p in problems]
    flat = [i for i in ids for _ in range(G)]
    tokens, finished, gen_s = [], [], 0.0
    for s in range(0, len(flat), rows):
        t0 = time.perf_counter()
        out = engine.generate(flat[s:s + rows], max_new, temperature)
        gen_s += time.perf_counter() - t0
        tokens += out.token_ids
        finished += out.finished
    return tokens, finished, gen_s


def probe(engine: RolloutEngine, tok, problems, G: int, temperature: float, max_new: int, rows: int) -> dict:
    tokens, finished, gen_s = sample(engine, tok, problems, G, temperature, max_new, rows)
    rewards = [sc.reward for sc in score_correctness([problems[k // G] for k in range(len(tokens))],
                                                     [tok.decode(t, skip_special_tokens=True) for t in tokens])]
    return {"temperature": temperature, **signal_stats(rewards, G, [len(t) for t in tokens], finished),
            "gen_s": round(gen_s, 2)}


def signal_stats(rewards: list[float], G: int, lengths: list[int], finished: list[bool]) -> dict:
    """Per-completion rewards (consecutive groups of G) -> what a round offers the learner."""
    groups = [rewards[g:g + G] for g in range(0, len(rewards), G)]
    signal = [g for g in groups if has_signal(g)]   # what --filter-zero-signal keeps
    return {"completions": len(rewards), "accuracy": round(sum(rewards) / len(rewards), 5),
            "groups_with_signal": round(len(signal) / len(groups), 4),
            "correct_per_signal_group": round(sum(map(sum, signal)) / max(1, len(signal)), 3),
            "mean_completion_len": round(sum(lengths) / len(lengths), 1),
            "truncated_frac": round(1 - sum(finished) / len(finished), 4)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--dataset", default=str(GSM8K))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prompts", type=int, default=320)
    ap.add_argument("-G", type=int, default=16)
    ap.add_argument("--temperatures", default="0.6,0.8,1.0")
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    device = torch.device(args.device)
    path = resolve_model(args.model)
    tok = load_tokenizer(path)
    model = load_causal_lm(path, device, compute_dtype(device)).eval()
    problems = random.Random(args.seed).sample(load_problems(args.dataset, "train"), args.prompts)
    engine = RolloutEngine(model, eos_ids(tok, model), tok.pad_token_id)
    rows = []
    for t in (float(x) for x in args.temperatures.split(",")):
        torch.manual_seed(args.seed)
        rows.append(probe(engine, tok, problems, args.G, t, args.max_new_tokens, args.rows))
        print(rows[-1], flush=True)
    print("wrote", write_result("signal_probe", device, {
        "model": args.model, "data": "GSM8K train, %d prompts sampled with seed %d" % (args.prompts, args.seed),
        "G": args.G, "max_new_tokens": args.max_new_tokens, "rows_per_call": args.rows, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
