"""The rollout engine (grpo/generate/) on tiny random float32 models of several
architectures, built from configs (no downloads): greedy tokens equal Hugging Face generate's,
sampled log-probs equal a teacher-forced pass, one engine serves many rounds of different prompt
lengths, in fixed batches and in flight. Sliding-window layers (Mistral, Phi-3, Gemma2, Gemma3;
windows longer and shorter than the sequence), Gemma2's attention soft-capping, several EOS ids,
and the fallback to Hugging Face generate for a model the engine cannot serve."""
from __future__ import annotations

import copy
import logging

import numpy as np
import pytest
import torch
from netutil import one_thread  # noqa: F401 - module-wide fixture (autouse)

from grpo.generate.attention import layer_plan, rollout_attention
from grpo.generate.backend import hf_generate
from grpo.generate.engine import RolloutEngine
from grpo.model.load import eos_ids
from grpo.model.logprobs import right_pad, token_logprobs

CPU = torch.device("cpu")
VOCAB, EOS, PAD = 96, 1, 0
NEW = 8
SHAPE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=128, bos_token_id=2, eos_token_id=EOS, pad_token_id=PAD)


def _config(name: str):
    import transformers as T

    short, long_ = 4, 64   # a window shorter than every prompt + completion; one longer than any
    four = dict(num_hidden_layers=4)
    two = dict(num_hidden_layers=2)
    if name == "llama":
        return T.LlamaConfig(**SHAPE, **two)
    if name == "qwen2":
        return T.Qwen2Config(**SHAPE, **two)
    if name == "qwen3":
        return T.Qwen3Config(**SHAPE, **two, head_dim=16)
    if name.startswith("mistral"):
        return T.MistralConfig(**SHAPE, **two, sliding_window=short if name.endswith("short") else long_)
    if name.startswith("phi3"):
        window = {"phi3": None, "phi3-window": short}[name]
        return T.Phi3Config(**SHAPE, **two, sliding_window=window)
    if name.startswith("gemma2"):
        # A small attention cap so soft-capping changes the scores of a random model.
        return T.Gemma2Config(**SHAPE, **four, head_dim=16, attn_logit_softcapping=0.5,
                              sliding_window=short if name.endswith("short") else long_)
    if name.startswith("gemma3"):
        return T.Gemma3TextConfig(**SHAPE, **four, head_dim=16,
                                  sliding_window=short if name.endswith("short") else long_,
                                  layer_types=["sliding_attention", "full_attention"] * 2)
    if name == "olmo2":
        return T.Olmo2Config(**SHAPE, **two)
    raise KeyError(name)


def _model_class(cfg):
    import transformers as T

    return {"llama": T.LlamaForCausalLM, "qwen2": T.Qwen2ForCausalLM, "qwen3": T.Qwen3ForCausalLM,
            "mistral": T.MistralForCausalLM, "phi3": T.Phi3ForCausalLM, "gemma2": T.Gemma2ForCausalLM,
            "gemma3_text": T.Gemma3ForCausalLM, "olmo2": T.Olmo2ForCausalLM}[cfg.model_type]


def build(name: str, seed: int = 0):
    cfg = _config(name)
    if getattr(cfg, "attn_logit_softcapping", None):
        # as grpo.model.load.load_causal_lm loads such models: SDPA cannot cap (transformers 5.17 picks
        # it for Gemma2 and drops the cap, so its generate would be the wrong reference)
        cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = _model_class(cfg)(cfg).eval()
    with torch.no_grad():   # larger weights than the default init: attention scores that matter
        for n, p in model.named_parameters():
            if p.dim() == 2 and ("q_proj" in n or "k_proj" in n or "qkv_proj" in n):
                p.mul_(8.0)
    model.generation_config.eos_token_id = EOS
    model.generation_config.pad_token_id = PAD
    return model


ARCHS = ["llama", "qwen2", "qwen3", "mistral", "mistral-short", "phi3", "phi3-window", "gemma2", "gemma2-short",
         "gemma3", "gemma3-short", "olmo2"]
