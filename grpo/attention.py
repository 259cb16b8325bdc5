"""The rollout engine's attention: Hugging Face's SDPA function, except for one-token (decode)
queries of grouped-KV models, which attend the cache without copying it.

Registered with transformers' AttentionInterface under ATTENTION; grpo.rollout switches a
model to it only around its own forward passes.
"""
from __future__ import annotations

import torch

ATTENTION = "grpo_rollout"


def rollout_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                      **kwargs):
    """Attention for the engine's passes. A one-token query (decode) with grouped KV heads
    (GQA: SmolLM2 3 KV heads for 9, Qwen2.5-3B 2 for 16) attends the cache without copying it:
    the G query heads that share a KV head become G "query rows" of that head. Hugging Face's
    SDPA path instead repeats the whole cache G times per layer and step (`repeat_kv`, a
    copy), which on a 3B model at 256 rows took half the decode step. Prefill (many query
    tokens, once per round) goes through Hugging Face's SDPA function unchanged."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    b, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    if q_len != 1 or heads == kv_heads:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    # repeat_kv puts query head j on KV head j // G, so [B, H, 1, D] -> [B, H_kv, G, D] pairs them up.
    q = query.view(b, kv_heads, heads // kv_heads, dim)
    out = torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=attention_mask,  # [B, 1, 1, L]
                                                           scale=scaling)
    return out.reshape(b, heads, 1, dim).transpose(1, 2).contiguous(), None                # [B, 1, H, D]


def register_attention() -> None:
    """Make ATTENTION a name Hugging Face models can dispatch to (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, rollout_attention)
