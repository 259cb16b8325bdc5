"""The fused log-prob kernels on a GPU (skipped without CUDA): at Qwen2.5's vocabulary in bf16, values
and gradients against torch's ops; a learner-shaped pass (bf16 autocast over float32 weights, the
chunked and checkpointed head) gives the torch ops' log-probs and weight gradients; start_runtime turns
them on there."""
from __future__ import annotations

import pytest
import torch

from grpo.model import fused_logprobs as fl, logprobs
from grpo.model.load import start_runtime
from grpo.model.logprobs import chunked_token_logprobs, right_pad

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
DEV = torch.device("cuda", 0)


def test_qwen_vocabulary_in_bf16():
    g = torch.Generator(device=DEV).manual_seed(0)
    x = (torch.randn(900, 151936, device=DEV, generator=g) * 3).bfloat16()
    targets = torch.randint(0, 151936, (900,), device=DEV, generator=g)
    w = torch.randn(900, device=DEV, generator=g)
    mine, ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    got = fl.token_logprob(mine, targets, 1.0)
    z = ref.float()
    want = z.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(z, -1)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    (got * w).sum().backward()
    (want * w).sum().backward()
    scale = ref.grad.float().abs().max().item()
    assert (mine.grad.float() - ref.grad.float()).abs().max().item() <= 2 ** -7 * scale


def test_a_learner_shaped_pass_and_start_runtime():
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=4099, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa")
    model = Qwen2ForCausalLM(cfg).to(DEV)
    g = torch.Generator().manual_seed(1)
    ids, mask = right_pad([torch.randint(3, 4099, (n,), generator=g).tolist() for n in (40, 17, 64, 5)], 0, DEV)
    w = torch.randn(4, 63, generator=g).to(DEV)
    results = {}
    try:
        for fused in (False, True):
            logprobs.use_fused_head(fused)
            model.zero_grad()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                lp = chunked_token_logprobs(model, ids, mask, 1.0, chunk_elems=4099 * 30)
            (lp * w).sum().backward()
            results[fused] = (lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
        torch.testing.assert_close(results[True][0], results[False][0], rtol=0, atol=2e-3)
        for n, grad in results[False][1].items():
            assert (results[True][1][n] - grad).abs().max().item() <= 2e-2 * grad.abs().max().item(), n
        start_runtime(DEV, {}, fused_logprobs=True)
        assert logprobs._fused_head
    finally:
        logprobs.use_fused_head(False)
