"""The fused log-prob kernels (grpo.model.fused_logprobs) under Triton's interpreter on CPU, against the
torch ops they replace (run by test_fused_logprobs.py in a process of its own with TRITON_INTERPRET=1,
which must be set before Triton is imported): values and gradients in float32 and bf16, at temperature
1 and not, a vocabulary that is no multiple of the block, no rows; the chunked, checkpointed head of a
real model through them, values and every parameter's gradient; start_runtime's switch. Their GPU test
is test_fused_logprobs_gpu.py."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from grpo.model import fused_logprobs as fl, logprobs  # noqa: E402
from grpo.model.load import load_causal_lm, start_runtime  # noqa: E402
from grpo.model.logprobs import chunked_token_logprobs, right_pad  # noqa: E402
from grpo.model.zoo import resolve_model  # noqa: E402

CPU = torch.device("cpu")


def torch_ops(x, targets, t):
    z = x.float() / t
    return z.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(z, -1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_values_and_gradients_equal_the_torch_ops(dtype, temperature):
    g = torch.Generator().manual_seed(0)
    V = 2 * fl.BLOCK + 17                                     # the last block partial
    x = (torch.randn(6, V, generator=g) * 3).to(dtype)
    targets = torch.tensor([0, V - 1, fl.BLOCK, 5, fl.BLOCK - 1, 2 * fl.BLOCK])   # first, last, block edges
    w = torch.randn(6, generator=g)
    mine, ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    got = fl.token_logprob(mine, targets, temperature)
    want = torch_ops(ref, targets, temperature)
    assert got.dtype == torch.float32 and (got < 0).all()
    torch.testing.assert_close(got, want, rtol=0, atol=2e-6)
    (got * w).sum().backward()
    (want * w).sum().backward()
    assert mine.grad.dtype == dtype
    scale = ref.grad.float().abs().max().item()
    # float32: the same arithmetic; bf16: both cast one float32 value, one rounding apart at most
    bound = 1e-6 if dtype == torch.float32 else 2 ** -7   # a bf16 step: 2^-7 of a value at most
    assert (mine.grad.float() - ref.grad.float()).abs().max().item() <= bound * scale


def test_no_rows_and_a_strided_chunk():
    x = torch.randn(4, 300)
    assert fl.token_logprob(x[:0], torch.zeros(0, dtype=torch.long), 1.0).shape == (0,)
    wide = torch.randn(3, 600)
    view = wide[:, ::2]                                       # the vocabulary not contiguous: copied first
    t = torch.tensor([1, 2, 299])
    torch.testing.assert_close(fl.token_logprob(view, t, 1.0), torch_ops(view, t, 1.0), rtol=0, atol=2e-6)


def test_check_passes():
    assert fl.check(CPU) is None


@pytest.fixture(scope="module")
def model():
    m = load_causal_lm(resolve_model("tiny-random"), CPU, torch.float32)
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(8.0) if p.dim() == 2 else None             # peaked distributions: a sensitive test
    return m


def test_the_chunked_checkpointed_head_through_them_equals_the_torch_ops(model):
    g = torch.Generator().manual_seed(1)
    ids, mask = right_pad([torch.randint(3, 49152, (n,), generator=g).tolist() for n in (11, 7, 16, 3)], 2, CPU)
    w = torch.randn(4, 15, generator=g)
    results = {}
    for fused in (False, True):
        logprobs.use_fused_head(fused)
        model.zero_grad()
        lp = chunked_token_logprobs(model, ids, mask, 0.7, chunk_elems=49152 * 5)   # 5 rows a chunk: several
        (lp * w).sum().backward()
        results[fused] = (lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
    logprobs.use_fused_head(False)
    torch.testing.assert_close(results[True][0], results[False][0], rtol=0, atol=1e-5)
    for n, grad in results[False][1].items():
        assert (results[True][1][n] - grad).abs().max().item() <= 1e-5 * grad.abs().max().item(), n


def test_start_runtime_switches_the_process():
    start_runtime(CPU, {}, fused_logprobs=True)
    assert logprobs._fused_head
    start_runtime(CPU, {})                                    # None: left as it is (the evaluate command's call)
    assert logprobs._fused_head
    start_runtime(CPU, {}, fused_logprobs=False)
    assert not logprobs._fused_head


def test_check_catches_a_wrong_gradient(monkeypatch):
    """A backward that is off by a fraction fails the check (its gradients are compared, not only its values)."""
    real = fl._TokenLogprob.backward

    def off(ctx, grad_lp):
        grad, a, b = real(ctx, grad_lp)
        return grad * 1.1, a, b
    monkeypatch.setattr(fl._TokenLogprob, "backward", staticmethod(off))
    assert "differs from torch's ops" in fl.check(CPU)
