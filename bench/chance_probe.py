"""Is the model's GSM8K accuracy above chance? Its answers against copying a number from the question.

A policy that answers with a number taken from the question scores when the gold answer happens
to be one of them (6% of the first 500 test problems; answering the question's last number
scores 1.8%, a uniformly picked question number 1.7%). GRPO can only amplify what the policy
already does better than that. For sampled completions of GSM8K *train* prompts (as the sampler
makes them) and the greedy pass over the first N *test* problems (as the evaluation makes it):
accuracy, how many answers are a number copied from the question, how many of the *correct*
answers are copies, accuracy on problems whose gold answer is / is not in the question, accuracy
by solution steps, the two chance baselines on the same problems, and a few correct completions.

  python bench/chance_probe.py [--model smollm2] [--prompts 256] [-G 16] [--eval-size 500]
                               [--max-new-tokens 512] [--dataset ../shared/data/gsm8k]

With --baselines-only (no model, CPU) it writes the data's chance baselines alone, adding two that
read no question at all: always the train split's most common answer, and an answer drawn from the
train answers' distribution: bench/results/chance_baselines_cpu.json.
Otherwise writes bench/results/<--name, default chance_probe>_<device>.json. CPU smoke run: --device cpu --model tiny-random
--prompts 2 -G 2 --eval-size 2 --max-new-tokens 4.
"""
from __future__ import annotations

import argparse
import random
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import ROOT, write_result  # noqa: E402
from signal_probe import sample  # noqa: E402 - the same sampling loop, with greedy at temperature 0

from grpo.data.gsm8k import _numbers, extract_gsm8k_answer  # noqa: E402
from grpo.data.sources import load_problems  # noqa: E402
from grpo.model import compute_dtype, eos_ids, load_causal_lm, load_tokenizer, resolve_model  # noqa: E402
from grpo.generate.engine import RolloutEngine  # noqa: E402

GSM8K = ROOT.parent / "shared" / "data" / "gsm8k"


def solution_steps(answer: str) -> int:
    """Reasoning steps of a GSM8K reference solution: its non-empty lines before '####'."""
    body = answer.rsplit("####", 1)[0]
    return sum(1 for line in body.splitlines() if line.strip())


