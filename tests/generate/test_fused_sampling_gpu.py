"""The fused sampling kernel on a GPU (skipped without CUDA): at Qwen2.5's vocabulary and the ring's
320 rows it gives sample_step's greedy tokens and log-probs; its draws follow the softmax; captured
in a CUDA graph, every replay draws new noise; the engine's captured steps use it and keep their
log-probs equal to a teacher-forced pass's."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from grpo.data.prompts import build_prompt
from grpo.data.sources import load_problems
from grpo.generate.engine import RolloutEngine
from grpo.generate.fused_sampling import fused_sample_step, new_seed
from grpo.generate.sampling import sample_step
from grpo.model.load import load_causal_lm, load_tokenizer
from grpo.model.logprobs import right_pad, token_logprobs
from grpo.model.zoo import resolve_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
GSM8K = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k"
DEV = torch.device("cuda", 0)
EOS_IDS = [151643, 151645]   # Qwen2.5's


@pytest.fixture
def EOS():
    return torch.tensor(EOS_IDS, device=DEV)


def test_greedy_equals_sample_step_at_qwen_vocabulary(EOS):
    torch.manual_seed(0)
    logits = (torch.randn(320, 151936, device=DEV) * 3).to(torch.bfloat16)
    done = torch.rand(320, device=DEV) < 0.2
    inv_t = torch.tensor(1.0, device=DEV)
    tok, lp, ended = fused_sample_step(logits, inv_t, True, new_seed(DEV), done, 0, EOS)
    want_tok, want_lp, want_ended = sample_step(logits, inv_t, True, None, done, 0, EOS)
    assert torch.equal(tok, want_tok) and torch.equal(ended, want_ended)
    torch.testing.assert_close(lp, want_lp, rtol=0, atol=1e-4)


def test_draws_follow_the_softmax(EOS):
    row = torch.tensor([0.0, 1.0, 2.0, -1.0, 0.5], device=DEV)
    n, inv_t = 200_000, torch.tensor(1 / 0.7, device=DEV)
    tok, lp, _ = fused_sample_step(row.expand(n, -1), inv_t, False, new_seed(DEV), torch.zeros(n, dtype=torch.bool,
                                   device=DEV), 0, EOS)
    freq = torch.bincount(tok, minlength=5).double() / n
    want = torch.softmax(row.double() * inv_t.double(), -1)
    assert (freq - want).abs().max() < 0.004, (freq, want)   # 4 sigma at p = 0.7
    torch.testing.assert_close(lp, torch.log_softmax(row * inv_t, -1)[tok], rtol=0, atol=1e-6)


def test_a_captured_draw_draws_anew_at_every_replay(EOS):
    torch.manual_seed(1)
    logits = torch.zeros(64, 151936, device=DEV, dtype=torch.bfloat16)   # uniform: any token, never twice alike
    done = torch.zeros(64, dtype=torch.bool, device=DEV)
    seed, inv_t = new_seed(DEV), torch.tensor(1.0, device=DEV)
    out = torch.empty(64, dtype=torch.long, device=DEV)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fused_sample_step(logits, inv_t, False, seed, done, 0, EOS)     # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tok, _, _ = fused_sample_step(logits, inv_t, False, seed, done, 0, EOS)
        out.copy_(tok)
    draws = []
    for _ in range(3):
        graph.replay()
        draws.append(out.clone())
    start = seed.item()
    graph.replay()
    assert seed.item() == start + 1
    assert not torch.equal(draws[0], draws[1]) and not torch.equal(draws[1], draws[2])


def test_the_engine_captured_steps_draw_with_it_and_log_probs_match_a_pass():
    path = resolve_model("smollm2")
    tok = load_tokenizer(path)
    model = load_causal_lm(path, DEV, torch.float32).eval()
    problems = load_problems(str(GSM8K), "test", limit=12)
    ps = [tok(build_prompt(tok, p.question), add_special_tokens=False)["input_ids"] for p in problems]
    eng = RolloutEngine(model, tok.eos_token_id, tok.pad_token_id)
    plain = RolloutEngine(model, tok.eos_token_id, tok.pad_token_id, fused_sampling=False)
    assert eng.fused and eng.ring.fused and not plain.fused
    assert eng.generate(ps, 32, greedy=True).token_ids == plain.generate(ps, 32, greedy=True).token_ids
    torch.manual_seed(4)
    it = iter(enumerate(ps))
    got = {g.key: g for g in eng.stream(lambda: next(it, None), 2, 48, temperature=1.0, rows=16)}
    assert eng.graph_failures == 0 and sorted(got) == list(range(12))
    for k, g in got.items():
        whole = [ps[k] + r for r in g.token_ids]
        ids, mask = right_pad(whole, tok.pad_token_id, DEV)
        with torch.no_grad():
            tf = token_logprobs(model, ids, mask, 1.0).cpu()
        p = len(ps[k])
        for i, r in enumerate(g.token_ids):
            np.testing.assert_allclose(g.logprobs[i], tf[i, p - 1:p - 1 + len(r)].numpy(), rtol=0, atol=2e-3)
