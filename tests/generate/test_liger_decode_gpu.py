"""Liger's layers in our engine on a GPU (skipped without CUDA or liger-kernel): the engine applies
them by default, its graphs capture them, greedy fp32 completions agree with Hugging Face's layers,
sampled tokens' log-probs equal a teacher-forced pass of the unpatched model within fp32 kernel
tolerance, and the modelling module's names are Hugging Face's outside the engine."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers.models.llama import modeling_llama

from grpo.data.prompts import build_prompt
from grpo.data.sources import load_problems
from grpo.generate.engine import RolloutEngine
from grpo.model.load import load_causal_lm, load_tokenizer
from grpo.model.logprobs import right_pad, token_logprobs
from grpo.model.zoo import resolve_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available() or importlib.util.find_spec("liger_kernel") is None,
    reason="needs CUDA and liger-kernel")]
GSM8K = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k"
DEV = torch.device("cuda", 0)


def test_the_engine_decodes_with_liger_and_its_log_probs_match_hugging_faces_pass():
    path = resolve_model("smollm2")
    tok = load_tokenizer(path)
    plain_model = load_causal_lm(path, DEV, torch.float32).eval()
    model = load_causal_lm(path, DEV, torch.float32).eval()
    problems = load_problems(str(GSM8K), "test", limit=24)
    ps = [tok(build_prompt(tok, p.question), add_special_tokens=False)["input_ids"] for p in problems]
    hf_rope = modeling_llama.apply_rotary_pos_emb
    plain = RolloutEngine(plain_model, tok.eos_token_id, tok.pad_token_id, liger_layers=False)
    eng = RolloutEngine(model, tok.eos_token_id, tok.pad_token_id)
    assert eng.layers is not None and plain.layers is None and modeling_llama.apply_rotary_pos_emb is hf_rope
    want = plain.generate(ps, 48, greedy=True).token_ids
    got = eng.generate(ps, 48, greedy=True).token_ids
    assert eng.graph_failures == 0 and modeling_llama.apply_rotary_pos_emb is hf_rope
    assert sum(a == b for a, b in zip(got, want)) >= 22, "fp32: a near-tie may flip one or two"
    torch.manual_seed(2)
    it = iter(enumerate(ps[:12]))
    streamed = {g.key: g for g in eng.stream(lambda: next(it, None), 2, 48, temperature=1.0, rows=16)}
    assert eng.graph_failures == 0 and sorted(streamed) == list(range(12))
    for k, g in streamed.items():
        ids, mask = right_pad([ps[k] + r for r in g.token_ids], tok.pad_token_id, DEV)
        with torch.no_grad():
            tf = token_logprobs(plain_model, ids, mask, 1.0).cpu()    # Hugging Face's layers
        p = len(ps[k])
        for i, r in enumerate(g.token_ids):
            np.testing.assert_allclose(g.logprobs[i], tf[i, p - 1:p - 1 + len(r)].numpy(), rtol=0, atol=2e-3)
