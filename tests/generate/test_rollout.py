"""The fast rollout engine (grpo/generate/) on CPU: same tokens as HF generate, exact EOS
and padding handling, log-probs that match a teacher-forced pass, and correct sampling."""
from __future__ import annotations

from pathlib import Path

import copy

import numpy as np
import pytest
import torch
from netutil import one_thread  # noqa: F401 - module-wide fixture (autouse)

from grpo.generate.attention import attend_limit
from grpo.generate.backend import hf_generate, hf_rollout, old_logprob_source, resolve_backend
from grpo.generate.batch import BatchStream
from grpo.generate.engine import RolloutEngine, generate, group_versions, token_versions
from grpo.model.load import load_causal_lm, load_tokenizer
from grpo.model.logprobs import right_pad, token_logprobs
from grpo.model.zoo import resolve_model
from test_architectures import SwapAt, mixed_decode

CPU = torch.device("cpu")
GSM8K = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k"


@pytest.fixture(scope="module")
def tiny():
    return load_causal_lm(resolve_model("tiny-random"), CPU, torch.float32).eval()


def prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 49000, (n,), generator=g).tolist() for n in lengths]


def test_greedy_matches_hf_generate_with_left_padding_and_buckets(tiny):
    ps = prompts((5, 9, 3, 12, 1))
    ref, ref_fin = hf_generate(tiny, ps, 12, 1.0, True, eos_id=2, pad_id=2)
    # Exact sizes, and buckets that add padding rows and a wider (rounded-up) prompt.
    for kw in ({}, {"buckets": (4, 8), "prompt_multiple": 16}):
        got = RolloutEngine(tiny, 2, 2, **kw).generate(ps, 12, greedy=True)
        assert got.token_ids == ref and got.finished == ref_fin
        assert all(len(r) == 12 for r in got.token_ids)  # random weights: no EOS in 12 tokens
    # temperature 0 means greedy, through the module function that keeps an engine per model
    ids, fin = generate(tiny, ps, 12, temperature=0.0, eos_id=2, pad_id=2)
    assert ids == ref and fin == ref_fin


def test_eos_cuts_rows_and_pads_after_like_hf(tiny):
    ps = prompts((4, 7, 6))
    free = RolloutEngine(tiny, 2, 2).generate(ps, 10, greedy=True).token_ids
    eos = free[0][3]               # make the 4th greedy token of row 0 the EOS
    pad = 7                        # a pad id distinct from EOS, so both can be told apart
    eng = RolloutEngine(tiny, eos, pad)
    got = eng.generate(ps, 10, greedy=True)
    ref, ref_fin = hf_generate(tiny, ps, 10, 1.0, True, eos_id=eos, pad_id=pad)
    assert got.token_ids == ref and got.finished == ref_fin
    first = free[0].index(eos)
    assert got.token_ids[0] == free[0][:first + 1] and got.finished[0]
    for row, fin, full in zip(got.token_ids, got.finished, free):
        assert fin == (eos in full)
        assert row == (full[:full.index(eos) + 1] if fin else full)
    # The raw buffer: after a row's EOS only padding, with log-prob 0.
    slot = next(iter(eng.slots.values()))
    raw = slot.out[0].tolist()
    assert raw[:first + 1] == free[0][:first + 1] and raw[first + 1:] == [pad] * (10 - first - 1)
    assert torch.all(slot.out_lp[0, first + 1:] == 0) and torch.all(slot.out_lp[0, :first + 1] < 0)
    assert len(got.logprobs[0]) == first + 1


def test_early_stop_when_all_rows_finished(tiny):
    ps = prompts((4, 4), seed=3)
    ps[1] = list(ps[0])
    free = RolloutEngine(tiny, 2, 2).generate(ps, 12, greedy=True).token_ids
    eng = RolloutEngine(tiny, free[0][1], 2, check_every=2)
    got = eng.generate(ps, 40, greedy=True)
    cut = free[0].index(free[0][1]) + 1
    assert got.token_ids == [free[0][:cut]] * 2 and got.finished == [True, True]
    assert got.stats["decode_steps"] == 2  # checked at step 2, all done: 38 steps saved


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_match_teacher_forced_pass(tiny, temperature):
    torch.manual_seed(5)
    ps = prompts((6, 3, 10, 8), seed=1)
    got = RolloutEngine(tiny, 2, 2).generate(ps, 16, temperature=temperature)
    whole = [p + g for p, g in zip(ps, got.token_ids)]
    ids, mask = right_pad(whole, 2, CPU)
    with torch.no_grad():
        tf = token_logprobs(tiny, ids, mask, temperature)
    for i, (p, g) in enumerate(zip(ps, got.token_ids)):
        ref = tf[i, len(p) - 1:len(p) - 1 + len(g)].numpy()
        assert got.logprobs[i].dtype == np.float32 and got.logprobs[i].shape == ref.shape == (16,)
        np.testing.assert_allclose(got.logprobs[i], ref, rtol=0, atol=1e-4)