_MODELS: dict[str, torch.nn.Module] = {}


@pytest.fixture(params=ARCHS)
def arch(request):
    name = request.param
    if name not in _MODELS:
        _MODELS[name] = build(name)
    return name, _MODELS[name]


def prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in lengths]


def source(items):
    """next_prompt for stream(): the (key, ids) items in order, then None."""
    it = iter(items)
    return lambda: next(it, None)


ROUNDS = [(5, 9, 3), (7, 2), (11, 4, 6, 1)]   # different widths and batch sizes, one engine


def test_plan_covers_sliding_layers(arch):
    name, model = arch
    plan = layer_plan(model)
    sliding = "mistral" in name or "window" in name or "gemma" in name
    assert ("sliding_attention" in plan.kinds) == sliding
    assert plan.mixed == name.startswith("gemma")
    assert RolloutEngine(model, EOS, PAD).fallback is None


def check_greedy_rounds(model, engine) -> list:
    """Greedy tokens of each round in ROUNDS equal Hugging Face generate's; the results. Shared with
    the GPU matrix (test_architectures_gpu.py), which passes an engine with CUDA graphs."""
    results = []
    for r, lengths in enumerate(ROUNDS):
        ps = prompts(lengths, seed=r)
        ref, ref_fin = hf_generate(model, ps, NEW, 1.0, True, [EOS], PAD)
        got = engine.generate(ps, NEW, greedy=True)
        assert got.token_ids == ref and got.finished == ref_fin, r
        results.append(got)
    return results


def teacher_forced(model, ps, completions, temperature):
    whole = [p + g for p, g in zip(ps, completions)]
    ids, mask = right_pad(whole, PAD, next(model.parameters()).device)
    with torch.no_grad():
        tf = token_logprobs(model, ids, mask, temperature).float().cpu()
    return [tf[i, len(p) - 1:len(p) - 1 + len(g)].numpy() for i, (p, g) in enumerate(zip(ps, completions))]


def check_sampled_rounds(model, engine) -> None:
    """Sampled log-probs of each round equal a teacher-forced pass to 1e-5."""
    for r, lengths in enumerate(ROUNDS):
        ps = prompts(lengths, seed=10 + r)
        got = engine.generate(ps, NEW, temperature=0.8)
        for lp, ref in zip(got.logprobs, teacher_forced(model, ps, got.token_ids, 0.8)):
            assert lp.shape == ref.shape
            np.testing.assert_allclose(lp, ref, rtol=0, atol=1e-5)


def check_in_flight(model, engine) -> None:
    """stream(): rows refilled while others decode, the ring wrapping; greedy rows as generate's,
    sampled log-probs as a teacher-forced pass. `engine` checks every 3 steps (check_every=3)."""
    ps = prompts((5, 9, 3, 8, 1), seed=2)
    ref, _ = hf_generate(model, ps, NEW, 1.0, True, [EOS], PAD)
    got = list(engine.stream(source(enumerate(ps)), 2, NEW, greedy=True, rows=4))
    assert sorted(g.key for g in got) == list(range(len(ps)))
    for g in got:
        assert g.token_ids == [ref[g.key]] * 2
    torch.manual_seed(4)
    for g in engine.stream(source(enumerate(ps)), 2, NEW, temperature=0.8, rows=4):
        p = ps[g.key]
        for lp, want in zip(g.logprobs, teacher_forced(model, [p, p], g.token_ids, 0.8)):
            np.testing.assert_allclose(lp, want, rtol=0, atol=1e-5)


class SwapAt:
    """A stream's swap(): at its n-th call copies `new`'s weights into `model` in place and says
    `version`; None otherwise. Counts the calls; `before` (if given) is called first at each."""

    def __init__(self, model, new, n: int, version: int = 1, before=None):
        self.model, self.new, self.n, self.version, self.before, self.calls = model, new, n, version, before, 0

    def __call__(self):
        self.calls += 1
        if self.before is not None:
            self.before()
        if self.calls != self.n:
            return None
        with torch.no_grad():
            for p, q in zip(self.model.parameters(), self.new.parameters()):
                p.copy_(q)
        return self.version


