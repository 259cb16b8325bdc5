"""Greedy pass@1 on a fixed subset of a test split, in process or as a command.

    python -m grpo.evaluate --model PATH_OR_CHECKPOINT [--dataset ../shared/data/gsm8k] \
        [--eval-size 500] [--out result.json]

--model takes what a run saved (a checkpoint folder, its hf/, a LoRA adapter: grpo.model.saved) as well
as any model --model takes in training. The subset is the first --eval-size problems of the test
split (the source's own order; a data file's held-out rows, grpo.data.sources.held_out_rows),
so every evaluation of a run, and the baseline before it, scores the same problems. The
same function runs inside the sampler (`--eval-every N`) and at the learner's end.
"""
from __future__ import annotations

import collections
import contextlib
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
from grpo.model.saved import find_model, load_found
from grpo.obs.progress import Progress
from grpo.obs.rundir import freeze_for_exit, setup_logging

if TYPE_CHECKING:   # annotations only: torch is imported where it is used, so `--help` stays instant
    import torch

log = logging.getLogger(__name__)


def eval_engine(model, tok, backend: str, device: torch.device):
    """The decoder a greedy evaluation uses: the rollout engine where --generation-backend resolves
    to 'fast' (CUDA by default), else None (Hugging Face `generate`). Sampler 0 (the baseline),
    the learner (the final weights) and this module's command all decide by this one rule, so a
    run's accuracies before and after come from the same decoder: in learning run 7 the two
    decoders, on the same bf16 weights, differed by 2 of 500 problems."""
    from grpo.generate.backend import resolve_backend  # here: the command refuses bad flags and --dataset before torch loads

    if resolve_backend(backend, device) != "fast":
        return None
    from grpo.generate.engine import RolloutEngine  # here: the command refuses bad flags and --dataset before torch loads
    from grpo.model.load import eos_ids  # here: the command refuses bad flags and --dataset before torch loads

    return RolloutEngine(model, eos_ids(tok, model), tok.pad_token_id, cuda_graphs=device.type == "cuda")


def evaluate_module(module, tok, cfg, device: torch.device, autocast: bool = False) -> dict:
    """Greedy pass@1 of a training module (the learner's final weights) on cfg's evaluation
    subset, decoded as sampler 0 decoded the baseline: the same decoder (eval_engine) in the same
    dtype (compute_dtype: bf16 on CUDA). A learner that holds float32 weights (--precision autocast,
    the default for full fine-tuning) is decoded from a bf16 copy of them (decode_copy), so the
    result is that of the weights a sampler would run and of the checkpoint saved in that dtype;
    `autocast` is then moot. A module that cannot be copied so (LoRA adapters) decodes as it is,
    its fp32 matmuls under bf16 autocast on Hugging Face `generate`."""
    import torch  # here: the command refuses bad flags and --dataset before torch loads

    from grpo.model.load import compute_dtype  # here: the command refuses bad flags and --dataset before torch loads

    module.config.use_cache = True
    copy = decode_copy(module, compute_dtype(device))
    model = copy if copy is not None else module
    decoder = eval_engine(model, tok, cfg.generation_backend, device)
    amp = autocast and decoder is None and copy is None
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16) if amp else contextlib.nullcontext():
            return greedy_accuracy(model, tok, run_eval_problems(cfg), cfg.max_new_tokens,
                                   cfg.eval_batch_size, device, engine=decoder)
    finally:
        del decoder, model, copy   # the copy's memory (and the engine's cache) go back before shutdown


def decode_copy(module, dtype: torch.dtype):
    """A copy of a Hugging Face causal LM in `dtype` on the module's device, for decoding (None when
    the module already is in `dtype`, or is not a plain transformers model: a PEFT wrapper, say).
    Built from the module's config and filled from its state dict (copy_ casts each tensor), so the
    copy holds exactly the bits a sampler gets when these weights are published in `dtype`."""
    import torch  # here: the command refuses bad flags and --dataset before torch loads
    from transformers import AutoModelForCausalLM, PreTrainedModel  # here: the command refuses bad flags and --dataset before torch loads

    param = next(module.parameters())
    if param.dtype == dtype or not isinstance(module, PreTrainedModel) or hasattr(module, "peft_config"):
        return None
    with torch.device(param.device):
        copy = AutoModelForCausalLM.from_config(module.config, dtype=dtype,
                                                attn_implementation=module.config._attn_implementation)
    missing, unexpected = copy.load_state_dict(module.state_dict(), strict=False)
    # A tied head has no key of its own in some versions' state dicts; anything else missing is a bug.
    tied = {k for k in missing if k.endswith("lm_head.weight")} if module.config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"decode_copy: the copy does not match the module (missing {sorted(missing)[:3]}, "
                           f"unexpected {sorted(unexpected)[:3]})")
    copy.generation_config = module.generation_config
    return copy.eval()


def run_eval_problems(cfg) -> list[Problem]:
    """A training run's evaluation subset (sampler 0's and the learner's alike): --eval-dataset, else
    --dataset; with --curriculum at the tasks' starting level, so every evaluation scores the same."""
    dataset = cfg.eval_dataset or cfg.dataset
    levels = start_levels(dataset) if cfg.curriculum else None
    return eval_problems(dataset, cfg.eval_size, levels=levels)


