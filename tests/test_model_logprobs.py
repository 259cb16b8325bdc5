"""Chunked log-probs equal the full-logits computation, values and gradients."""
from __future__ import annotations

import math

import pytest
import torch
from netutil import one_thread  # noqa: F401 - module-wide fixture (autouse)

from grpo.model.load import load_causal_lm
from grpo.model.logprobs import chunked_token_logprobs, right_pad, token_logprobs
from grpo.model.zoo import resolve_model


def full_logprobs(model, ids, mask, temperature):
    """The previous implementation: [B, L-1, V] float32 logits at once."""
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    logits = logits[:, :-1, :].float() / temperature
    picked = torch.gather(logits, -1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)



@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = load_causal_lm(resolve_model("tiny-random"), torch.device("cpu"), torch.float32)
    # Larger weights than the init's: peaked distributions make the test sensitive.
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(8.0) if p.dim() == 2 else None
    return m


def batch():
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(3, 49152, (n,), generator=g).tolist() for n in (11, 7, 16, 3)]
    return right_pad(seqs, 2, torch.device("cpu"))


@pytest.mark.parametrize("temperature", [0.7, 1.0])
@pytest.mark.parametrize("chunk_elems", [49152 * 5, 49152 * 64])  # 5 rows per chunk (uneven), one chunk
def test_values_and_grads_match_full_logits(model, chunk_elems, temperature):
    ids, mask = batch()
    valid = mask[:, 1:].bool()
    model.zero_grad()
    ref = full_logprobs(model, ids, mask, temperature)
    weights = torch.randn(ref.shape, generator=torch.Generator().manual_seed(2))
    (ref * weights * valid).sum().backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}

    model.zero_grad()
    got = chunked_token_logprobs(model, ids, mask, temperature, chunk_elems=chunk_elems)
    assert got.shape == (4, 15) and got.dtype == torch.float32
    assert torch.equal(got[~valid], torch.zeros(int((~valid).sum())))  # padding targets are 0
    assert (got[valid] < 0).all()
    torch.testing.assert_close(got[valid], ref[valid], rtol=0, atol=1e-6)
    (got * weights).sum().backward()
    for n, p in model.named_parameters():
        # The weight gradients are sums over rows, added chunk by chunk here: equal up to
        # float32 rounding of a different summation order, relative to the tensor's scale.
        scale = ref_grads[n].abs().max().item()
        assert scale > 0
        assert (p.grad - ref_grads[n]).abs().max().item() <= 1e-5 * scale, n


