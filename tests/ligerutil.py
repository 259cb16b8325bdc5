"""A tiny real Llama, and a real patch of its modelling module shaped like Liger-Kernel's apply
function with counting stand-ins for its kernels (each computes exactly what Hugging Face's does):
for the learner's and the engine's scoping of Liger's module-level names on CPU."""
from __future__ import annotations

from types import MethodType

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama import modeling_llama


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(cfg).eval()


def liger_like_patch(calls: dict):
    """What Liger's apply function does to a model, with counting stand-ins for its kernels: the
    modelling module's rotary function and RMSNorm class replaced, each instance norm's forward
    rebound. Each stand-in computes exactly what Hugging Face's does."""
    hf_rope, hf_norm = modeling_llama.apply_rotary_pos_emb, modeling_llama.LlamaRMSNorm

    def rope(*a, **k):
        calls["rope"] += 1
        return hf_rope(*a, **k)

    def norm_forward(self, x):
        calls["norm"] += 1
        return hf_norm.forward(self, x)

    class CountingNorm(hf_norm):
        pass

    def apply(model):
        modeling_llama.apply_rotary_pos_emb = rope
        modeling_llama.LlamaRMSNorm = CountingNorm
        for layer in model.model.layers:
            layer.input_layernorm.forward = MethodType(norm_forward, layer.input_layernorm)
    return apply, rope, CountingNorm
