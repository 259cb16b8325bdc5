"""vLLM's share of a sampler's GPU (grpo.rules.memory: vllm_items, vllm_gpu_fraction, per_gpu), by hand."""
from dataclasses import replace

import pytest

from grpo.rules import memory
from grpo.rules.memory import GiB, RunShape, Shape

# The made-up 1,000,000-parameter model of tests/launch/test_memory_plan.py: 2 layers, KV 2 heads x 16 = 32.
SHAPE = Shape(params=1_000_000, layers=2, hidden=64, kv_dim=32, q_dim=64, intermediate=256, vocab=1000)


def test_per_gpu_splits_and_rounds_up():
    assert memory.per_gpu(10, 1) == 10
    assert memory.per_gpu(10, 2) == 5
    assert memory.per_gpu(10, 3) == 4      # 3.33.. rounded up: no GPU is planned short
    with pytest.raises(ValueError, match="at least 1"):
        memory.per_gpu(10, 0)


def test_vllm_items_by_hand_one_and_several_gpus():
    # weights: 1e6 parameters x 2 bytes = 2,000,000; KV cache: 2 (K, V) x 2 layers x 4 rows x 16 tokens
    # x 32 x 2 bytes = 16,384; the workspace, a stated 1 GiB on every GPU
    assert memory.vllm_items(SHAPE, rows=4, seq=16) == [("vLLM weights", 2_000_000), ("KV cache", 16_384),
                                                        ("vLLM workspace", GiB)]
    # tensor parallel 2: half of each per GPU; 3: a third, rounded up (666,666.7 -> 666,667; 5,461.3 -> 5,462)
    assert memory.vllm_items(SHAPE, 4, 16, tensor_parallel=2) == [("vLLM weights", 1_000_000), ("KV cache", 8_192),
                                                                   ("vLLM workspace", GiB)]
    assert memory.vllm_items(SHAPE, 4, 16, tensor_parallel=3) == [("vLLM weights", 666_667), ("KV cache", 5_462),
                                                                   ("vLLM workspace", GiB)]


