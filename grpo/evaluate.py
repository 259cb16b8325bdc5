"""Greedy pass@1 on a fixed subset of a test split, in process or as a command.

    python -m grpo.evaluate --model PATH_OR_CHECKPOINT [--dataset ../shared/data/gsm8k] \
        [--eval-size 500] [--out result.json]

--model takes what a run saved (a checkpoint folder, its hf/, a LoRA adapter: grpo.model.saved) as well
as any model --model takes in training. The subset is the first --eval-size problems of the test
split (the source's own order; a data file's held-out rows, grpo.data.sources.held_out_rows),
so every evaluation of a run, and the baseline before it, scores the same problems. The
same function runs inside the sampler (`--eval-every N`) and at the learner's end.

This module picks the problems and scores the completions; the decoding (torch, transformers) is
grpo.generate.greedy's, imported where it is used: the command refuses a bad flag or --dataset
before torch loads.
"""
from __future__ import annotations

import collections
import hashlib
import json
import logging
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from grpo.config import EvalConfig
from grpo.data.formats import Problem
from grpo.data.prompts import problem_prompt
from grpo.data.rewards import correctness_scorer, final_answer, score_correctness
from grpo.data.sources import DatasetUnavailable, load_problems
from grpo.data.tasks import start_levels
from grpo.flags import parse_config
from grpo.model.gguf.header import ModelUnavailable
from grpo.model.saved import find_model
from grpo.obs.rundir import freeze_for_exit, setup_logging
from grpo.rules.backend import VLLM_MISSING, vllm_installed

if TYPE_CHECKING:   # annotations only: torch is imported where it is used, so `--help` stays instant
    import torch

log = logging.getLogger(__name__)


def evaluate_module(module, tok, cfg, device: torch.device, autocast: bool = False) -> dict:
    """Greedy pass@1 of a training module (the learner's final weights) on cfg's evaluation
    subset, decoded as sampler 0 decoded the baseline (grpo.generate.greedy.decoding: the same
    decoder in the same dtype, from a copy of float32 weights)."""
    from grpo.generate.greedy import decoding  # here: the command refuses bad flags and --dataset before torch loads

    with decoding(module, tok, cfg.rollout.generation_backend, device, autocast,
                  cfg.rollout.liger_decode) as (model, engine):
        return greedy_accuracy(model, tok, run_eval_problems(cfg), cfg.rollout.max_new_tokens,
                               cfg.evaluation.eval_batch_size, device, engine=engine)


def run_eval_problems(cfg) -> list[Problem]:
    """A training run's evaluation subset (sampler 0's and the learner's alike): --eval-dataset, else
    --dataset; with --curriculum at the tasks' starting level, so every evaluation scores the same."""
    dataset = cfg.evaluation.eval_dataset or cfg.data.dataset
    levels = start_levels(dataset) if cfg.data.curriculum else None
    return eval_problems(dataset, cfg.evaluation.eval_size, levels=levels)


def eval_problems(dataset: str, size: int, seed: int = 0, levels: dict[str, int] | None = None) -> list[Problem]:
    """The fixed evaluation subset: the first `size` problems of the test split (of rg: tasks at
    curriculum `levels` when given: a curriculum run is measured at its starting levels)."""
    return load_problems(dataset, "test", limit=size or None, seed=seed, levels=levels)


def greedy_accuracy(model, tok, problems: list[Problem], max_new_tokens: int, batch_size: int,
                    device: torch.device, engine=None) -> dict:
    """Greedy decoding of every problem (grpo.generate.greedy.decode: by `engine`, else Hugging
    Face `generate`); the share whose final answer is correct.

    Prompts and correctness are training's: the sampler's prompt rule (problem_prompt) and the
    reward set's 'correct' (score_correctness: reasoning-gym's own scorer for rg: answers that are
    not numbers, the GSM8K final-number rule otherwise), so held-out accuracy measures what the
    reward trains.
    """
    from grpo.generate.greedy import decode  # here: the command refuses bad flags and --dataset before torch loads

    t0 = time.perf_counter()
    prompts = [problem_prompt(tok, p) for p in problems]
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    texts, lengths, truncated = decode(model, tok, ids, max_new_tokens, batch_size, device, engine)
    t_decoded = time.perf_counter()
    scorer = correctness_scorer()   # a completion it cannot score counts as wrong, and is counted
    scored = scorer.score(problems, texts, [[] for _ in texts])
    correct = [sc.info["correct"] for sc in scored]
    answers = [final_answer(p, t) for p, t in zip(problems, texts)]
    has_answer = [sc.info["has_answer"] for sc in scored]
    n = max(len(problems), 1)
    return {"accuracy": sum(correct) / n, "correct": int(sum(correct)), "n": len(problems),
            "has_answer": sum(has_answer) / n, "mean_completion_len": sum(lengths) / n,
            "truncated_frac": truncated / n, "top_answers": top_answers(answers),
            "completions_sha256": completions_digest(texts),
            "seconds": time.perf_counter() - t0, "decode_s": t_decoded - t0,
            "max_new_tokens": max_new_tokens, "decoder": "hf" if engine is None else getattr(engine, "decoder", "fast"),
            "reward_failures": int(sum(scorer.faults.counts.values())), "reward_failed": scorer.faults.summary()}