def answer_stats(questions: list[str], golds: list[str], answers: list[str | None], per: int,
                 steps: list[int]) -> dict:
    """`answers` holds `per` consecutive extracted answers for each question (None: no number).

    Rates are over completions; `correct_copied` is over correct completions; the chance
    baselines are over questions (what answering the last / a uniformly picked question number
    would score on these problems)."""
    qnums = [_numbers(q) for q in questions]
    rows = [(k // per, a) for k, a in enumerate(answers)]
    correct = [a is not None and a == golds[i] for i, a in rows]
    copied = [a is not None and a in qnums[i] for i, a in rows]
    gold_in_q = [golds[i] in qnums[i] for i, _ in rows]

    def rate(flags, where=None):
        sel = [f for f, w in zip(flags, where or [True] * len(flags)) if w]
        return round(sum(sel) / len(sel), 5) if sel else None

    by_steps = {}
    for name, keep in (("2", lambda s: s <= 2), ("3", lambda s: s == 3), ("4+", lambda s: s >= 4)):
        by_steps[name] = rate(correct, [keep(steps[i]) for i, _ in rows])
    return {
        "completions": len(answers), "accuracy": rate(correct), "answer_copied_from_question": rate(copied),
        "correct_copied_from_question": rate(copied, correct), "correct": sum(correct),
        "gold_in_question": round(sum(g in n for g, n in zip(golds, qnums)) / len(golds), 5),
        "accuracy_gold_in_question": rate(correct, gold_in_q),
        "accuracy_gold_not_in_question": rate(correct, [not g for g in gold_in_q]),
        "accuracy_by_solution_steps": by_steps,
        "chance_last_question_number": round(sum(bool(n) and n[-1] == g for g, n in zip(golds, qnums)) / len(golds), 5),
        "chance_uniform_question_number": round(sum(n.count(g) / len(n) for g, n in zip(golds, qnums) if n)
                                                / len(golds), 5),
    }


def prior_baselines(train_golds: list[str], test_golds: list[str]) -> dict:
    """Answers that read no question: the train split's most common answer, always, and an answer
    drawn from the train answers' distribution (expected accuracy), scored on the test golds."""
    counts = Counter(train_golds)
    top, _ = counts.most_common(1)[0]
    return {"most_common_train_answer": top,
            "constant_answer_accuracy": round(sum(g == top for g in test_golds) / len(test_golds), 5),
            "train_answer_distribution_accuracy": round(sum(counts[g] for g in test_golds)
                                                        / len(train_golds) / len(test_golds), 5)}


def probe(engine, tok, problems, per: int, temperature: float, max_new: int, rows: int, examples: int = 6) -> dict:
    texts = [tok.decode(t, skip_special_tokens=True) for t in sample(engine, tok, problems, per, temperature,
                                                                     max_new, rows)[0]]
    answers = [extract_gsm8k_answer(t) for t in texts]
    golds = [extract_gsm8k_answer(p.answer) for p in problems]
    stats = answer_stats([p.question for p in problems], golds, answers, per,
                         [solution_steps(p.answer) for p in problems])
    shown = [{"question": problems[k // per].question, "gold": golds[k // per], "completion": texts[k]}
             for k, a in enumerate(answers) if a is not None and a == golds[k // per]][:examples]
    return {"temperature": temperature, "per_problem": per, **stats, "correct_examples": shown}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--dataset", default=str(GSM8K))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("-G", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--eval-size", type=int, default=500)
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="chance_probe", help="results file stem (e.g. for a trained checkpoint)")
    ap.add_argument("--baselines-only", action="store_true",
                    help="no model: the data's chance baselines only, into chance_baselines_cpu.json")
    args = ap.parse_args()
    train_all = load_problems(args.dataset, "train")
    test = load_problems(args.dataset, "test", limit=args.eval_size)   # the evaluation's fixed subset
    test_golds = [extract_gsm8k_answer(p.answer) for p in test]
    prior = prior_baselines([extract_gsm8k_answer(p.answer) for p in train_all], test_golds)
    if args.baselines_only:
        copy = answer_stats([p.question for p in test], test_golds, test_golds, 1,
                            [solution_steps(p.answer) for p in test])
        keep = ("gold_in_question", "chance_last_question_number", "chance_uniform_question_number")
        print("wrote", write_result("chance_baselines", torch.device("cpu"), {
            "data": "first %d GSM8K test problems; train answers from all %d train problems" % (len(test), len(train_all)),
            **{k: copy[k] for k in keep}, **prior}))
        return 0
    device = torch.device(args.device)
    path = resolve_model(args.model)
    tok = load_tokenizer(path)
    model = load_causal_lm(path, device, compute_dtype(device)).eval()
    engine = RolloutEngine(model, eos_ids(tok, model), tok.pad_token_id)
    torch.manual_seed(args.seed)
    train = random.Random(args.seed).sample(train_all, args.prompts)
    sampled = probe(engine, tok, train, args.G, args.temperature, args.max_new_tokens, args.rows)
    print({k: v for k, v in sampled.items() if k != "correct_examples"}, flush=True)
    greedy = probe(engine, tok, test, 1, 0.0, args.max_new_tokens, args.rows)
    print({k: v for k, v in greedy.items() if k != "correct_examples"}, flush=True)
    print("wrote", write_result(args.name, device, {
        "model": args.model, "max_new_tokens": args.max_new_tokens,
        "train_sampled": {"data": "GSM8K train, %d prompts sampled with seed %d" % (args.prompts, args.seed), **sampled},
        "test_greedy": {"data": "first %d GSM8K test problems" % args.eval_size, **greedy}, "test_prior": prior}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