def mixed_decode(models: dict, prompt: list[int], tokens: list[int], versions: list[int], temperature: float):
    """What a token's log-prob must be when weights change mid-sequence and the KV cache is kept:
    Hugging Face's own forward with one DynamicCache, the prompt prefilled by models[versions[0]]
    (its last logits give token 0), then token c - 1 fed by models[versions[c]] (its logits give
    token c): each key and value computed by the weights in force when it was fed, never recomputed.
    (log-prob of each token at `temperature`, greedy pick at each position)."""
    from transformers import DynamicCache

    first = models[versions[0]]
    device = next(first.parameters()).device
    cache = DynamicCache(config=first.config)
    lps, picks = [], []
    with torch.no_grad():
        logits = first(input_ids=torch.tensor([prompt], device=device), past_key_values=cache,
                       use_cache=True).logits[0, -1]
        for c, tok in enumerate(tokens):
            if c > 0:
                logits = models[versions[c]](input_ids=torch.tensor([[tokens[c - 1]]], device=device),
                                             past_key_values=cache, use_cache=True).logits[0, -1]
            lps.append(torch.log_softmax(logits.float() / temperature, -1)[tok].item())
            picks.append(int(logits.argmax()))
    return np.array(lps, dtype=np.float32), picks


def check_swap_in_flight(old, new, engine_of) -> None:
    """stream() with new weights copied in at its first check (after step 3), without draining:
    3 prompts, G=2 on 3 rows. Prompt 0's rows and prompt 1's first were refilled at step 0: tokens
    0-3 by version 0, the rest by 1; prompt 1's second sample waited for a row (prefilled at 0): its
    first token 0, the rest 1; prompt 2 was prefilled after the swap: all 1 (cut at EOS wherever it
    comes). Each log-prob (and greedy pick) is Hugging Face's own forward over a kept cache
    (mixed_decode). The ring's captured step is the same graph before and after the swap.
    engine_of(model) -> an engine with check_every=3 on that model (a copy of `old`: the swap writes it)."""
    ps = prompts((5, 9, 3), seed=6)
    span, waited, after = [0] * 4 + [1] * NEW, [0] + [1] * NEW, [1] * NEW
    for temperature in (0.0, 0.8):
        model = copy.deepcopy(old)
        engine = engine_of(model)
        graphs = []

        def seen():
            graphs.append(next(iter(engine.ring.rings.values())).graphs.get(temperature == 0))
        swap = SwapAt(model, new, 1, before=seen)
        torch.manual_seed(4)
        got = {g.key: g for g in engine.stream(source(enumerate(ps)), 2, NEW, temperature=temperature, rows=3,
                                               swap=swap)}
        assert sorted(got) == [0, 1, 2] and swap.calls >= 2
        for k, want in {0: [span, span], 1: [span, waited], 2: [after, after]}.items():
            assert [v.tolist() for v in got[k].versions] == [w[:len(r)] for w, r in zip(want, got[k].token_ids)], k
        assert got[2].min_version == got[2].max_version == 1 and got[1].max_version == 1
        models = {0: old, 1: new}
        for k, g in got.items():
            for r, lp, v in zip(g.token_ids, g.logprobs, g.versions):
                ref_lp, picks = mixed_decode(models, ps[k], r, v.tolist(), temperature or 1.0)
                np.testing.assert_allclose(lp, ref_lp, rtol=0, atol=1e-5)
                if temperature == 0:
                    assert r == picks
        assert engine.graph_failures == 0 and all(gr is graphs[0] for gr in graphs)
        assert (graphs[0] is not None) == engine.cuda_graphs


def test_greedy_equals_generate_over_rounds(arch):
    _, model = arch
    check_greedy_rounds(model, RolloutEngine(model, EOS, PAD))