def completions_digest(texts: list[str]) -> str:
    """sha256 of every completion's text in problem order: two evaluations that decoded the same
    weights the same way give the same digest, so the learner's final evaluation and
    `python -m grpo.evaluate` on the checkpoint it saved can be compared beyond their accuracy."""
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode())
        h.update(b"\0")
    return h.hexdigest()


def top_answers(answers: list[str | None], k: int = 3) -> list[list]:
    """The `k` most common final answers as [answer, share of all completions], most common first
    (ties by first seen); completions without an answer are left out. A policy that has collapsed
    to one answer whatever the question shows here as one answer with most of the share."""
    n = max(len(answers), 1)
    counts = collections.Counter(a for a in answers if a is not None)
    return [[a, c / n] for a, c in counts.most_common(k)]


def constant_answer_baseline(problems: list[Problem]) -> dict:
    """The accuracy of answering every problem with its most common reference answer, scored by
    the correctness rule itself: what a policy that ignores the question can reach. On
    rg:letter_counting's first 500 test problems that is '1', right 177 times (0.354)."""
    counts = collections.Counter(p.answer.strip() for p in problems)
    if not counts:
        return {"answer": None, "accuracy": 0.0}
    answer = counts.most_common(1)[0][0]
    scored = score_correctness(problems, [f"#### {answer}"] * len(problems))
    return {"answer": answer, "accuracy": sum(sc.info["correct"] for sc in scored) / len(problems)}


def record_eval(run_dir: str, version: int, result: dict, by: str) -> None:
    """Log an evaluation and append it to <run_dir>/eval.jsonl (one line per evaluation)."""
    log.info("eval at version %d by %s: greedy pass@1 %.4f (%d/%d), %.1f s", version, by,
             result["accuracy"], result["correct"], result["n"], result["seconds"])
    if run_dir:
        with open(Path(run_dir) / "eval.jsonl", "a") as fh:
            fh.write(json.dumps({"version": version, "by": by, "time": time.time(), **result}) + "\n")


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    finally:
        freeze_for_exit()   # the command's output is written by now


def _main(argv: list[str] | None = None) -> int:
    cfg = parse_config(EvalConfig, argv, "python -m grpo.evaluate")
    setup_logging("evaluate")
    try:
        if cfg.generation_backend == "vllm" and not vllm_installed():   # before a model is looked up (or converted)
            raise ValueError(VLLM_MISSING)
        problems = eval_problems(cfg.dataset, cfg.eval_size)   # a bad --dataset ends here, before torch loads
        found = find_model(cfg.model, cfg.base_model)   # a folder it cannot take too (a checkpoint's is fine)
        log.info("evaluating %s", found.what)
        from grpo.generate.greedy import load_to_decode  # here: the command refuses bad flags and --dataset before torch loads

        device, tok, model, engine = load_to_decode(found, cfg.device, cfg.gpu_id, cfg.generation_backend,
                                                    cfg.eval_batch_size, cfg.max_new_tokens)
    except (DatasetUnavailable, ModelUnavailable, ValueError) as exc:
        print(f"python -m grpo.evaluate: error: {str(exc).strip().splitlines()[0]}", file=sys.stderr)
        return 2
    result = greedy_accuracy(model, tok, problems, cfg.max_new_tokens, cfg.eval_batch_size, device, engine=engine)
    # a data file's test split is its held-out rows (grpo.data.sources.held_out_rows)
    split = "held-out" if Path(cfg.dataset).expanduser().is_file() else "test"
    result.update(model=cfg.model, loaded=found.what, dataset=cfg.dataset, split=split, device=str(device),
                  config=asdict(cfg))
    print(f"greedy pass@1: {result['accuracy']:.4f} ({result['correct']}/{result['n']}) on the first "
          f"{result['n']} {split} problems of {cfg.dataset}; {result['seconds']:.1f} s")
    if cfg.out:
        Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