def test_sampling_follows_the_softmax_distribution(tiny):
    """First-token frequencies over 2000 draws against softmax(logits / T)."""
    p = prompts((5,), seed=7)[0]
    with torch.no_grad():
        logits = tiny(input_ids=torch.tensor([p])).logits[0, -1].float()
    T = 0.02  # random weights give flat logits; a low temperature makes a few tokens likely
    probs = torch.softmax(logits / T, -1)
    top = probs.topk(4)
    assert top.values.sum() > 0.5, top.values  # the check below is then meaningful
    torch.manual_seed(11)
    n = 2000
    got = RolloutEngine(tiny, 2, 2).generate([p] * n, 1, temperature=T)
    first = torch.tensor([r[0] for r in got.token_ids])
    for tok_id, pr in zip(top.indices.tolist(), top.values.tolist()):
        freq = (first == tok_id).float().mean().item()
        sigma = (pr * (1 - pr) / n) ** 0.5
        assert abs(freq - pr) < 5 * sigma + 1e-3, (tok_id, freq, pr)


def test_backend_choice_and_bad_inputs(tiny):
    assert resolve_backend("auto", CPU) == "hf" and resolve_backend("auto", torch.device("cuda", 0)) == "fast"
    assert resolve_backend("fast", CPU) == "fast" and resolve_backend("hf", CPU) == "hf"
    assert resolve_backend("vllm", CPU) == "vllm"   # the optional engine (grpo.generate.vllm_engine)
    with pytest.raises(ValueError, match="choose one of auto, fast, hf, vllm"):
        resolve_backend("turbo", CPU)
    with pytest.raises(ValueError, match="cuda_graphs=False on CPU"):
        RolloutEngine(tiny, 2, 2, cuda_graphs=True)
    with pytest.raises(ValueError, match="no prompt may be empty"):
        RolloutEngine(tiny, 2, 2).generate([[5], []], 4)


def test_attend_limit_hand_worked():
    # a 10-slot prompt, 256 new tokens, chunks of 64: step k writes slot 9 + k and needs 10 + k slots
    assert attend_limit(10, 266, 1, 64) == 74       # steps 1-64 share one length
    assert attend_limit(10, 266, 64, 64) == 74
    assert attend_limit(10, 266, 65, 64) == 138
    assert attend_limit(10, 266, 255, 64) == 266
    assert attend_limit(10, 100, 70, 64) == 100     # never past the cache: 10 + 128 capped at 100
    assert attend_limit(4, 12, 3, 1) == 7           # chunk 1: exactly the filled slots


@pytest.mark.parametrize("chunk", [1, 3])
def test_filled_cache_attention_equals_the_whole_cache(tiny, chunk):
    """Reading only the filled slots (attend_chunk) gives the tokens and log-probs of attending
    to the whole static cache, greedy and sampled (the same noise), with left padding."""
    ps = prompts((5, 9, 3, 7))
    out = {}
    for c in (None, chunk):
        torch.manual_seed(11)
        eng = RolloutEngine(tiny, 2, 2, attend_chunk=c)
        out[c] = (eng.generate(ps, 12, greedy=True), eng.generate(ps, 12, temperature=0.8))
    for a, b in zip(out[None], out[chunk]):
        assert a.token_ids == b.token_ids and a.finished == b.finished
        for x, y in zip(a.logprobs, b.logprobs):
            np.testing.assert_allclose(x, y, atol=1e-6)
    assert out[None][0].stats["decode_steps"] > 1   # decode steps ran (not only the prefill's token)


def test_old_logprob_source_rule():
    f32, bf16 = torch.float32, torch.bfloat16
    assert old_logprob_source("auto", "fast", f32) == "sampling"     # exact: the pass would repeat it
    assert old_logprob_source("auto", "fast", bf16) == "pass"        # not exact in bf16
    assert old_logprob_source("auto", "hf", f32) == "pass"           # generate returns no log-probs
    assert old_logprob_source("sampling", "fast", bf16) == "sampling"
    assert old_logprob_source("pass", "fast", f32) == "pass"
    with pytest.raises(ValueError, match="needs --generation-backend fast"):
        old_logprob_source("sampling", "hf", f32)
    with pytest.raises(ValueError, match="choose one of auto, sampling, pass"):
        old_logprob_source("engine", "fast", f32)


@pytest.mark.slow
def test_greedy_matches_hf_generate_on_smollm2_gsm8k_prompts():
    from grpo.data.prompts import build_prompt
    from grpo.data.sources import load_problems

    path = resolve_model("smollm2")
    model, tok = load_causal_lm(path, CPU, torch.float32).eval(), load_tokenizer(path)
    problems = load_problems(str(GSM8K), "test", limit=2)
    ps = [tok(build_prompt(tok, q.question), add_special_tokens=False)["input_ids"] for q in problems]
    ref, ref_fin = hf_generate(model, ps, 6, 1.0, True, tok.eos_token_id, tok.pad_token_id)
    got = RolloutEngine(model, tok.eos_token_id, tok.pad_token_id).generate(ps, 6, greedy=True)
    assert got.token_ids == ref and got.finished == ref_fin
    assert len({len(p) for p in ps}) > 1  # prompts of different lengths: left padding exercised


