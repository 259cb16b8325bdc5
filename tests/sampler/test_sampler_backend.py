"""The sampler process on each generation backend: a round (fixed and in flight) on the fast engine
with its sampling log-probs as old log-probs, the fall back to Hugging Face generate at start-up for
a model the engine cannot serve, and the flags and one-line error for a bad backend."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from netutil import one_thread  # noqa: F401 - module-wide fixture (autouse)

from grpo.model.logprobs import token_logprobs

GSM8K = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k"


def prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 49000, (n,), generator=g).tolist() for n in lengths]


def test_sampler_round_with_fast_backend(monkeypatch):
    """The sampler's round on the fast engine: groups carry the engine's completions, and their old
    log-probs, taken from the sampling pass in float32 (no pass of their own), equal a teacher-forced
    pass token for token, in a fixed round and in an in-flight one."""
    from netutil import free_ports

    from grpo.config import SamplerConfig, from_flat
    from grpo.sampler.loop import Sampler

    d, s = free_ports(2)
    cfg = from_flat(SamplerConfig, model="tiny-random", device="cpu", dataset=str(GSM8K), dataset_limit=8,
                        prompts_per_round=2, num_generations=3, max_new_tokens=6, generation_backend="fast",
                        data_port=d, sync_port=s)
    sampler = Sampler(cfg)
    try:
        assert sampler.parts.backend == "fast" and sampler.parts.engine is not None and sampler.parts.old_source == "sampling"
        assert sampler.parts.engine.refill_behind is True   # --refill-behind, the default: the in-flight round below
        passes = []
        real = sampler.parts.workflow._logprobs
        monkeypatch.setattr(sampler.parts.workflow, "_logprobs", lambda model, whole, plens: passes.append(
            "ref" if model is sampler.parts.workflow.ref else "policy") or real(model, whole, plens))
        chunks = list(sampler.parts.workflow.stream_round(0, 2))   # a fixed round: one batch, one chunk
        assert len(chunks) == 1
        groups = chunks[0]
        sampler.cfg.rollout.in_flight_rows = 4
        groups += [g for chunk in sampler.parts.workflow.stream_round(1, 2) for g in chunk]
        assert passes == ["ref", "ref"]   # the reference pass only (no learner said beta is 0)
        monkeypatch.undo()
        # The log-prob pass sorts by length into micro-batches; results come back in input
        # order and equal one sequence at a time (no padding at all).
        whole = prompts((9, 4, 12, 6, 5))
        plens = [3, 2, 5, 1, 4]
        sampler.cfg.rollout.logprob_batch_size = 2
        # Only the completions' positions reach the LM head: 6 + 2 + 7 + 5 + 1 rows, none of a prompt's.
        head_rows = []
        hook = sampler.parts.policy.get_output_embeddings().register_forward_hook(
            lambda mod, args, out: head_rows.append(args[0].shape[0]))
        try:
            got = sampler.parts.workflow._logprobs(sampler.parts.policy, whole, plens)
        finally:
            hook.remove()
        assert sum(head_rows) == 21, head_rows
        for seq, p, lp in zip(whole, plens, got):
            ids = torch.tensor([seq])
            with torch.no_grad():
                alone = token_logprobs(sampler.parts.policy, ids, torch.ones_like(ids), 1.0)[0, p - 1:].numpy()
            assert lp.shape == (len(seq) - p,)
            np.testing.assert_allclose(lp, alone, atol=1e-5)
    finally:
        sampler.parts.data.close()
        sampler.parts.sync.close()
    assert len(groups) == 4 and all(len(g.completions) == 3 for g in groups)
    for g in groups:
        for c in g.completions:
            n = len(c.generated_token_ids)
            assert 1 <= n <= 6 and c.is_finished == (int(c.generated_token_ids[-1]) == sampler.parts.tok.eos_token_id)
            assert list(c.whole_token_ids) == list(g.prefix_token_ids) + list(c.generated_token_ids)
            assert c.old_policy_log_probs.shape == c.ref_policy_log_probs.shape == (n,)
            assert np.all(c.old_policy_log_probs < 0)
            # policy and reference are the same weights before any update: the engine's log-probs
            # (old) equal the reference's teacher-forced pass
            np.testing.assert_allclose(c.old_policy_log_probs, c.ref_policy_log_probs, atol=1e-5)
    with pytest.raises(ValueError, match="--generation-backend"):
        Sampler(from_flat(SamplerConfig, model="tiny-random", device="cpu", dataset=str(GSM8K), dataset_limit=8,
                              generation_backend="turbo", data_port=d, sync_port=s))
    first = Sampler(from_flat(SamplerConfig, model="tiny-random", device="cpu", dataset=str(GSM8K), dataset_limit=8,
                                  generation_backend="fast", refill_behind=False, data_port=d, sync_port=s))
    try:
        assert first.parts.engine.refill_behind is False   # --no-refill-behind reaches the engine
    finally:
        first.parts.data.close()
        first.parts.sync.close()


def test_sampler_falls_back_at_start_up(monkeypatch):
    """--generation-backend fast on a model the engine cannot serve: the sampler decodes with Hugging
    Face generate from the start (old log-probs from a pass), and its rounds run."""
    from netutil import free_ports

    import grpo.generate.engine as engine_module
    from grpo.config import SamplerConfig, from_flat
    from grpo.sampler.loop import Sampler

    def unservable(model):
        raise ValueError("test: not servable")

    monkeypatch.setattr(engine_module, "layer_plan", unservable)
    d, s = free_ports(2)
    sampler = Sampler(from_flat(SamplerConfig, model="tiny-random", device="cpu", dataset=str(GSM8K), dataset_limit=8,
                                    prompts_per_round=2, num_generations=2, max_new_tokens=4,
                                    generation_backend="fast", data_port=d, sync_port=s))
    try:
        assert (sampler.parts.backend, sampler.parts.engine, sampler.parts.old_source) == ("hf", None, "pass")
        assert sampler.parts.eos_ids == [sampler.parts.tok.eos_token_id]
        chunks = list(sampler.parts.workflow.stream_round(0, 2))   # Hugging Face generate: one batch, one chunk
        assert len(chunks) == 1
        groups = chunks[0]
    finally:
        sampler.parts.data.close()
        sampler.parts.sync.close()
    assert len(groups) == 2 and all(len(g.completions) == 2 for g in groups)


def test_flags_and_one_line_error_for_a_bad_backend(tmp_path):
    import os
    import subprocess
    import sys

    from grpo.config import SamplerConfig
    from grpo.flags import parse_config

    cfg = parse_config(SamplerConfig, ["--generation-backend", "hf", "--no-cuda-graphs", "--compile-decode"], "s")
    assert (cfg.rollout.generation_backend, cfg.rollout.cuda_graphs, cfg.rollout.compile_decode) == ("hf", False, True)
    default = parse_config(SamplerConfig, [], "s")
    assert (default.rollout.generation_backend, default.rollout.cuda_graphs, default.rollout.compile_decode) == \
        ("auto", True, False)
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "sampling_worker.py", "--device", "cpu", "--model", "tiny-random",
                        "--dataset", str(GSM8K), "--generation-backend", "turbo", "--run-dir", str(tmp_path / "run")], cwd=root, capture_output=True,
                       text=True, timeout=300, env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"})
    assert r.returncode == 2, r.stderr
    lines = [x for x in r.stderr.strip().splitlines() if "error" in x]
    assert lines == ["sampling_worker.py: error: argument --generation-backend: invalid choice: 'turbo' "
                     "(choose from 'auto', 'fast', 'hf', 'vllm') (see --help)"], r.stderr
    assert "Traceback" not in r.stderr
