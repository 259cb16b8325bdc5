"""Padding-free passes (grpo.model.packed): the decoder over the real tokens only gives the padded
pass's log-probs and gradients, computes no padding slot, and is used only where it is exact."""
from __future__ import annotations

import pytest
import torch
from netutil import one_thread  # noqa: F401 - module-wide fixture (autouse)
from transformers import Gemma2Config, LlamaConfig, LlamaForCausalLM, MistralConfig, Qwen2Config, Qwen2ForCausalLM

import grpo.model.packed as packed
from grpo.model.logprobs import left_pad, right_pad, token_logprobs


def llama(**kw):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=211, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=4, max_position_embeddings=64, **kw)
    return LlamaForCausalLM(cfg).float()


def qwen2_gqa():
    """Qwen2.5's layout in small: grouped KV heads (8 query heads on 2), biases on q, k, v."""
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=211, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=8,
                      num_key_value_heads=2, max_position_embeddings=64, use_sliding_window=False)
    return Qwen2ForCausalLM(cfg).float()


def rows(lengths=(11, 4, 17, 1, 9)):
    g = torch.Generator().manual_seed(1)
    return right_pad([torch.randint(3, 211, (n,), generator=g).tolist() for n in lengths], 0, torch.device("cpu"))


@pytest.mark.parametrize("make", [llama, qwen2_gqa], ids=["llama", "qwen2-gqa"])
def test_padding_free_equals_the_padded_pass_in_values_and_gradients(make):
    model = make()
    ids, mask = rows()
    first = torch.tensor([3, 0, 8, 0, 2])                       # completions start at different places
    weights = torch.randn(ids.shape[0], ids.shape[1] - 1, generator=torch.Generator().manual_seed(2))
    got = {}
    for free in (False, True):
        model.zero_grad()
        logp, ent = token_logprobs(model, ids, mask, 0.7, with_entropy=True, first=first, padding_free=free)
        ((logp + 0.1 * ent) * weights).sum().backward()
        got[free] = (logp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
    (lp0, e0, g0), (lp1, e1, g1) = got[False], got[True]
    want = mask[:, 1:].bool() & (torch.arange(ids.shape[1] - 1)[None, :] >= first[:, None])
    assert int(want.sum()) == 10 - 3 + 3 + 16 - 8 + 0 + 8 - 2     # 7 + 3 + 8 + 0 + 6 targets asked for
    assert torch.equal(lp1[~want], torch.zeros(int((~want).sum()))) and (lp1[want] < 0).all()
    torch.testing.assert_close(lp1, lp0, rtol=0, atol=1e-5)
    torch.testing.assert_close(e1, e0, rtol=0, atol=1e-5)
    for n in g0:
        scale = g0[n].abs().max().item()
        assert (g1[n] - g0[n]).abs().max().item() <= 1e-5 * max(scale, 1e-6), n


def test_the_layers_see_only_real_tokens_at_their_own_positions_and_no_mask(monkeypatch):
    model = qwen2_gqa()
    ids, mask = rows((5, 2, 3))                                 # 10 real tokens in [3, 5]
    seen, positions = [], []
    attend = packed.packed_attention

    def spy(module, query, key, value, attention_mask, *args, **kwargs):
        seen.append((tuple(query.shape), tuple(key.shape), attention_mask))
        return attend(module, query, key, value, attention_mask, *args, **kwargs)

    monkeypatch.setattr(packed, "packed_attention", spy)
    embed = model.get_input_embeddings().register_forward_hook(lambda m, a, o: positions.append(a[0].clone()))
    rope = model.model.rotary_emb.register_forward_hook(lambda m, a, o: positions.append(a[1].clone()))
    try:
        with torch.no_grad():
            token_logprobs(model, ids, mask, 1.0)
    finally:
        embed.remove()
        rope.remove()
    assert seen == [((1, 8, 10, 8), (1, 2, 10, 8), None)] * 3      # three layers, [1, H, T, D], no [T, T] mask
    tokens, pos = positions
    assert tokens.tolist() == [ids[0, :5].tolist() + ids[1, :2].tolist() + ids[2, :3].tolist()]
    assert pos.tolist() == [[0, 1, 2, 3, 4, 0, 1, 0, 1, 2]]
    assert model.config._attn_implementation == "sdpa"          # put back after the pass


def test_off_the_padded_rows_go_through_as_they_are(monkeypatch):
    model = llama()
    calls = []
    monkeypatch.setattr(packed, "packed_decoder", lambda *a: calls.append(a) or (_ for _ in ()).throw(AssertionError))
    ids, mask = rows()
    with torch.no_grad():
        token_logprobs(model, ids, mask, 1.0, padding_free=False)
    assert calls == []


def test_left_padded_rows_are_refused_and_the_attention_setting_restored():
    model = llama()
    ids, mask = left_pad([[5, 6, 7], [8]], 0, torch.device("cpu"))
    with pytest.raises(ValueError, match="right-padded rows"), torch.no_grad():
        token_logprobs(model, ids, mask, 1.0)
    assert model.config._attn_implementation == "sdpa"


def test_packable_by_hand():
    assert packed.packable(llama()) is None and packed.packable(qwen2_gqa()) is None
    sliding = Qwen2ForCausalLM(Qwen2Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                           num_attention_heads=2, num_key_value_heads=1, use_sliding_window=True,
                                           sliding_window=8, max_window_layers=0))
    assert packed.packable(sliding) == "it has sliding-window layers"

    class Fake:
        def __init__(self, cfg):
            self.config = cfg

    mistral = MistralConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                            num_attention_heads=2, num_key_value_heads=1, sliding_window=4096)
    assert packed.packable(Fake(mistral)) == "it attends through a sliding window"
    mistral.sliding_window = None
    assert packed.packable(Fake(mistral)) is None
    gemma2 = Gemma2Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    assert packed.packable(Fake(gemma2)) == "model type 'gemma2' is not one of llama, qwen2, qwen3, mistral"
    assert packed.packable(object()) == "model type None is not one of llama, qwen2, qwen3, mistral"


def test_an_unpackable_model_takes_the_padded_pass():
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=211, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1, use_sliding_window=True,
                                         sliding_window=4, max_window_layers=0)).float()
    ids, mask = rows()
    with torch.no_grad():
        a = token_logprobs(model, ids, mask, 1.0, padding_free=True)
        b = token_logprobs(model, ids, mask, 1.0, padding_free=False)
    assert torch.equal(a, b)                                    # the same pass: sliding windows need the mask