def test_reused_slot_after_decoding_is_reset(tiny):
    """A slot is reused across calls (and, on GPU, decoded into while capturing): a later call
    must give what a fresh engine gives, so cache counters, mask and buffers are all reset."""
    eng = RolloutEngine(tiny, 2, 2, buckets=(8,), prompt_multiple=16)
    eng.generate(prompts((9, 2, 14), seed=4), 10, greedy=True)
    slot = next(iter(eng.slots.values()))
    # What graph capture does before a real call: a prefill and warm-up decode steps, which
    # must not leak into the next call.
    ids, valid = torch.full((8, 16), 2), torch.zeros((8, 16), dtype=torch.bool)
    ids[0, -4:], valid[0, -4:] = torch.tensor([17, 4000, 23, 9]), True
    eng._prefill(slot, ids, valid, 1.0, False)
    eng._decode(slot, False)
    eng._decode(slot, False)
    ps = prompts((3, 11, 6, 6, 1), seed=5)
    again = eng.generate(ps, 10, greedy=True)
    assert len(eng.slots) == 1  # same (rows, width, max_new): the slot was reused
    # A narrower batch (width 12 after rounding to 4) is served by a 16-wide slot: more left
    # padding, no new cache or graph, the same tokens.
    eng4 = RolloutEngine(tiny, 2, 2, buckets=(8,), prompt_multiple=4)
    eng4.generate(prompts((14, 3), seed=6), 6, greedy=True)
    narrow = prompts((2, 11), seed=7)
    assert eng4.generate(narrow, 6, greedy=True).token_ids == RolloutEngine(tiny, 2, 2).generate(
        narrow, 6, greedy=True).token_ids
    assert list(eng4.slots) == [(8, 16, 6)]
    fresh = RolloutEngine(tiny, 2, 2).generate(ps, 10, greedy=True)
    assert again.token_ids == fresh.token_ids
    np.testing.assert_allclose(np.stack(again.logprobs), np.stack(fresh.logprobs), atol=1e-5)


def test_decode_attention_without_repeating_the_cache_equals_hf_sdpa():
    """The engine's GQA decode attention (query heads grouped per KV head) against Hugging
    Face's SDPA path (which repeats K/V per query head), with a padding mask."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from grpo.generate.attention import rollout_attention

    class Attn(torch.nn.Module):
        num_key_value_groups = 3
        is_causal = True

    torch.manual_seed(0)
    b, heads, kv, length, dim = 2, 9, 3, 7, 8
    q = torch.randn(b, heads, 1, dim, dtype=torch.float64)
    k, v = torch.randn(b, kv, length, dim, dtype=torch.float64), torch.randn(b, kv, length, dim, dtype=torch.float64)
    mask = torch.zeros(b, 1, 1, length, dtype=torch.float64)
    mask[0, ..., :3] = torch.finfo(torch.float64).min          # row 0: three padding keys
    got, _ = rollout_attention(Attn(), q, k, v, mask, scaling=0.5)
    want, _ = sdpa_attention_forward(Attn(), q, k, v, mask, scaling=0.5)
    assert got.shape == want.shape == (b, 1, heads, dim)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # and the mask matters: without it row 0 differs
    free, _ = rollout_attention(Attn(), q, k, v, None, scaling=0.5)
    assert not torch.allclose(free[0], want[0]) and torch.allclose(free[1], want[1])


@pytest.mark.slow
def test_compiled_decode_step_gives_the_same_tokens(tiny):
    """compile_decode=True (torch.compile of the decode step; on GPU it is then captured) must
    decode exactly like the plain step: same greedy tokens, EOS handling and, with the same
    seed, the same samples and log-probs. The step mutates the slot's state in place, which
    the compiled graph has to reproduce."""
    ps = prompts((5, 9, 3))
    plain = RolloutEngine(tiny, 2, 2, cuda_graphs=False)
    comp = RolloutEngine(tiny, 2, 2, cuda_graphs=False, compile_decode=True)
    want = plain.generate(ps, 10, greedy=True)
    got = comp.generate(ps, 10, greedy=True)
    assert got.token_ids == want.token_ids and got.finished == want.finished
    torch.manual_seed(3)
    want = RolloutEngine(tiny, 2, 2, cuda_graphs=False).generate(ps, 10, temperature=0.8)
    torch.manual_seed(3)
    got = RolloutEngine(tiny, 2, 2, cuda_graphs=False, compile_decode=True).generate(ps, 10, temperature=0.8)
    assert got.token_ids == want.token_ids
    for a, b in zip(got.logprobs, want.logprobs):
        np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.slow
def test_compiled_ring_step_streams_the_same_tokens_and_leaves_generate_plain(tiny):
    """compile_ring=True compiles only stream()'s step: the same samples and log-probs from the same
    seed as the plain stream, through refills and ring wraps (5 prompts, G=2 on 4 rows), while
    generate() (evaluations) keeps the plain step."""
    ps = prompts((6, 3, 10, 4, 8), seed=5)

    def run(**kw):
        torch.manual_seed(7)
        eng = RolloutEngine(tiny, 2, 2, cuda_graphs=False, check_every=3, **kw)
        return eng, {g.key: g for g in eng.stream(source(list(enumerate(ps))), 2, 12, temperature=0.9, rows=4)}

    _, want = run()
    eng, got = run(compile_ring=True)
    assert eng._step == eng._decode and eng.ring.step_fn != eng.ring.step and not eng.compile_decode
    assert sorted(got) == sorted(want) == [0, 1, 2, 3, 4]
    for k in want:
        assert got[k].token_ids == want[k].token_ids
        for a, b in zip(got[k].logprobs, want[k].logprobs):
            np.testing.assert_allclose(a, b, atol=1e-5)


# ----------------------------------------------------------------------------- in-flight batching (stream)
def source(items, gaps=()):
    """next_prompt for stream(): (key, ids) in order; None once at each index in `gaps` (a budget
    that runs dry for a moment), then None for good at the end."""
    state = {"i": 0, "gapped": set()}

    def next_prompt():
        i = state["i"]
        if i in gaps and i not in state["gapped"]:
            state["gapped"].add(i)
            return None
        if i >= len(items):
            return None
        state["i"] += 1
        return items[i]
    return next_prompt


def count_steps(eng) -> list[int]:
    """Counts the decode steps eng's streams run (what stream() runs without a captured graph, on
    CPU): [n], updated as they run."""
    ran, step = [0], eng.ring.step_fn
    eng.ring.step_fn = lambda *a: (ran.__setitem__(0, ran[0] + 1), step(*a))[1]
    return ran


@pytest.mark.parametrize("behind", [False, True])
def test_stream_greedy_equals_generate_through_refills_and_ring_wraps(tiny, behind):
    """7 prompts, G=2 on 4 rows: rows refilled while others still decode, the ring of (width + 12)
    slots wrapping several times; every group once, each row what generate gives. Refilled behind
    the check's steps too: the slot a refill writes before is followed on the host."""
    ps = prompts((5, 9, 3, 12, 1, 7, 4), seed=2)
    ref = RolloutEngine(tiny, 2, 2).generate(ps, 12, greedy=True).token_ids
    eng = RolloutEngine(tiny, 2, 2, check_every=3, refill_behind=behind)
    got = list(eng.stream(source([(k, p) for k, p in enumerate(ps)], gaps=(3,)), 2, 12, greedy=True, rows=4))
    assert sorted(g.key for g in got) == list(range(7))
    for g in got:
        assert g.token_ids == [ref[g.key]] * 2 and g.finished == [False, False]
        assert [len(lp) for lp in g.logprobs] == [12, 12] and g.decode_steps >= 11
        # no swap: every token carries the stream's version (0 by default)
        assert [v.tolist() for v in g.versions] == [[0] * 12] * 2 and g.versions[0].dtype == np.int32
        assert g.min_version == g.max_version == 0
    ring = next(iter(eng.ring.rings.values()))
    assert int(ring.t) != 0 and ring.length == 12 + 12


