"""The decode attention kernel on a GPU (skipped without CUDA): in bf16 at Qwen2.5's and SmolLM2's head
shapes, split across programs or not, it gives SDPA's result within bf16 tolerance; captured in a CUDA
graph, a replay reads the cache as it is then; the engine on a half-precision model turns it on (its
check passed), its ring's steps decode through it as with SDPA, and a float32 model keeps SDPA."""
from __future__ import annotations

import pytest
import torch

from grpo.generate.decode_attention import decode_attention, splits

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
DEV = torch.device("cuda", 0)


def case(rows, kv_heads, groups, dim, n, seed=0):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    q = torch.randn(rows, kv_heads, groups, dim, device=DEV, generator=gen).bfloat16()
    key = torch.randn(rows, kv_heads, n, dim, device=DEV, generator=gen).bfloat16()
    value = torch.randn(rows, kv_heads, n, dim, device=DEV, generator=gen).bfloat16()
    pad = torch.randint(0, n // 2, (rows, 1), device=DEV, generator=gen)
    allowed = torch.arange(n, device=DEV)[None, :] >= pad
    mask = torch.where(allowed, 0.0, torch.finfo(torch.bfloat16).min).bfloat16().view(rows, 1, 1, n)
    return q, key, value, mask


@pytest.mark.parametrize("rows,kv_heads,groups,dim,n", [
    (320, 2, 7, 64, 768),    # Qwen2.5-0.5B on the ring: one program a (row, KV head)
    (320, 2, 6, 128, 768),   # 1.5B
    (4, 2, 7, 64, 700),      # few rows: the slots split across programs, then combined
    (3, 3, 3, 64, 77),       # SmolLM2-135M, a length that is no multiple of the block
    (8, 4, 7, 128, 1000),    # 7B's heads
    (5, 8, 1, 80, 130),      # no grouping, a head size that is no power of two
])
def test_kernel_equals_sdpa_in_bf16(rows, kv_heads, groups, dim, n):
    q, key, value, mask = case(rows, kv_heads, groups, dim, n)
    want = torch.nn.functional.scaled_dot_product_attention(q.float(), key.float(), value.float(),
                                                            attn_mask=mask.float(), scale=dim ** -0.5)
    got = decode_attention(q, key, value, mask, dim ** -0.5)
    assert got.dtype == torch.bfloat16 and got.shape == q.shape
    err = (got.float() - want).abs()
    assert err.max().item() < 2e-2 and err.mean().item() < 2e-3


def test_captured_kernel_reads_the_cache_as_it_is_at_each_replay():
    q, key, value, mask = case(4, 2, 7, 64, 256)
    assert splits(8, 4, torch.cuda.get_device_properties(DEV).multi_processor_count) > 1   # the combine kernel too
    decode_attention(q, key, value, mask, 0.125)            # compiled before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = decode_attention(q, key, value, mask, 0.125)
    value.mul_(2)                                           # the cache changes after the capture
    graph.replay()
    want = torch.nn.functional.scaled_dot_product_attention(q.float(), key.float(), value.float(),
                                                            attn_mask=mask.float(), scale=0.125)
    assert (out.float() - want).abs().max().item() < 4e-2


def test_engine_takes_the_kernel_in_half_precision_only():
    """The ring's captured steps through the kernel: each group's greedy tokens as with SDPA's."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from grpo.generate.engine import RolloutEngine
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(DEV).eval()
    assert not RolloutEngine(model, 2, 0).attention_kernel                    # float32: SDPA's exact path
    half = RolloutEngine(model.bfloat16(), 2, 0)
    assert half.attention_kernel and half.fallback is None
    plain = RolloutEngine(model, 2, 0, fused_attention=False)
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13], [20, 21], [30]]

    def run(eng):
        items = list(enumerate(prompts))
        return {g.key: g.token_ids for g in eng.stream(lambda: items.pop(0) if items else None, 2, 8,
                                                        greedy=True, rows=4)}
    assert run(half) == run(plain)