def test_sampled_logprobs_equal_teacher_forced_over_rounds(arch):
    _, model = arch
    torch.manual_seed(3)   # the engine seeds its generator from torch's
    check_sampled_rounds(model, RolloutEngine(model, EOS, PAD))


def test_in_flight_equals_generate(arch):
    _, model = arch
    check_in_flight(model, RolloutEngine(model, EOS, PAD, check_every=3))


def test_in_flight_swaps_weights_without_draining(arch):
    name, model = arch
    check_swap_in_flight(model, build(name, seed=1), lambda m: RolloutEngine(m, EOS, PAD, check_every=3))


def test_softcapped_attention_equals_gemma2_eager():
    """Soft-capped attention, prefill (causal mask) and grouped-head decode, against Hugging Face's
    eager Gemma2 attention (which repeats K/V per query head); the cap changes the result."""
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    class Attn(torch.nn.Module):
        num_key_value_groups = 2
        training = False

    torch.manual_seed(0)
    b, heads, kv, length, dim = 2, 4, 2, 6, 8
    k, v = torch.randn(b, kv, length, dim, dtype=torch.float64), torch.randn(b, kv, length, dim, dtype=torch.float64)
    neg = torch.finfo(torch.float64).min
    for q_len in (length, 1):
        q = 3 * torch.randn(b, heads, q_len, dim, dtype=torch.float64)
        mask = torch.zeros(b, 1, q_len, length, dtype=torch.float64)
        if q_len > 1:
            mask = mask.masked_fill(torch.ones(q_len, length, dtype=torch.bool).triu(1), neg)
        mask[0, ..., :2] = neg
        mask[0, :, :2, :2] = 0.0 if q_len > 1 else neg   # padding queries see themselves (as the engine's)
        got, _ = rollout_attention(Attn(), q, k, v, mask, scaling=0.5, softcap=1.5)
        want, _ = eager_attention_forward(Attn(), q, k, v, mask, scaling=0.5, softcap=1.5)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        uncapped, _ = rollout_attention(Attn(), q, k, v, mask, scaling=0.5)
        assert not torch.allclose(uncapped, want)


def test_several_eos_ids_stop_at_either():
    """A generation config listing two EOS ids (as Llama 3's and Qwen2.5's do): eos_ids gives both
    with the tokenizer's, and the engine (fixed batch and in flight) and hf_generate stop at either."""
    class Tok:
        eos_token_id = EOS

    model = build("qwen2")
    ps = prompts((5, 9, 3), seed=0)
    free, _ = hf_generate(model, ps, NEW, 1.0, True, [], PAD)     # no EOS at all: NEW tokens each
    assert all(len(r) == NEW for r in free)
    # a ends row 0 at token i, b row 1 at token j (neither comes earlier in either row; both past the first)
    i, j = next((i, j) for i in range(1, NEW) for j in range(1, NEW)
                if free[0][i] != free[1][j] and not {free[0][i], free[1][j]} & set(free[0][:i] + free[1][:j]))
    a, b = free[0][i], free[1][j]
    model.generation_config.eos_token_id = [a, b]
    ids = eos_ids(Tok(), model)
    assert ids == sorted({EOS, a, b})
    assert eos_ids(Tok(), model.generation_config) == ids and eos_ids(Tok()) == [EOS]
    ref, ref_fin = hf_generate(model, ps, NEW, 1.0, True, ids, PAD)
    assert ref[0] == free[0][:i + 1] and ref[1] == free[1][:j + 1] and ref_fin[:2] == [True, True]
    engine = RolloutEngine(model, ids, PAD)
    got = engine.generate(ps, NEW, greedy=True)
    assert got.token_ids == ref and got.finished == ref_fin
    streamed = {g.key: g for g in engine.stream(source(enumerate(ps[:2])), 1, NEW, greedy=True, rows=2)}
    assert streamed[0].token_ids == [ref[0]] and streamed[1].token_ids == [ref[1]]
    assert streamed[0].finished == streamed[1].finished == [True]


