"""--generation-backend: which path generates a sampler's rounds, and the Hugging Face one.

`fast` is grpo.rollout's engine (static cache, captured decode step); `hf` is the model's own
`generate`, kept as the fallback and for CPU. Both return the same thing: generated ids per
prompt, cut after the first EOS (which is kept), and whether each row finished.
"""
from __future__ import annotations

import torch

from grpo.model import left_pad

BACKENDS = ("auto", "fast", "hf")


def resolve_backend(name: str, device: torch.device) -> str:
    """--generation-backend to 'fast' or 'hf'. auto: the fast engine on CUDA (its GPU tests
    pass on H200: graph replay equals eager decoding, greedy identical to `generate` in fp32,
    a failed capture falls back to eager decoding), `generate` on CPU, where the engine has
    no graphs to replay and buys little."""
    if name not in BACKENDS:
        raise ValueError(f"--generation-backend {name}: choose one of {', '.join(BACKENDS)}")
    if name == "auto":
        return "fast" if device.type == "cuda" else "hf"
    return name


def hf_generate(model, prompts: list[list[int]], max_new_tokens: int, temperature: float, greedy: bool,
                eos_id: int, pad_id: int) -> tuple[list[list[int]], list[bool]]:
    """The Hugging Face `generate` path (the fallback backend), with the same output."""
    device = next(model.parameters()).device
    ids, attn = left_pad(prompts, pad_id, device)
    width = ids.shape[1]
    sample = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if not (greedy or temperature == 0) \
        else dict(do_sample=False, temperature=None, top_k=None, top_p=None)
    out = model.generate(input_ids=ids, attention_mask=attn, max_new_tokens=max_new_tokens,
                         pad_token_id=pad_id, eos_token_id=eos_id, **sample)
    completions, finished = [], []
    for row in out[:, width:].cpu().tolist():
        if eos_id in row:  # keep the EOS: the policy must learn to stop
            row = row[:row.index(eos_id) + 1]
        completions.append(row)
        finished.append(bool(row) and row[-1] == eos_id)
    return completions, finished