def eval_problems(dataset: str, size: int, seed: int = 0, levels: dict[str, int] | None = None) -> list[Problem]:
    """The fixed evaluation subset: the first `size` problems of the test split (of rg: tasks at
    curriculum `levels` when given: a curriculum run is measured at its starting levels)."""
    return load_problems(dataset, "test", limit=size or None, seed=seed, levels=levels)


def greedy_accuracy(model, tok, problems: list[Problem], max_new_tokens: int, batch_size: int,
                    device: torch.device, engine=None) -> dict:
    """Greedy decoding of every problem; the share whose final answer is correct.

    Prompts and correctness are training's: the sampler's prompt rule (problem_prompt) and the
    reward set's 'correct' (score_correctness: reasoning-gym's own scorer for rg: answers that are
    not numbers, the GSM8K final-number rule otherwise), so held-out accuracy measures what the
    reward trains.

    Prompts are sorted by length before batching (less left padding); greedy decoding does
    not depend on the batch it runs in beyond float rounding, so the order does not change
    which problems are solved in any systematic way.
    """
    import torch  # here: the command refuses bad flags and --dataset before torch loads

    with torch.no_grad():
        return _greedy_accuracy(model, tok, problems, max_new_tokens, batch_size, device, engine)


def _greedy_accuracy(model, tok, problems, max_new_tokens, batch_size, device, engine) -> dict:
    from grpo.model.load import eos_ids  # here: the command refuses bad flags and --dataset before torch loads
    from grpo.model.logprobs import left_pad  # here: the command refuses bad flags and --dataset before torch loads

    was_training = model.training
    model.eval()
    t0 = time.perf_counter()
    prompts = [problem_prompt(tok, p) for p in problems]
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    texts = [""] * len(ids)
    lengths = [0] * len(ids)
    truncated = 0
    if engine is not None:   # the sampler's rollout engine (grpo.generate.engine): same greedy tokens, faster
        out = engine.generate([ids[i] for i in order], max_new_tokens, greedy=True)
        for i, row, fin in zip(order, out.token_ids, out.finished):
            row = row[:-1] if fin else row    # drop the EOS the engine keeps
            truncated += not fin
            lengths[i] = len(row)
            texts[i] = tok.decode(row, skip_special_tokens=True)
        order = []
    bar = Progress("eval problems", total=len(problems), unit="problem")
    bar.update(len(problems) - len(order))   # the engine path did them all at once
    stop = eos_ids(tok, model)   # every EOS id: the tokenizer's and the generation config's
    for s in range(0, len(order), batch_size):
        rows = order[s:s + batch_size]
        x, attn = left_pad([ids[i] for i in rows], tok.pad_token_id, device)
        width = x.shape[1]
        out = model.generate(input_ids=x, attention_mask=attn, do_sample=False,
                             max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id,
                             eos_token_id=stop, top_k=None, top_p=None, temperature=None)
        for j, row in enumerate(out[:, width:].cpu().tolist()):
            i = rows[j]
            cut = next((n for n, t in enumerate(row) if t in stop), None)
            if cut is not None:
                row = row[:cut]
            else:
                truncated += 1
            lengths[i] = len(row)
            texts[i] = tok.decode(row, skip_special_tokens=True)
        bar.update(len(rows))
    bar.close()
    t_decoded = time.perf_counter()
    scorer = correctness_scorer()   # a completion it cannot score counts as wrong, and is counted
    scored = scorer.score(problems, texts, [[] for _ in texts])
    correct = [sc.info["correct"] for sc in scored]
    answers = [final_answer(p, t) for p, t in zip(problems, texts)]
    has_answer = [sc.info["has_answer"] for sc in scored]
    if was_training:
        model.train()
    n = max(len(problems), 1)
    return {"accuracy": sum(correct) / n, "correct": int(sum(correct)), "n": len(problems),
            "has_answer": sum(has_answer) / n, "mean_completion_len": sum(lengths) / n,
            "truncated_frac": truncated / n, "top_answers": top_answers(answers),
            "completions_sha256": completions_digest(texts),
            "seconds": time.perf_counter() - t0, "decode_s": t_decoded - t0,
            "max_new_tokens": max_new_tokens, "decoder": "hf" if engine is None else "fast",
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
        problems = eval_problems(cfg.dataset, cfg.eval_size)   # a bad --dataset ends here, before torch loads
        found = find_model(cfg.model, cfg.base_model)   # a folder it cannot take too (a checkpoint's is fine)
        log.info("evaluating %s", found.what)
        from grpo.model.load import compute_dtype, load_tokenizer, pick_device, start_runtime  # here: the command refuses bad flags and --dataset before torch loads

        device = pick_device(cfg.device, cfg.gpu_id)
        # The workers' attention kernels (start_runtime turns cuDNN's off on CUDA): another kernel rounds
        # bf16 otherwise, and greedy decoding then parts from the learner's and samplers' on some problems.
        start_runtime(device, {})
        tok = load_tokenizer(found.tokenizer)
        model = load_found(found, device, compute_dtype(device))
        engine = eval_engine(model, tok, cfg.generation_backend, device)
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
