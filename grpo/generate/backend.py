"""Backend rules and the Hugging Face fallback: which decoder a run uses (--generation-backend:
the fast engine, grpo.generate.engine, or the model's own `generate`), where the old log-probs
come from (--old-logprobs), `hf_generate` (the 'hf' backend, and what the engine decodes with on a
model it cannot serve), and the one-line reasons a fallback is said with.

Both backends return the same thing: generated ids per prompt, cut after the first EOS (which is
kept), and whether each row finished; as a batch, a Rollout (`hf_rollout` for `generate`, with
no log-probs of its own).
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from grpo.model.logprobs import left_pad
from grpo.rules.backend import backend_for

# vllm: vLLM's engine (grpo.generate.vllm_engine), an optional extra; the sampler refuses it in one
# line where vLLM is not installed
BACKENDS = ("auto", "fast", "hf", "vllm")
SAMPLED_LOGPROBS = ("fast", "vllm")   # the backends that return each sampled token's log-prob


@dataclass
class Rollout:
    """One fixed batch decoded: what RolloutEngine.generate and hf_rollout return."""
    token_ids: list[list[int]]   # generated ids per prompt, cut after the first EOS (kept)
    finished: list[bool]         # ended with EOS (False: cut at max_new_tokens)
    logprobs: list[np.ndarray] | None   # float32 log-prob of each generated token under the sampling
    #                                     distribution; None: the decoder gives none (a pass does)
    stats: dict = field(default_factory=dict)   # gen_s, decode_steps, stopped (should_stop said so), tokens, ...


def resolve_backend(name: str, device: torch.device) -> str:
    """--generation-backend to 'fast', 'hf' or 'vllm'. auto: the fast engine on CUDA (its GPU tests:
    graph replay equals eager decoding, greedy identical to `generate` in fp32, a failed capture
    falls back to eager decoding), `generate` on CPU, where the engine has
    no graphs to replay and buys little. vllm: vLLM's engine (grpo.generate.vllm_engine; the sampler
    checks it is installed)."""
    if name not in BACKENDS:
        raise ValueError(f"--generation-backend {name}: choose one of {', '.join(BACKENDS)}")
    return backend_for(name, device.type)


OLD_LOGPROBS = ("auto", "sampling", "pass")


def old_logprob_source(choice: str, backend: str, dtype: torch.dtype) -> str:
    """--old-logprobs to 'sampling' or 'pass'. The fast engine returns each sampled token's
    log-prob under the distribution it drew from (pure sampling at the temperature, the same
    distribution the learner scores), so in float32 it is the teacher-forced value (the tests check
    it to 1e-5) and the pass is redundant. In bf16 the decode step and a full forward sum in other
    orders and differ by a few hundredths of a nat a token, so auto keeps the pass there; 'sampling'
    takes the engine's values anyway. vLLM's engine returns them too (processed log-probs: after the
    temperature), under the same rule. Hugging Face generate returns no log-probs: always a pass."""
    if choice not in OLD_LOGPROBS:
        raise ValueError(f"--old-logprobs {choice}: choose one of {', '.join(OLD_LOGPROBS)}")
    if choice == "sampling" and backend not in SAMPLED_LOGPROBS:
        raise ValueError("--old-logprobs sampling needs --generation-backend fast or vllm (Hugging Face generate "
                         "returns no log-probs); use --old-logprobs pass or auto")
    if choice == "auto":
        return "sampling" if backend in SAMPLED_LOGPROBS and dtype == torch.float32 else "pass"
    return choice


def hf_generate(model, prompts: list[list[int]], max_new_tokens: int, temperature: float, greedy: bool,
                eos_id: int | list[int], pad_id: int, should_stop: Callable[[], bool] | None = None
                ) -> tuple[list[list[int]], list[bool]]:
    """The Hugging Face `generate` path (the fallback backend), with the same output.

    eos_id: one id or several (grpo.model.load.eos_ids: the tokenizer's and the generation config's); a
    row ends at the first of any. should_stop: asked after every decoded token; once it says True,
    generation ends there and the rows come back cut where they were (the caller discards them)."""
    eos = eos_list(eos_id)
    device = next(model.parameters()).device
    ids, attn = left_pad(prompts, pad_id, device)
    width = ids.shape[1]
    sample = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if not (greedy or temperature == 0) \
        else dict(do_sample=False, temperature=None, top_k=None, top_p=None)
    stopping = {"stopping_criteria": _stopping_criteria(should_stop)} if should_stop is not None else {}
    if eos:
        out = model.generate(input_ids=ids, attention_mask=attn, max_new_tokens=max_new_tokens,
                             pad_token_id=pad_id, eos_token_id=eos, **sample, **stopping)
    else:   # no EOS at all: exactly max_new_tokens (eos_token_id=None would mean the model's own)

        gc = copy.deepcopy(model.generation_config)
        gc.update(max_new_tokens=max_new_tokens, pad_token_id=pad_id, **sample)
        gc.eos_token_id = None
        out = model.generate(input_ids=ids, attention_mask=attn, generation_config=gc, **stopping)
    completions, finished = [], []
    stop = set(eos)
    for row in out[:, width:].cpu().tolist():
        cut = next((i for i, t in enumerate(row) if t in stop), None)
        if cut is not None:  # keep the EOS: the policy must learn to stop
            row = row[:cut + 1]
        completions.append(row)
        finished.append(cut is not None)
    return completions, finished


def hf_rollout(model, prompts: list[list[int]], max_new_tokens: int, temperature: float, greedy: bool,
               eos_id: int | list[int], pad_id: int, should_stop: Callable[[], bool] | None = None) -> Rollout:
    """hf_generate as a Rollout (no log-probs: Hugging Face generate returns none), with whether
    should_stop cut it short (stats["stopped"]), as RolloutEngine.generate says it."""
    t0 = time.perf_counter()
    stopped = [False]

    def stop() -> bool:   # latched: once said, the batch is cut, whatever should_stop says later
        stopped[0] = stopped[0] or bool(should_stop())
        return stopped[0]

    ids, finished = hf_generate(model, prompts, max_new_tokens, temperature, greedy, eos_id, pad_id,
                                should_stop=stop if should_stop is not None else None)
    stats = {"gen_s": time.perf_counter() - t0, "decode_steps": max((len(g) for g in ids), default=0),
             "stopped": stopped[0], "tokens": sum(len(g) for g in ids), "cuda_graphs": False}
    return Rollout(ids, finished, None, stats)


def eos_list(eos_ids) -> list[int]:
    """One EOS id, several, or none ([] / None) as a sorted list of distinct ints."""
    if eos_ids is None:
        return []
    if isinstance(eos_ids, (int, np.integer)):
        return [int(eos_ids)]
    return sorted({int(e) for e in eos_ids})


def _stopping_criteria(should_stop: Callable[[], bool]):
    """A transformers StoppingCriteriaList that ends every row once should_stop() says so."""
    class _StopWhen(StoppingCriteria):
        def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
            return torch.full((input_ids.shape[0],), bool(should_stop()), dtype=torch.bool, device=input_ids.device)

    return StoppingCriteriaList([_StopWhen()])


def describe(exc: BaseException) -> str:
    """The first line of an exception and of what it replaced (a failed capture's own error
    is raised from torch.cuda.graph's exit and hides the error that broke the capture)."""
    parts, seen = [], set()
    while exc is not None and id(exc) not in seen and len(parts) < 3:
        seen.add(id(exc))
        parts.append(f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}")
        exc = exc.__cause__ or exc.__context__
    return " <- ".join(parts)