@pytest.mark.parametrize("with_entropy", [False, True])
def test_temperature_one_divides_nothing_over_the_vocabulary(model, with_entropy):
    """At T = 1 the head's logits are only cast: no division over [rows, vocab] in the forward, the
    checkpoint's recompute or the backward; at T = 0.7 there is one in each."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Divisions(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.wide = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket in (torch.ops.aten.div, torch.ops.aten.div_) and args[0].shape[-1] == 49152:
                self.wide += 1
            return out

    ids, mask = batch()
    counts = {}
    for t in (1.0, 0.7):
        with Divisions() as seen:
            out = chunked_token_logprobs(model, ids, mask, t, chunk_elems=49152 * 64, with_entropy=with_entropy)
            (out[0] if with_entropy else out).sum().backward()
        counts[t] = seen.wide
    assert counts[1.0] == 0 and counts[0.7] >= 2


def test_model_token_logprobs_uses_chunks_without_grad(model):
    ids, mask = batch()
    with torch.no_grad():
        got = token_logprobs(model, ids, mask, 1.0)
        ref = full_logprobs(model, ids, mask, 1.0)
    valid = mask[:, 1:].bool()
    torch.testing.assert_close(got[valid], ref[valid], rtol=0, atol=1e-6)
    assert not got.requires_grad


def test_first_computes_only_the_positions_asked_for(model):
    """first[b]: row b's positions before it come back 0 and never reach the LM head; the rest
    equal the full computation."""
    ids, mask = batch()   # lengths 11, 7, 16, 3: 10, 6, 15, 2 real targets
    first = torch.tensor([4, 0, 10, 1])
    head_rows = []
    hook = model.get_output_embeddings().register_forward_hook(lambda m, a, o: head_rows.append(a[0].shape[0]))
    try:
        with torch.no_grad():
            got = chunked_token_logprobs(model, ids, mask, 0.7, chunk_elems=49152 * 5, first=first)
    finally:
        hook.remove()
    with torch.no_grad():
        ref = full_logprobs(model, ids, mask, 0.7)
    assert sum(head_rows) == 6 + 6 + 5 + 1, head_rows     # positions 4-9, 0-5, 10-14, 1
    want = mask[:, 1:].bool() & (torch.arange(15)[None, :] >= first[:, None])
    assert int(want.sum()) == 18
    assert torch.equal(got[~want], torch.zeros(int((~want).sum())))
    torch.testing.assert_close(got[want], ref[want], rtol=0, atol=1e-6)


def test_chunk_memory_does_not_hold_full_logits(model):
    """Autograd keeps no [N, V] tensor alive between forward and backward: the saved
    tensors of the whole graph stay far below one float32 logits matrix."""
    g = torch.Generator().manual_seed(3)
    ids, mask = right_pad([torch.randint(3, 49152, (64,), generator=g).tolist()] * 8, 2, torch.device("cpu"))
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        chunked_token_logprobs(model, ids, mask, 1.0, chunk_elems=49152 * 32)
    full_logits_bytes = 8 * 63 * 49152 * 4
    assert sum(saved) < full_logits_bytes / 4, (sum(saved), full_logits_bytes)


def full_entropy(model, ids, mask, temperature):
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, :-1, :].float() / temperature
    p = torch.softmax(logits, dim=-1)
    return -(p * torch.log_softmax(logits, dim=-1)).sum(dim=-1)   # [B, L-1]


@pytest.mark.parametrize("chunk_elems", [49152 * 5, 49152 * 64])
def test_entropy_matches_full_logits_values_and_grads(model, chunk_elems):
    """with_entropy: the log-probs are unchanged, and the entropy of each position's whole
    distribution equals -sum p log p from full logits, with its gradient; padding is 0."""
    ids, mask = batch()
    valid = mask[:, 1:].bool()
    model.zero_grad()
    ref = full_entropy(model, ids, mask, 0.7)
    (ref * valid).sum().backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    logp, ent = chunked_token_logprobs(model, ids, mask, 0.7, chunk_elems=chunk_elems, with_entropy=True)
    with torch.no_grad():
        torch.testing.assert_close(logp, chunked_token_logprobs(model, ids, mask, 0.7, chunk_elems=chunk_elems),
                                   rtol=0, atol=0)
    assert ent.shape == (4, 15) and torch.equal(ent[~valid], torch.zeros(int((~valid).sum())))
    assert (ent[valid] > 0).all() and (ent[valid] <= math.log(49152) + 1e-4).all()
    torch.testing.assert_close(ent[valid], ref[valid], rtol=0, atol=2e-5)
    ent.sum().backward()
    for n, p in model.named_parameters():
        scale = ref_grads[n].abs().max().item()
        assert scale > 0
        assert (p.grad - ref_grads[n]).abs().max().item() <= 1e-4 * scale, n


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("cudnn", [False, True])
def test_runtime_chooses_whether_attention_may_use_cudnn(cudnn):
    """start_runtime owns SDPA's cuDNN switch (--cudnn-attention); off, a padded causal pass runs
    no cuDNN kernel and gives the math kernels' log-probs."""
    from torch.profiler import ProfilerActivity, profile

    from grpo.model.load import start_runtime

    device = torch.device("cuda", 0)
    start_runtime(device, {}, cudnn_attention=cudnn)
    assert torch.backends.cuda.cudnn_sdp_enabled() is cudnn
    if cudnn:
        return
    q, k, v = (torch.randn(4, 9, 37, 64, device=device, dtype=torch.bfloat16) for _ in range(3))
    mask = torch.ones(4, 1, 37, 37, device=device, dtype=torch.bool).tril()
    mask[1, :, :, 30:] = False   # a right-padded row
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        torch.cuda.synchronize()
    assert not [e.name for e in prof.events() if "cudnn" in e.name.lower()]
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
    assert torch.allclose(out.float(), ref, atol=2e-2)