def test_stream_yields_a_checks_groups_once_the_next_steps_are_queued_and_counts_them(tiny):
    """3 rows, G=1, 4 new tokens, checks every 2 steps, 4 prompts (no EOS in 4 greedy tokens). Rows
    0-2 take prompts 0-2 and end at step 3 (their first token is drawn at the refill), seen at the
    check after step 4; there prompt 3 takes a row, and only once steps 5-6 are queued are groups
    0-2 yielded, so the caller's work on them overlaps those steps. Prompt 3 ends at step 7, seen
    after step 8, and is yielded at the end. The counts: 8 steps, 3 rows x 8, busy rows 3 x 4 +
    1 x 4, 4 prompts."""
    ps = prompts((5, 3, 8, 6), seed=9)
    ref = RolloutEngine(tiny, 2, 2).generate(ps, 4, greedy=True).token_ids
    eng = RolloutEngine(tiny, 2, 2, check_every=2)
    ran, asked = count_steps(eng), []
    src = source(list(enumerate(ps)))
    seen = []
    for g in eng.stream(lambda: (asked.append(ran[0]), src())[1], 1, 4, greedy=True, rows=3):
        seen.append((g.key, ran[0], len(asked)))
        assert g.token_ids == [ref[g.key]]
    assert [(k, at) for k, at, _ in seen] == [(0, 6), (1, 6), (2, 6), (3, 8)]
    assert ran[0] == 8
    assert seen[0][2] == 5        # prompt 3 (the 4th ask; the 5th found none) came before group 0
    c = eng.stream_counts
    assert (c["steps"], c["row_steps"], c["busy_row_steps"], c["prompts"]) == (8, 24, 16, 4)
    assert c["decode_s"] > 0 and c["refill_s"] > 0 and c["check_s"] > 0


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_refill_behind_queues_the_steps_first_and_its_rows_join_a_check_later(tiny, new_weights, temperature):
    """refill_behind: 2 rows, G=1, 4 new tokens, checks every 2 steps, 3 prompts; the source has none
    for a moment at its 2nd ask, and swap() copies new weights in at its 2nd call (the check after
    step 4). Check by check (steps queued first whenever a row is busy, then the refill):
      1: nothing busy, no steps first; p0 takes row 0 (refilled at step 0), steps 1-2 follow.
      2: steps 3-4, then p1 takes row 1 (refilled at 4, prefilled before the swap: version 0);
         the sync sees p0 ended (its 4th token at step 3); the swap: steps 5.. run version 1.
      3: steps 5-6, then p2 takes row 0 (refilled at 6, prefilled at version 1); p0 is yielded.
      4: steps 7-8; p1 ends at step 7.  5: steps 9-10, p1 yielded; p2 ends at step 9.
      6: nothing busy, p2 yielded. 10 steps, busy rows 1+1+1+2+1 per step, 2 steps a check.
    Refilled first (as by default) the same stream takes 8 steps: a row joins when the check frees it.
    Tokens, log-probs and versions are those of a forward with each token's weights (mixed_decode)."""
    ps = prompts((6, 5, 4), seed=15)   # none wider than the first: one ring
    greedy = temperature == 0
    T = 1.0 if greedy else temperature
    runs = {}
    for behind in (True, False):
        model = copy.deepcopy(tiny)
        eng = RolloutEngine(model, 2, 2, check_every=2, refill_behind=behind)
        ran, seen = count_steps(eng), []
        torch.manual_seed(7)
        swap = SwapAt(model, new_weights, 2)
        for g in eng.stream(source(list(enumerate(ps)), gaps=(1,)), 1, 4, temperature=temperature, rows=2,
                            swap=swap):
            seen.append((g.key, ran[0], g.decode_steps, [v.tolist() for v in g.versions][0]))
            assert len(g.token_ids[0]) == 4 and g.finished == [False]   # no EOS: the hand-worked steps hold
            ref_lp, picks = mixed_decode({0: tiny, 1: new_weights}, ps[g.key], g.token_ids[0],
                                         g.versions[0].tolist(), T)
            np.testing.assert_allclose(g.logprobs[0], ref_lp, rtol=0, atol=1e-4)
            if greedy:
                assert g.token_ids[0] == picks
        runs[behind] = seen, dict(eng.stream_counts)
    seen, c = runs[True]
    assert seen == [(0, 6, 4, [0, 0, 0, 0]), (1, 10, 4, [0, 1, 1, 1]), (2, 10, 4, [1, 1, 1, 1])]
    assert (c["steps"], c["row_steps"], c["busy_row_steps"], c["prompts"]) == (10, 20, 12, 3)
    # refilled first: p1 at step 2 and p2 at 4, each a check sooner (the swap after step 4 as well)
    seen, c = runs[False]
    assert seen == [(0, 6, 4, [0, 0, 0, 0]), (1, 8, 4, [0, 0, 0, 1]), (2, 8, 4, [1, 1, 1, 1])]
    assert (c["steps"], c["row_steps"], c["busy_row_steps"], c["prompts"]) == (8, 16, 12, 3)   # 1+2+2+1 busy


