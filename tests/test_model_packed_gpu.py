"""Padding-free passes on a GPU (skipped without CUDA): in bf16 autocast, as the learner runs them,
the log-probs and gradients within bf16 of the padded pass, and the attention on flash kernels."""
from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import Qwen2Config, Qwen2ForCausalLM

from grpo.model.logprobs import right_pad, token_logprobs

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def qwen2() -> Qwen2ForCausalLM:
    """Qwen2.5-0.5B's layer shapes (14 query heads on 2 KV heads, head size 64), 4 layers, fp32 weights."""
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=4096, hidden_size=896, intermediate_size=4864, num_hidden_layers=4,
                      num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True,
                      use_sliding_window=False)
    return Qwen2ForCausalLM(cfg).to("cuda", torch.float32)


def batch(n: int = 24):
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(60, 600, (n,), generator=g).tolist()
    return right_pad([torch.randint(3, 4096, (k,), generator=g).tolist() for k in lengths], 0, torch.device("cuda"))


def test_padding_free_matches_the_padded_pass_within_bf16():
    model = qwen2()
    ids, mask = batch()
    valid = mask[:, 1:].bool()
    out = {}
    for free in (False, True):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logp = token_logprobs(model, ids, mask, 1.0, padding_free=free)           # [B, L-1]
        (-(logp * valid).sum() / valid.sum()).backward()
        out[free] = (logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
    (a, ga), (b, gb) = out[False], out[True]
    diff = (a - b).abs()[valid]
    assert diff.mean().item() < 5e-3 and diff.max().item() < 0.1, (diff.mean().item(), diff.max().item())
    rel = {n: ((ga[n] - gb[n]).norm() / ga[n].norm().clamp_min(1e-30)).item() for n in ga}
    assert max(rel.values()) < 0.05, max(rel.items(), key=lambda kv: kv[1])


def test_the_packed_attention_runs_on_flash_kernels():
    """With only the flash backend allowed, the padded pass (a padding mask) cannot run and the
    packed one can, forward and backward."""
    model = qwen2()
    ids, mask = batch(6)
    with torch.autocast("cuda", dtype=torch.bfloat16), sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        token_logprobs(model, ids, mask, 1.0, padding_free=True).sum().backward()
        with pytest.raises(RuntimeError):
            token_logprobs(model, ids, mask, 1.0, padding_free=False)