def test_unservable_model_falls_back_to_hf_generate(caplog, monkeypatch):
    """A model the engine cannot serve is said once, at construction, and then decoded by Hugging
    Face generate, with log-probs from a teacher-forced pass: fixed batches and in flight."""
    model = build("llama")
    ps = prompts((5, 9, 3), seed=1)
    ref, ref_fin = hf_generate(model, ps, NEW, 1.0, True, [EOS], PAD)
    model.config.attention_chunk_size = 4        # as Llama 4's chunked attention layers
    try:
        with caplog.at_level(logging.WARNING, logger="grpo.generate.engine"):
            engine = RolloutEngine(model, EOS, PAD)
    finally:
        del model.config.attention_chunk_size
    assert engine.fallback == "llama uses chunked attention"
    lines = [r.getMessage() for r in caplog.records if "cannot serve" in r.getMessage()]
    assert len(lines) == 1 and "chunked attention" in lines[0] and "Hugging Face generate" in lines[0]
    got = engine.generate(ps, NEW, greedy=True)
    assert got.token_ids == ref and got.finished == ref_fin and got.stats["fallback"]
    torch.manual_seed(2)
    sampled = engine.generate(ps, NEW, temperature=0.8)
    for lp, want in zip(sampled.logprobs, teacher_forced(model, ps, sampled.token_ids, 0.8)):
        np.testing.assert_allclose(lp, want, rtol=0, atol=1e-6)
    groups = list(engine.stream(source(enumerate(ps)), 2, NEW, greedy=True, rows=4))
    assert sorted(g.key for g in groups) == [0, 1, 2]
    assert all(g.token_ids == [ref[g.key]] * 2 for g in groups)
    # A first decode that fails (here: the prefill raises) is a fallback too, found at start-up.
    monkeypatch.setattr(RolloutEngine, "_prefill", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    assert RolloutEngine(model, EOS, PAD).fallback == "a test decode failed: RuntimeError: boom"


def test_fallback_stream_swaps_weights_between_its_batches():
    """On the Hugging Face fallback, stream's swap() is asked after each fixed batch (which has
    drained): 3 prompts, G=2 on 4 rows are two batches; new weights copied in after the first. The
    first batch's tokens carry the start version and are the old weights', the second's the new
    version and the new weights' (tokens and log-probs)."""
    model, new = build("llama"), build("llama", seed=1)
    ps = prompts((5, 9, 3), seed=4)
    old_ref, _ = hf_generate(model, ps, NEW, 1.0, True, [EOS], PAD)
    new_ref, _ = hf_generate(new, ps, NEW, 1.0, True, [EOS], PAD)
    assert old_ref[2] != new_ref[2]
    model.config.attention_chunk_size = 4        # as in the test above: a model the engine cannot serve
    try:
        engine = RolloutEngine(model, EOS, PAD)
    finally:
        del model.config.attention_chunk_size
    assert engine.fallback is not None
    calls = []

    def swap():
        calls.append(1)
        if len(calls) > 1:
            return None
        with torch.no_grad():
            for p, q in zip(model.parameters(), new.parameters()):
                p.copy_(q)
        return 3

    got = {g.key: g for g in engine.stream(source(enumerate(ps)), 2, NEW, greedy=True, rows=4, swap=swap, version=2)}
    assert sorted(got) == [0, 1, 2] and len(calls) == 2
    for k, (ref, v) in {0: (old_ref, 2), 1: (old_ref, 2), 2: (new_ref, 3)}.items():
        assert got[k].token_ids == [ref[k]] * 2, k
        assert [x.tolist() for x in got[k].versions] == [[v] * len(ref[k])] * 2
        assert (got[k].min_version, got[k].max_version) == (v, v)
    for lp, want in zip(got[2].logprobs, teacher_forced(new, [ps[2]] * 2, got[2].token_ids, 1.0)):
        np.testing.assert_allclose(lp, want, rtol=0, atol=1e-6)
