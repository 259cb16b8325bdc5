"""The sampler with --generation-backend vllm, on CPU without vLLM: the one-line refusal when vLLM is
not installed (check_decoding; exit code 2 from the worker once the flag offers the choice), vLLM's
memory share from the plan's rule, and a sampler's rounds (fixed and in flight) and greedy
evaluation through VllmEngine over a stand-in for vLLM's LLMEngine (tests/fakevllm.py)."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import get_args

import numpy as np
import pytest
import torch
from fakevllm import FakeLLM, FakeMPLLM, make_params
from netutil import one_thread  # noqa: F401 - module-wide fixture (autouse)

from grpo.config import GenerationBackend, SamplerConfig, from_flat
from grpo.generate.vllm_engine import VllmEngine, vllm_installed
from grpo.rules.backend import VLLM_MISSING as MISSING

GSM8K = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k"


def test_check_decoding_refuses_vllm_when_not_installed(monkeypatch):
    import grpo.generate.vllm_engine as ve
    from grpo.sampler.setup import check_decoding

    monkeypatch.setattr(ve, "vllm_installed", lambda: False)
    cfg = from_flat(SamplerConfig, model="tiny-random", device="cpu", dataset=str(GSM8K), generation_backend="vllm")
    with pytest.raises(ValueError) as e:
        check_decoding(cfg, torch.device("cpu"))
    assert str(e.value) == "--generation-backend vllm needs vLLM: pip install '.[vllm]'" == MISSING
    # installed but on CPU: its own line
    monkeypatch.setattr(ve, "vllm_installed", lambda: True)
    with pytest.raises(ValueError, match="vllm needs a CUDA device"):
        check_decoding(cfg, torch.device("cpu"))


@pytest.mark.skipif("vllm" not in get_args(GenerationBackend) or vllm_installed(),
                    reason="the flag does not offer vllm yet (grpo.config's GenerationBackend), or vLLM is installed")
def test_the_worker_refuses_vllm_in_one_line_exit_2(tmp_path):
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "sampling_worker.py", "--device", "cpu", "--model", "tiny-random",
                        "--dataset", str(GSM8K), "--generation-backend", "vllm", "--run-dir", str(tmp_path / "run")],
                       cwd=root, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"})
    assert r.returncode == 2, r.stderr
    lines = [x for x in r.stderr.strip().splitlines() if "error" in x]
    assert lines == ["sampling_worker.py: error: --generation-backend vllm needs vLLM: pip install '.[vllm]'"], r.stderr
    assert "Traceback" not in r.stderr


def test_vllm_memory_share_from_the_plan(monkeypatch):
    from grpo.rules.memory import GiB, PROMPT_TOKENS, shape_from_config, vllm_gpu_fraction, vllm_items
    from grpo.sampler import setup

    policy = SimpleNamespace(config=SimpleNamespace(to_dict=lambda: dict(
        hidden_size=64, num_hidden_layers=2, vocab_size=1000, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128)))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=80 * GiB))
    cuda = torch.device("cuda", 0)
    cfg = from_flat(SamplerConfig, in_flight_rows=64, max_new_tokens=100)
    shape = shape_from_config(policy.config.to_dict())
    # rows: --in-flight-rows; bf16 (2 bytes); the plan's prompt length + max_new_tokens
    want = vllm_gpu_fraction(vllm_items(shape, 64, PROMPT_TOKENS + 100, 2), 80 * GiB)
    assert setup.vllm_memory_share(cfg, policy, cuda) == want == 0.02   # 1 GiB workspace + a little: 1.3%, rounded up
    # fixed rounds: --prompts-per-round x G rows
    cfg = from_flat(SamplerConfig, prompts_per_round=4, num_generations=8, max_new_tokens=100)
    assert setup.vllm_memory_share(cfg, policy, cuda) == vllm_gpu_fraction(
        vllm_items(shape, 32, PROMPT_TOKENS + 100, 2), 80 * GiB)
    cfg.rollout.vllm_gpu_memory_utilization = 0.4   # given, it wins
    assert setup.vllm_memory_share(cfg, policy, cuda) == 0.4


def test_vllm_memory_share_over_two_gpus_is_the_smaller_gpus(monkeypatch):
    """--vllm-tensor-parallel-size 2: each GPU's items (half of vLLM's weights and KV cache, the whole
    workspace) against the smaller of its two GPUs (vLLM gives every worker one fraction). Shape: 2
    layers, hidden 64, 4 heads of 16 (KV 2 x 16 = 32), intermediate 128, vocab 1000, untied: a layer
    64 x 64 + 2 x 64 x 32 + 64 x 64 + 3 x 64 x 128 + 2 x 64 = 36,992, so 128,000 + 2 x 36,992 + 64 =
    202,048 parameters, 404,096 bytes in bf16. Rows 64 of 512 + 100 tokens: KV 2 x 2 x 64 x 612 x 32
    x 2 = 10,027,008. Per GPU: 202,048 + 5,013,504 + 1 GiB = 1,078,957,376 bytes; of 10 GiB (GPU 1):
    10.05%, so 0.11."""
    from grpo.rules.memory import GiB, shape_from_config, vllm_items
    from grpo.sampler import setup

    policy = SimpleNamespace(config=SimpleNamespace(to_dict=lambda: dict(
        hidden_size=64, num_hidden_layers=2, vocab_size=1000, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128)))
    totals = {0: 80 * GiB, 1: 10 * GiB}
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: SimpleNamespace(total_memory=totals[getattr(device, "index", device)]))
    assert vllm_items(shape_from_config(policy.config.to_dict()), 64, 612, 2, 2) == [
        ("vLLM weights", 202_048), ("KV cache", 5_013_504), ("vLLM workspace", GiB)]
    cfg = from_flat(SamplerConfig, in_flight_rows=64, max_new_tokens=100, vllm_tensor_parallel_size=2)
    assert setup.vllm_memory_share(cfg, policy, torch.device("cuda", 0)) == 0.11
    cfg.rollout.vllm_tensor_parallel_size = 1   # one GPU: its own 80 GiB, and the whole of vLLM's items: 0.02
    assert setup.vllm_memory_share(cfg, policy, torch.device("cuda", 0)) == 0.02


@pytest.mark.parametrize("flags, words", [
    (dict(vllm_tensor_parallel_size=2), "--vllm-tensor-parallel-size 2 spreads vLLM's engine over 2 GPUs, but "
                                        "--generation-backend is auto"),
    (dict(vllm_tensor_parallel_size=2, generation_backend="vllm", weight_sync="shared"), "with --weight-sync shared"),
])
def test_a_sampler_started_by_hand_refuses_what_the_launcher_refuses(flags, words):
    from grpo.sampler.setup import check_decoding

    cfg = from_flat(SamplerConfig, model="tiny-random", dataset=str(GSM8K), **flags)
    with pytest.raises(ValueError) as e:
        check_decoding(cfg, torch.device("cuda", 0))
    assert words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("engine_process", [False, True])
def test_sampler_rounds_and_evaluation_through_the_vllm_engine(monkeypatch, engine_process):
    """A sampler with --generation-backend vllm (the engine built over the stand-in): a fixed round is
    one chunk, an in-flight round streams; the groups' old log-probs are the engine's (float32 on CPU:
    --old-logprobs auto takes them) and equal the reference's teacher-forced pass (same weights); a
    greedy evaluation decodes through the engine with Hugging Face generate's texts. With
    --vllm-engine-process the engine is built so, over the stand-in whose engine core steps in a
    thread of its own, its weights loaded by name from handles."""
    from netutil import free_ports

    import grpo.sampler.setup as setup
    from grpo.evaluate import greedy_accuracy
    from grpo.generate.greedy import decode
    from grpo.sampler.loop import Sampler
    from grpo.sampler.workflow import encode_prompts

    built = []

    def fake_build(cls, path, policy, eos, dtype, share, seed, rows=0, tensor_parallel=1, cuda_graphs=True,
                   max_model_len=None, engine_process=False):
        built.append(dict(path=path, eos=eos, dtype=dtype, share=share, rows=rows, tensor_parallel=tensor_parallel,
                          engine_process=engine_process))
        if engine_process:
            llm = FakeMPLLM(policy, seed=seed)
            return cls(llm, make_params, eos, policy, engine_process=True, share=llm.share)
        return cls(FakeLLM(policy, seed=seed), make_params, eos, policy)

    monkeypatch.setattr(setup, "check_vllm", lambda device_type, index, *more: None)
    monkeypatch.setattr(setup, "vllm_memory_share", lambda cfg, policy, device: 0.5)
    monkeypatch.setattr(VllmEngine, "build", classmethod(fake_build))
    d, s = free_ports(2)
    cfg = from_flat(SamplerConfig, model="tiny-random", device="cpu", dataset=str(GSM8K), dataset_limit=8,
                    prompts_per_round=2,
                        num_generations=3, max_new_tokens=6, generation_backend="vllm", data_port=d, sync_port=s,
                    vllm_engine_process=engine_process)
    sampler = Sampler(cfg)
    try:
        parts = sampler.parts
        assert (parts.backend, parts.old_source) == ("vllm", "sampling") and isinstance(parts.engine, VllmEngine)
        assert built == [dict(path=parts.model_path, eos=parts.eos_ids, dtype=torch.float32, share=0.5, rows=0,
                              tensor_parallel=1, engine_process=engine_process)]
        assert parts.engine.version_of() == parts.client.version
        assert parts.workflow.rollout_stream() is parts.engine   # fixed rounds too
        chunks = list(parts.workflow.stream_round(0, 2))   # a fixed round: every prompt in flight, one chunk
        assert len(chunks) == 1 and parts.engine.llm.most_live == 6
        groups = chunks[0]
        sampler.cfg.rollout.in_flight_rows = 3
        parts.engine.llm.most_live = 0
        groups += [g for chunk in parts.workflow.stream_round(1, 2) for g in chunk]
        assert parts.engine.llm.most_live == 3   # in flight: at most 3 rows (one prompt) at a time
        assert parts.engine.llm.loads == 1        # the policy's weights once: no new version came
        problems = parts.prompts.mine[:3]
        _, ids = encode_prompts(parts.tok, problems)
        texts, _, _ = decode(parts.policy, parts.tok, ids, 6, 4, parts.device, engine=parts.engine)
        assert texts == decode(parts.policy, parts.tok, ids, 6, 4, parts.device)[0]   # Hugging Face generate's
        result = greedy_accuracy(parts.policy, parts.tok, problems, 6, 4, parts.device, engine=parts.engine)
        assert result["decoder"] == "vllm" and result["n"] == 3
    finally:
        sampler.parts.data.close()
        sampler.parts.sync.close()
        if engine_process:
            parts.engine.llm.close()
    assert len(groups) == 4 and all(len(g.completions) == 3 for g in groups)
    for g in groups:
        assert g.policy_version == g.max_version == 0
        for c in g.completions:
            n = len(c.generated_token_ids)
            assert 1 <= n <= 6 and c.is_finished == (int(c.generated_token_ids[-1]) in parts.eos_ids)
            assert list(c.whole_token_ids) == list(g.prefix_token_ids) + list(c.generated_token_ids)
            assert c.old_policy_log_probs.shape == c.ref_policy_log_probs.shape == (n,)
            np.testing.assert_allclose(c.old_policy_log_probs, c.ref_policy_log_probs, atol=1e-5)


def test_a_sampler_stops_vllms_engine_process_itself_when_it_ends(monkeypatch):
    """A vLLM sampler whose engine core runs apart (the stand-in's thread) ends as the learner says
    stop: the sampler shuts that engine core down itself, once, before run() returns (VllmEngine.close;
    left to the interpreter's exit, a sampler on a GPU died of SIGSEGV after its last group). An
    engine in the sampler's process has nothing apart to stop."""
    from netutil import free_ports
    from scripted import ScriptedLearner, facts

    import grpo.sampler.setup as setup
    from grpo.sampler.loop import Sampler
    from grpo.wire import messages as M
    from grpo.wire.transport import DataReceiver

    made = []

    def fake_build(cls, path, policy, eos, dtype, share, seed, rows=0, tensor_parallel=1, cuda_graphs=True,
                   max_model_len=None, engine_process=False):
        made.append(FakeMPLLM(policy, seed=seed))
        return cls(made[-1], make_params, eos, policy, engine_process=True, share=made[-1].share)

    monkeypatch.setattr(setup, "check_vllm", lambda device_type, index, *more: None)
    monkeypatch.setattr(setup, "vllm_memory_share", lambda cfg, policy, device: 0.5)
    monkeypatch.setattr(VllmEngine, "build", classmethod(fake_build))
    d, s = free_ports(2)
    receiver = DataReceiver("127.0.0.1", d, M.Limits(), 1 << 26)
    sampler = Sampler(from_flat(SamplerConfig, model="tiny-random", device="cpu", dataset=str(GSM8K), dataset_limit=8,
                                prompts_per_round=2, num_generations=2, max_new_tokens=4, generation_backend="vllm",
                                vllm_engine_process=True, data_port=d, sync_port=s, heartbeat_interval_s=0))
    learner = ScriptedLearner(s, facts(sampler), stop_after_s=1.0)
    learner.start()
    try:
        assert made[0].shutdowns == 0 and made[0].thread.is_alive()
        sampler.run()
    finally:
        learner.done.set()
        learner.join(timeout=10)
        receiver.close()
        made[0].close()
    assert made[0].shutdowns == 1 and not made[0].thread.is_alive() and sampler.parts.engine.closed
    sampler.parts.engine.close()
    assert made[0].shutdowns == 1   # once
    inproc = VllmEngine(FakeLLM(torch.nn.Linear(1, 1)), make_params, [0])
    inproc.close()
    assert not inproc.closed