def test_stream_eos_frees_rows_early_and_cuts_like_generate(tiny):
    ps = prompts((4, 7, 6, 5, 8), seed=4)
    free = RolloutEngine(tiny, 2, 2).generate(ps, 10, greedy=True).token_ids
    eos, pad = free[0][0], 7          # prompt 0's row ends at its first token (the refill draws it)
    ref = RolloutEngine(tiny, eos, pad).generate(ps, 10, greedy=True)
    got = {g.key: g for g in RolloutEngine(tiny, eos, pad, check_every=1).stream(
        source(list(enumerate(ps))), 1, 10, greedy=True, rows=2)}
    assert [got[k].token_ids[0] for k in range(5)] == ref.token_ids
    assert [got[k].finished[0] for k in range(5)] == ref.finished and ref.finished[0]
    assert got[0].token_ids == [[eos]] and got[0].logprobs[0].shape == (1,)
    assert got[0].decode_steps == 1     # its row is free again at the first check, after one step


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_stream_sampled_logprobs_match_teacher_forced_pass(tiny, temperature):
    """Every token's log-prob equals a teacher-forced pass over the finished sequence: the keys a
    row attends to (its prompt copied into ring slots at a refill, then its own tokens, wrapping
    round the ring) are exactly its sequence's. 5 prompts, G=2 on 4 rows: refills."""
    torch.manual_seed(6)
    ps = prompts((6, 3, 10, 4, 8), seed=5)
    got = list(RolloutEngine(tiny, 2, 2, check_every=3).stream(source(list(enumerate(ps))), 2, 16,
                                                              temperature=temperature, rows=4))
    assert sorted(g.key for g in got) == [0, 1, 2, 3, 4]
    for g in got:
        p = ps[g.key]
        assert len({tuple(r) for r in g.token_ids}) > 1      # G independent draws, not one copied
        whole = [p + r for r in g.token_ids]
        ids, mask = right_pad(whole, 2, CPU)
        with torch.no_grad():
            tf = token_logprobs(tiny, ids, mask, temperature)
        for i, r in enumerate(g.token_ids):
            np.testing.assert_allclose(g.logprobs[i], tf[i, len(p) - 1:len(p) - 1 + len(r)].numpy(), rtol=0, atol=1e-4)


def test_stream_makes_a_wider_ring_for_a_longer_prompt(tiny):
    ps = prompts((3, 4, 20, 2), seed=8)
    ref = RolloutEngine(tiny, 2, 2).generate(ps, 8, greedy=True).token_ids
    eng = RolloutEngine(tiny, 2, 2)
    got = {g.key: g.token_ids[0] for g in eng.stream(source(list(enumerate(ps))), 1, 8, greedy=True, rows=2)}
    assert got == dict(enumerate(ref))
    assert [k[1] for k in eng.ring.rings] == [20]          # the 20-token prompt waited for a ring of its width
    assert list(eng.stream(source([]), 2, 4, rows=4)) == []


@pytest.mark.parametrize("min_width,made", [(0, [4, 20]), (20, [20]), (24, [24])])
def test_stream_min_width_makes_the_ring_wide_enough_at_once(tiny, min_width, made):
    """The ring is as wide as the first prompts (4 tokens here) unless min_width says more: then the
    20-token prompt takes a row as soon as one is free, without a drain and a second ring."""
    ps = prompts((3, 4, 20, 2), seed=8)
    ref = RolloutEngine(tiny, 2, 2).generate(ps, 8, greedy=True).token_ids
    eng = RolloutEngine(tiny, 2, 2)
    widths, ring = [], eng.ring._ring
    eng.ring._ring = lambda rows, width, *rest: (widths.append(width), ring(rows, width, *rest))[1]
    got = {g.key: g.token_ids[0] for g in eng.stream(source(list(enumerate(ps))), 1, 8, greedy=True, rows=2,
                                                     min_width=min_width)}
    assert got == dict(enumerate(ref)) and widths == made


