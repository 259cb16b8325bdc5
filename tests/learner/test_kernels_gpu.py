"""Liger's kernels through the learner's scope on a GPU (skipped without CUDA or liger-kernel):
log-probs and gradients within bf16 of Hugging Face's layers, and the module-level names back after."""
from __future__ import annotations

import importlib.util

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.models.qwen2 import modeling_qwen2

from grpo.learner.kernels import fuse_layers
from grpo.learner.step import TrainStep
from grpo.model.logprobs import right_pad, token_logprobs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("liger_kernel") is None,
                                reason="needs a CUDA device and liger-kernel")


def qwen2(seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=2048, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg).to("cuda", torch.float32)


def test_liger_layers_match_hugging_faces_within_bf16():
    hf_rope, hf_norm = modeling_qwen2.apply_rotary_pos_emb, modeling_qwen2.Qwen2RMSNorm
    plain, model = qwen2(), qwen2()
    fused = fuse_layers(model, "on", cuda=True)
    assert fused is not None and modeling_qwen2.apply_rotary_pos_emb is hf_rope
    assert modeling_qwen2.Qwen2RMSNorm is hf_norm
    g = torch.Generator().manual_seed(1)
    ids, mask = right_pad([torch.randint(3, 2048, (n,), generator=g).tolist() for n in (40, 17, 33)], 0,
                          torch.device("cuda"))
    grads = []
    for m, f in ((plain, None), (model, fused)):
        step = TrainStep.__new__(TrainStep)
        step.autocast, step.fused = True, f
        with step.amp():
            lp = token_logprobs(m, ids, mask, 1.0)          # [3, 39]
        (-(lp * mask[:, 1:]).sum()).backward()
        grads.append((lp.detach(), [p.grad for p in m.parameters()]))
    assert modeling_qwen2.apply_rotary_pos_emb is hf_rope
    valid = mask[:, 1:].bool()
    (a, ga), (b, gb) = grads
    assert (a - b).abs()[valid].max() < 0.05 * a[valid].abs().mean()
    for x, y in zip(ga, gb):
        assert (x - y).norm() <= 0.05 * x.norm() + 1e-6