def test_vllm_fraction_by_hand():
    # vLLM's items 10 + 29 + 1 = 40 GiB of an 80 GiB GPU: 0.50 exactly; the receiving weights, log-prob
    # pass and CUDA context are the sampler's own (outside vLLM's budget)
    items = [("weights", 10 * GiB), ("vLLM weights", 10 * GiB), ("KV cache", 29 * GiB), ("vLLM workspace", GiB),
             ("log-prob pass", 3 * GiB), ("CUDA context", GiB // 2)]
    assert memory.vllm_gpu_fraction(items, 80 * GiB) == 0.50
    # 40.5 GiB of 80: 0.50625, rounded up to 0.51
    items[2] = ("KV cache", 29 * GiB + GiB // 2)
    assert memory.vllm_gpu_fraction(items, 80 * GiB) == 0.51
    # a tiny share is at least 0.01
    assert memory.vllm_gpu_fraction([("vLLM workspace", 1)], 80 * GiB) == 0.01
    with pytest.raises(ValueError, match="more than its GPU's 80.00 GiB"):
        memory.vllm_gpu_fraction([("KV cache", 81 * GiB)], 80 * GiB)


def test_the_plan_of_a_vllm_sampler():
    """vLLM's engine in the sampler's own process (the default), its items there."""
    r = RunShape(ranks=1, rows=4, prompt_tokens=10, new_tokens=6, beta=0.0, ipc=False, staging=False, vllm=True,
                 logprob_batch_size=4, vllm_process=False)
    s0 = dict(memory.plan(SHAPE, r)["sampler0"])
    # its own weights (the receiver writes them) and vLLM's copy; vLLM's KV cache for 4 rows x 16 tokens
    assert s0["weights"] == s0["vLLM weights"] == 2_000_000
    assert s0["KV cache"] == 16_384 and s0["vLLM workspace"] == GiB
    lp = memory.logprob_pass(SHAPE, 4, 16)
    assert s0["log-prob pass"] == lp and s0["allocator reserve"] == int(0.7 * lp)
    # the fraction the sampler gives vLLM on an 80 GiB GPU: (2,000,000 + 16,384 + 1 GiB) / 80 GiB = 1.25%: 0.02
    assert memory.vllm_gpu_fraction(list(s0.items()), 80 * GiB) == 0.02


def test_a_sampler_over_two_gpus_by_hand():
    """--vllm-tensor-parallel-size 2: the sampler process keeps its own items on its first GPU, and
    vLLM's two worker processes each hold half of vLLM's weights and KV cache, the whole workspace
    and a CUDA context of their own. SHAPE, 4 rows of 10 + 6 tokens, no reference, tcp (no staging):
      sampler0: weights 1e6 x 2 = 2,000,000; log-prob pass 4 x 16 x (2 x 64 + 2 x 256) x 2 = 81,920
        + logits 2 x (4 x 16 x 1000) x 4 = 512,000 -> 593,920; reserve int(0.7 x 593,920) = 415,744;
        CUDA context 536,870,912
      sampler0.tp0 and .tp1: vLLM weights 2,000,000 / 2 = 1,000,000; KV cache 2 x 2 layers x 4 rows
        x 16 x 32 x 2 bytes / 2 = 8,192; workspace 1 GiB = 1,073,741,824; CUDA context 536,870,912"""
    r = RunShape(ranks=1, rows=4, prompt_tokens=10, new_tokens=6, beta=0.0, ipc=False, staging=False, vllm=True,
                 logprob_batch_size=4, tensor_parallel=2)
    p = memory.plan(SHAPE, r)
    assert list(p) == ["learner0", "sampler0", "sampler0.tp0", "sampler0.tp1"]
    assert p["sampler0"] == [("weights", 2_000_000), ("log-prob pass", 593_920), ("allocator reserve", 415_744),
                             ("CUDA context", 536_870_912)]
    worker = [("vLLM weights", 1_000_000), ("KV cache", 8_192), ("vLLM workspace", 1_073_741_824),
              ("CUDA context", 536_870_912)]
    assert p["sampler0.tp0"] == p["sampler0.tp1"] == worker == memory.tp_worker_items(SHAPE, 4, 16, 2, 2)
    # on GPUs 0 and 1 (the launcher's gpu_of): GPU 0 adds the sampler and its rank-0 worker
    totals = memory.gpu_totals(p, {"sampler0": 0, "sampler0.tp0": 0, "sampler0.tp1": 1})
    assert totals == {0: 2_000_000 + 593_920 + 415_744 + 536_870_912 + 1_000_000 + 8_192 + 1_073_741_824
                      + 536_870_912, 1: 1_000_000 + 8_192 + 1_073_741_824 + 536_870_912}
    # the fit check refuses the GPU whose share does not fit (1 GiB: GPU 1's 1,611,620,928 bytes), naming it
    msg = memory.check_fits(p, {0: 80 * GiB, 1: GiB}, {"sampler0": 0, "sampler0.tp0": 0, "sampler0.tp1": 1})
    assert msg.startswith("the memory plan does not fit GPU 1: sampler0.tp1 need about 1.50 GiB of its 1.00 GiB")
    # vLLM's share of each of its GPUs, as the sampler asks for it (vllm_gpu_fraction over its items):
    # (1,000,000 + 8,192 + 1 GiB) / 80 GiB = 1.26%: 0.02
    assert memory.vllm_gpu_fraction(worker, 80 * GiB) == 0.02
    # three samplers' worth of GPUs: each sampler's workers, named by sampler and rank
    p3 = memory.plan(SHAPE, RunShape(rows=4, prompt_tokens=10, new_tokens=6, vllm=True, tensor_parallel=3, samplers=2))
    assert [n for n in p3 if n.startswith("sampler")] == ["sampler0", "sampler0.tp0", "sampler0.tp1", "sampler0.tp2",
                                                          "sampler1", "sampler1.tp0", "sampler1.tp1", "sampler1.tp2"]
    assert dict(p3["sampler1.tp2"])["vLLM weights"] == 666_667   # 2,000,000 / 3 rounded up
    # one GPU, the engine core in the sampler's process: vLLM's items there, no worker of its own
    assert not any(".tp" in n for n in memory.plan(SHAPE, replace(r, tensor_parallel=1)))
    # its engine core in a process of its own: its one worker there
    assert [n for n in memory.plan(SHAPE, replace(r, tensor_parallel=1, vllm_process=True)) if ".tp" in n] == ["sampler0.tp0"]


def test_an_engine_core_in_a_process_of_its_own_holds_vllms_items_there():
    """--vllm-engine-process on one GPU: the sampler keeps its own items (as over two GPUs, above), and
    the engine-core process holds all of vLLM's weights and KV cache, its workspace and a CUDA context
    of its own (one more than in process): 2,000,000 + 16,384 + 1 GiB + 0.5 GiB, all on the one GPU."""
    r = RunShape(ranks=1, rows=4, prompt_tokens=10, new_tokens=6, beta=0.0, ipc=False, staging=False, vllm=True,
                 logprob_batch_size=4, vllm_process=True)
    p = memory.plan(SHAPE, r)
    assert list(p) == ["learner0", "sampler0", "sampler0.tp0"]
    assert p["sampler0"] == [("weights", 2_000_000), ("log-prob pass", 593_920), ("allocator reserve", 415_744),
                             ("CUDA context", 536_870_912)]
    assert p["sampler0.tp0"] == [("vLLM weights", 2_000_000), ("KV cache", 16_384), ("vLLM workspace", 1_073_741_824),
                                 ("CUDA context", 536_870_912)]
    in_process = memory.plan(SHAPE, replace(r, vllm_process=False))
    one_gpu = {"sampler0": 0, "sampler0.tp0": 0}
    assert memory.gpu_totals(p, one_gpu)[0] - memory.gpu_totals(in_process, one_gpu)[0] == 536_870_912
    # the flag means nothing without vLLM: our engine's sampler keeps its plan
    ours = replace(r, vllm=False)
    assert memory.plan(SHAPE, ours) == memory.plan(SHAPE, replace(ours, vllm_process=False))