def test_stream_spreads_a_group_over_whichever_rows_are_free(tiny):
    """Rows are handed out one sample at a time: 3 rows for groups of 2, so a group's samples sit in
    rows freed at different times, and a prompt's second sample may wait for a row."""
    ps = prompts((5, 3, 8, 6), seed=9)
    ref = RolloutEngine(tiny, 2, 2).generate(ps, 10, greedy=True).token_ids
    got = list(RolloutEngine(tiny, 2, 2, check_every=2).stream(source(list(enumerate(ps))), 2, 10, greedy=True,
                                                              rows=3))
    assert sorted(g.key for g in got) == [0, 1, 2, 3]
    assert all(g.token_ids == [ref[g.key]] * 2 for g in got)


class Answering:
    """next_prompt for stream() that serves `items` and, once `after` groups were yielded to it
    (answer), the prompt `extra`: a source that answers a group it was given with more work, as
    the rest of a screened group is (grpo.sampler.workflow)."""

    def __init__(self, items, after: int, extra):
        self.queue, self.after, self.extra, self.seen = list(items), after, extra, 0

    def __call__(self):
        return self.queue.pop(0) if self.queue else None

    def answer(self, group) -> None:
        self.seen += 1
        if self.seen == self.after:
            self.queue.append(self.extra)


@pytest.mark.parametrize("behind", [False, True])
def test_stream_takes_a_count_per_prompt_and_a_prompt_given_after_its_last_group(tiny, behind):
    """(key, ids, n) asks for n samples of a prompt: its group is n rows, each what generate gives
    (greedy). A source that answers the last group yielded with another prompt, after it had said
    None and with no row busy, is asked again: the stream ends only once a pass found nothing."""
    ps = prompts((5, 9, 3), seed=6)
    ref = RolloutEngine(tiny, 2, 2).generate(ps, 8, greedy=True).token_ids
    src = Answering([(0, ps[0], 1), (1, ps[1], 3), (2, ps[2])], after=3, extra=("rest", ps[1], 1))
    got = []
    for g in RolloutEngine(tiny, 2, 2, check_every=2, refill_behind=behind).stream(src, 3, 8, greedy=True, rows=4):
        got.append(g)
        src.answer(g)
    assert {g.key: len(g.token_ids) for g in got} == {0: 1, 1: 3, 2: 3, "rest": 1} and got[-1].key == "rest"
    for g in got:
        assert g.token_ids == [ref[1 if g.key == "rest" else g.key]] * len(g.token_ids)
    for bad in (0, 3, True, 1.0):   # more than the group, none, or not a count
        with pytest.raises(ValueError, match="samples; give 1..2"):
            list(RolloutEngine(tiny, 2, 2).stream(source([(0, ps[0], bad)]), 2, 4, greedy=True, rows=4))


class StopAfter:
    """A stop condition that says True from its n-th question on; counts the questions."""

    def __init__(self, n: int):
        self.n, self.asked = n, 0

    def __call__(self) -> bool:
        self.asked += 1
        return self.asked >= self.n


def test_generate_stops_between_decode_chunks_when_asked(tiny):
    ps = prompts((5, 9, 3), seed=5)
    eng = RolloutEngine(tiny, 2, 2, check_every=4)
    full = eng.generate(ps, 40, greedy=True)
    assert full.stats["decode_steps"] == 39 and full.stats["stopped"] is False   # random weights: no EOS
    stop = StopAfter(6)
    got = eng.generate(ps, 40, greedy=True, should_stop=stop)
    # asked after every step (not only every check_every), stopped at the sixth question
    assert stop.asked == 6 and got.stats["decode_steps"] == 6 and got.stats["stopped"] is True
    assert len(got.token_ids) == 3
    # with buckets smaller than the batch: the rows of the next chunks are not decoded at all
    eng = RolloutEngine(tiny, 2, 7, check_every=4, buckets=(2,))
    got = eng.generate(ps, 40, greedy=True, should_stop=StopAfter(1))
    assert got.stats["decode_steps"] == 1 and got.stats["stopped"] is True and len(got.token_ids) == 3
    assert got.token_ids[2] == [7] * 40 and got.finished[2] is False   # padding only


def test_stream_stops_between_decode_chunks_when_asked(tiny):
    ps = prompts((5, 9, 3, 12), seed=6)
    eng = RolloutEngine(tiny, 2, 2, check_every=3)
    stop = StopAfter(5)
    got = list(eng.stream(source([(k, p) for k, p in enumerate(ps)]), 2, 30, greedy=True, rows=4,
                          should_stop=stop))
    assert got == [] and stop.asked == 5   # after every step; no group had ended (30 tokens each)


def test_hf_generate_stops_when_asked(tiny):
    ps = prompts((5, 9), seed=7)
    full, _ = hf_generate(tiny, ps, 30, 1.0, True, eos_id=2, pad_id=2)
    assert [len(r) for r in full] == [30, 30]
    stop = StopAfter(3)
    cut, fin = hf_generate(tiny, ps, 30, 1.0, True, eos_id=2, pad_id=2, should_stop=stop)
    assert stop.asked == 3 and [len(r) for r in cut] == [3, 3] and fin == [False, False]
    assert [r[:3] for r in full] == cut   # greedy: the same tokens up to the stop


