"""The decode attention kernel (grpo.generate.decode_attention) under Triton's interpreter on CPU,
against SDPA (run by test_decode_attention.py in a process of its own with TRITON_INTERPRET=1, which
must be set before Triton is imported and would send every engine of a shared process through the
interpreter): float32 and float16 (the interpreter's bf16 products are wrong, so bf16 is the GPU
test's, test_decode_attention_gpu.py), the slots in one program or split and combined, masked slots,
ungrouped heads and a head size that is no power of two; and the in-flight ring's decode through it."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from grpo.generate import decode_attention as da  # noqa: E402
from grpo.generate.engine import RolloutEngine  # noqa: E402
from grpo.model.load import load_causal_lm  # noqa: E402
from grpo.model.zoo import resolve_model  # noqa: E402

CPU = torch.device("cpu")


def case(rows, kv_heads, groups, dim, n, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, key, value = (torch.randn(shape, generator=gen).to(dtype) for shape in
                     ((rows, kv_heads, groups, dim), (rows, kv_heads, n, dim), (rows, kv_heads, n, dim)))
    allowed = torch.arange(n)[None, :] >= torch.randint(0, n // 2, (rows, 1), generator=gen)   # left padding
    mask = torch.where(allowed, 0.0, torch.finfo(dtype).min).to(dtype).view(rows, 1, 1, n)
    return q, key, value, mask


def sdpa(q, key, value, mask, scale):
    return torch.nn.functional.scaled_dot_product_attention(q.float(), key.float(), value.float(),
                                                            attn_mask=None if mask is None else mask.float(), scale=scale)


def test_available_only_on_cuda_or_under_the_interpreter(monkeypatch):
    assert da.available(CPU)
    monkeypatch.delenv("TRITON_INTERPRET")
    assert not da.available(CPU)
    assert da.available(torch.device("cuda", 0))


@pytest.mark.parametrize("rows,kv_heads,groups,dim,n", [
    (40, 2, 7, 64, 150),   # 80 programs fill the 4 "multiprocessors" CPU counts: one program a (row, head)
    (2, 2, 7, 64, 150),    # 4 programs: the slots split in 3 spans of whole blocks, then combined
    (1, 1, 3, 16, 200),    # one (row, head): 4 spans, the last one short
    (3, 4, 1, 80, 70),     # no grouping; head size 80, padded to 128 in the kernel
])
def test_equals_sdpa_in_float32_one_program_or_split(rows, kv_heads, groups, dim, n):
    q, key, value, mask = case(rows, kv_heads, groups, dim, n, torch.float32)
    blocks = -(-n // da.BLOCK_N)
    assert (da.splits(rows * kv_heads, blocks, 4) == 1) == (rows * kv_heads >= 16)
    got = da.decode_attention(q, key, value, mask, dim ** -0.5)
    assert got.dtype == torch.float32 and got.shape == q.shape and got.is_contiguous()
    assert torch.allclose(got, sdpa(q, key, value, mask, dim ** -0.5), atol=1e-5)


def test_float16_no_mask_and_strided_cache_views():
    """fp16 within its rounding; no mask; keys and values read through a view of a longer cache (the
    engine cuts the cache to the mask's width), so only the first n slots count."""
    q, key, value, _ = case(3, 2, 6, 32, 300, torch.float16)
    n = 130
    got = da.decode_attention(q, key[:, :, :n], value[:, :, :n], None, 0.2)
    want = sdpa(q, key[:, :, :n], value[:, :, :n], None, 0.2)
    assert got.dtype == torch.float16 and (got.float() - want).abs().max().item() < 2e-3


def test_a_fully_masked_slot_span_and_a_broadcast_mask():
    """A row whose first 128 slots (two whole blocks, a whole span when split) are masked, and one mask
    [1, 1, 1, n] for every row: the masked spans weigh nothing."""
    q, key, value, _ = case(2, 1, 4, 16, 256, torch.float32, seed=1)
    mask = torch.zeros(1, 1, 1, 256)
    mask[..., :128] = torch.finfo(torch.float32).min
    got = da.decode_attention(q, key, value, mask, 0.25)
    assert torch.allclose(got, sdpa(q, key, value, mask.expand(2, 1, 1, 256), 0.25), atol=1e-5)
    only = sdpa(q, key[:, :, 128:], value[:, :, 128:], None, 0.25)   # the same as the unmasked half alone
    assert torch.allclose(got, only, atol=1e-5)


def test_check_passes_at_the_model_heads_split_and_not(monkeypatch):
    chosen = []
    real = da.splits
    monkeypatch.setattr(da, "splits", lambda *a: chosen.append(real(*a)) or chosen[-1])
    assert da.check(CPU, 2, 7, 64, torch.float32) is None
    assert chosen[0] > 1 and chosen[1] == 1      # 2 rows: the slots split; 8 rows x 2 heads fill CPU's 4 x 4


@pytest.fixture(scope="module")
def tiny():
    return load_causal_lm(resolve_model("tiny-random"), CPU, torch.float32).eval()


def test_the_engine_chooses_it_and_keeps_sdpa_in_generate(tiny):
    """RolloutEngine takes the kernel where it runs (here, the interpreter) unless told not to; its
    fixed batches (generate(): evaluations, fixed rounds) keep SDPA, whose steps read the cache at a
    new length every attend_chunk slots (a compile of the kernel each)."""
    kernel = RolloutEngine(tiny, 2, 2, cuda_graphs=False)
    plain = RolloutEngine(tiny, 2, 2, cuda_graphs=False, fused_attention=False)
    assert kernel.attention_kernel and not plain.attention_kernel
    calls = []
    real = da.decode_attention
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("grpo.generate.attention.decode_attention", lambda *a: calls.append(1) or real(*a))
        kernel.generate([[5, 9, 13], [7, 8, 9, 10, 11]], 3, greedy=True)
    assert calls == []


def test_the_in_flight_ring_decodes_through_it_as_with_sdpa(tiny):
    """The ring's steps (stream(): 3 groups of 2 on 2 rows, so rows are refilled while the ring goes
    on; each row's mask its own slots) through the kernel: every group's greedy tokens as the SDPA
    engine's."""
    g = torch.Generator().manual_seed(2)
    ps = [torch.randint(3, 49000, (n,), generator=g).tolist() for n in (5, 9, 3)]

    def run(eng):
        items = list(enumerate(ps))
        return {grp.key: grp.token_ids for grp in eng.stream(lambda: items.pop(0) if items else None, 2, 5,
                                                            greedy=True, rows=2)}
    kernel = RolloutEngine(tiny, 2, 2, cuda_graphs=False, check_every=2)
    calls = []
    real = da.decode_attention
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("grpo.generate.attention.decode_attention", lambda *a: calls.append(1) or real(*a))
        got = run(kernel)
    assert len(calls) % tiny.config.num_hidden_layers == 0 and calls   # every layer of each ring step
    assert sorted(got) == list(range(3))
    assert got == run(RolloutEngine(tiny, 2, 2, cuda_graphs=False, check_every=2, fused_attention=False))