# ----------------------------------------------------------------------------- weight swaps inside a stream
def test_token_versions_hand_worked():
    steps, vers = np.array([0, 6]), np.array([0, 1], dtype=np.int32)   # steps 7.. run with version 1
    # refilled at step 0: token c drawn by step c, so tokens 0-6 by version 0, 7-11 by version 1
    assert token_versions(12, 0, 0, steps, vers).tolist() == [0] * 7 + [1] * 5
    # refilled at step 12 from a prompt prefilled before the swap: its first token is the prefill's
    assert token_versions(12, 12, 0, steps, vers).tolist() == [0] + [1] * 11
    assert token_versions(1, 12, 1, steps, vers).tolist() == [1]
    assert token_versions(0, 12, 1, steps, vers).tolist() == []
    # changes after steps 4 and 8; refilled at 3: token c at step 3 + c
    many = token_versions(8, 3, 2, np.array([0, 4, 8]), np.array([2, 5, 9], dtype=np.int32))
    assert many.tolist() == [2, 2, 5, 5, 5, 5, 9, 9] and many.dtype == np.int32
    assert group_versions([np.array([3, 4], np.int32), np.array([5], np.int32)], 0) == (3, 5)
    assert group_versions([np.array([], np.int32)], 7) == (7, 7)


@pytest.fixture(scope="module")
def new_weights(tiny):
    """A second random model of tiny's config: the weights a swap copies in."""
    torch.manual_seed(123)
    return type(tiny)(tiny.config).eval()


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_stream_swaps_weights_in_place_without_draining(tiny, new_weights, temperature):
    """3 prompts, G=2 on 3 rows, 12 new tokens, a check every 3 steps; swap() copies new weights in
    at its 2nd call (the check after step 6). Rows 0-2 (prompt 0's samples, prompt 1's first) span
    the swap: tokens 0-6 (the refill's and steps 1-6) by version 0, 7-11 by version 1. Prompt 1's
    second sample waited for a row (prefilled at version 0) and took one at step 12: its first token
    from the old prefill's logits, the rest by version 1. Prompt 2, prefilled after the swap: all 1.
    Every token's log-prob (and greedy pick) is that of a plain forward in which each key/value and
    logit came from the weights in force when it was computed."""
    model = copy.deepcopy(tiny)
    ptrs = [p.data_ptr() for p in model.parameters()]
    ps = prompts((5, 9, 4), seed=12)
    greedy = temperature == 0
    T = 1.0 if greedy else temperature
    torch.manual_seed(4)
    swap = SwapAt(model, new_weights, 2)
    engine = RolloutEngine(model, 2, 2, check_every=3)
    got = {g.key: g for g in engine.stream(source(list(enumerate(ps))), 2, 12, temperature=temperature, rows=3,
                                           swap=swap)}
    assert sorted(got) == [0, 1, 2] and swap.calls == 8          # a check after steps 3, 6, ..., 24
    counts = engine.stream_counts   # the one swap taken, its host seconds within the checks'
    assert counts["swaps"] == 1 and 0 < counts["swap_s"] <= counts["check_s"]
    assert [p.data_ptr() for p in model.parameters()] == ptrs     # copied in place
    assert all(len(r) == 12 for g in got.values() for r in g.token_ids)   # no EOS: the hand-worked steps hold
    span, waited, after = [0] * 7 + [1] * 5, [0] + [1] * 11, [1] * 12
    want = {0: [span, span], 1: [span, waited], 2: [after, after]}
    for k, g in got.items():
        assert [v.tolist() for v in g.versions] == want[k], k
        assert all(v.dtype == np.int32 and len(v) == len(r) == len(lp)
                   for v, r, lp in zip(g.versions, g.token_ids, g.logprobs))
    assert [(got[k].min_version, got[k].max_version) for k in range(3)] == [(0, 1), (0, 1), (1, 1)]
    models = {0: tiny, 1: new_weights}
    for k, g in got.items():
        for r, lp, v in zip(g.token_ids, g.logprobs, g.versions):
            ref_lp, picks = mixed_decode(models, ps[k], r, v.tolist(), T)
            np.testing.assert_allclose(lp, ref_lp, rtol=0, atol=1e-4)
            if greedy:
                assert r == picks
    # Against each version alone (teacher-forced over the same tokens): a spanning row's log-probs are
    # the old weights' up to the swap and not after it, nor those of the new weights recomputing the
    # prefix (the kept cache matters: the check above can tell); prompt 2's are the new weights'.
    def alone(m, k):
        ids, mask = right_pad([ps[k] + r for r in got[k].token_ids], 2, CPU)
        with torch.no_grad():
            return token_logprobs(m, ids, mask, T)[:, len(ps[k]) - 1:len(ps[k]) + 11].numpy()
    old0, new0 = alone(tiny, 0), alone(new_weights, 0)
    for i in range(2):
        np.testing.assert_allclose(got[0].logprobs[i][:7], old0[i][:7], rtol=0, atol=1e-4)
        assert np.abs(got[0].logprobs[i][7:] - old0[i][7:]).max() > 1e-2
        assert np.abs(got[0].logprobs[i][7:] - new0[i][7:]).max() > 1e-2
        np.testing.assert_allclose(got[2].logprobs[i], alone(new_weights, 2)[i], rtol=0, atol=1e-4)
    if greedy:   # prompt 2 decodes as the new weights do from scratch, and not as the old ones
        old = RolloutEngine(tiny, 2, 2).generate(ps, 12, greedy=True).token_ids
        new = RolloutEngine(new_weights, 2, 2).generate(ps, 12, greedy=True).token_ids
        assert got[2].token_ids == [new[2]] * 2 and new[2] != old[2]


def test_stream_swap_without_new_weights_and_bad_swaps(tiny, new_weights):
    """A swap that never has weights, and a start version: tokens and log-probs as without swap, every
    token at that version. A swap saying an old version, or a non-int, or one that replaced a
    parameter's storage (the ring's captured step would read the old memory): one clear error."""
    ps = prompts((5, 9, 3, 7), seed=13)
    plain = list(RolloutEngine(tiny, 2, 2, check_every=2).stream(source(list(enumerate(ps))), 2, 8, greedy=True,
                                                                 rows=4))
    calls = []
    got = list(RolloutEngine(tiny, 2, 2, check_every=2).stream(source(list(enumerate(ps))), 2, 8, greedy=True,
                                                               rows=4, swap=lambda: calls.append(1), version=5))
    assert [g.key for g in got] == [g.key for g in plain] and len(calls) == 8   # 16 steps: 2 rounds of 4 checks
    for a, b in zip(got, plain):
        assert a.token_ids == b.token_ids and a.decode_steps == b.decode_steps
        np.testing.assert_array_equal(np.stack(a.logprobs), np.stack(b.logprobs))
        assert [v.tolist() for v in a.versions] == [[5] * 8] * 2 and (a.min_version, a.max_version) == (5, 5)
    for answer in (5, 4, True, 6.0):
        with pytest.raises(ValueError, match=f"swap\\(\\) returned {answer!r} at version 5; it must return None"):
            list(RolloutEngine(tiny, 2, 2, check_every=2).stream(source(list(enumerate(ps))), 2, 8, greedy=True,
                                                                 rows=4, swap=lambda a=answer: a, version=5))
    model = copy.deepcopy(tiny)

    def replace():
        model.lm_head.weight = torch.nn.Parameter(new_weights.lm_head.weight.clone())
        return 1
    with pytest.raises(RuntimeError, match="replaced model parameters .* param.copy_"):
        list(RolloutEngine(model, 2, 2, check_every=2).stream(source(list(enumerate(ps))), 2, 8, greedy=True,
                                                              rows=4, swap=replace))


def test_batch_stream_decodes_what_its_source_gives_as_one_batch(tiny):
    """BatchStream, a fixed round's stream: every prompt the source gives before None (its cap) in one
    generate call, the groups in the source's order, only the last one last_in_check, every token
    at the stream's version; with rows, batches of at most that many samples, swap() asked between
    them; a batch should_stop cut short yields nothing; over Hugging Face generate (hf_rollout) the
    same tokens and no log-probs (a pass gives them)."""
    ps = prompts((5, 9, 3), seed=4)
    eng = RolloutEngine(tiny, 2, 2)
    ref = eng.generate([p for p in ps for _ in range(2)], 6, greedy=True)
    calls = []

    def counted(rows, *a):
        calls.append(len(rows))
        return eng.generate(rows, *a)

    got = list(BatchStream(counted).stream(source(list(enumerate(ps))), 2, 6, greedy=True, version=3))
    assert calls == [6] and [g.key for g in got] == [0, 1, 2]
    assert [g.last_in_check for g in got] == [False, False, True]
    for g in got:
        assert g.token_ids == ref.token_ids[2 * g.key:2 * g.key + 2]
        assert [len(lp) for lp in g.logprobs] == [len(t) for t in g.token_ids]
        assert [v.tolist() for v in g.versions] == [[3] * len(t) for t in g.token_ids]
        assert g.min_version == g.max_version == 3
    calls.clear()
    swaps = iter([4, None])
    batched = list(BatchStream(counted).stream(source(list(enumerate(ps))), 2, 6, greedy=True, rows=4,
                                               swap=lambda: next(swaps)))
    assert calls == [4, 2] and [g.token_ids for g in batched] == [g.token_ids for g in got]
    assert [g.min_version for g in batched] == [0, 0, 4] and [g.last_in_check for g in batched] == [False, True, True]
    assert list(BatchStream(eng.generate).stream(source(list(enumerate(ps))), 2, 6, greedy=True,
                                                 should_stop=lambda: True)) == []
    hf = list(BatchStream(lambda rows, m, t, g, stop: hf_rollout(tiny, rows, m, t, g, 2, 2, stop)).stream(
        source(list(enumerate(ps))), 2, 6, greedy=True))
    assert [g.token_ids for g in hf] == [g.token_ids for g in got] and all(g.logprobs is None for g in hf)


def test_batch_stream_takes_a_count_per_prompt_and_a_prompt_given_after_its_batch(tiny):
    """BatchStream with (key, ids, n): the prompt's n rows in the batch and its group, the batch's
    samples counted per prompt against `rows`; a prompt the source gives in answer to the batch's
    groups, after it had said None, is the next batch."""
    ps = prompts((5, 9, 3), seed=4)
    eng = RolloutEngine(tiny, 2, 2)
    ref = eng.generate(ps, 6, greedy=True).token_ids
    calls = []

    def counted(rows, *a):
        calls.append(len(rows))
        return eng.generate(rows, *a)

    src = Answering([(0, ps[0], 1), (1, ps[1], 3), (2, ps[2], 1)], after=3, extra=("rest", ps[2], 3))
    got = []
    for g in BatchStream(counted).stream(src, 3, 6, greedy=True, rows=5):
        got.append(g)
        src.answer(g)
    # rows 5: prompts 0 and 1 (4 samples; a third prompt might need 3 more), then 2, then the answer
    assert calls == [4, 1, 3] and [(g.key, len(g.token_ids)) for g in got] == [(0, 1), (1, 3), (2, 1), ("rest", 3)]
    for g in got:
        assert g.token_ids == [ref[2 if g.key == "rest" else g.key]] * len(g.token_ids)
