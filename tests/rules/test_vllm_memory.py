"""vLLM's share of a sampler's GPU (grpo.rules.memory: vllm_items, vllm_gpu_fraction, per_gpu), by hand."""
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
    r = RunShape(ranks=1, rows=4, prompt_tokens=10, new_tokens=6, beta=0.0, ipc=False, staging=False, vllm=True,
                 logprob_batch_size=4)
    s0 = dict(memory.plan(SHAPE, r)["sampler0"])
    # its own weights (the receiver writes them) and vLLM's copy; vLLM's KV cache for 4 rows x 16 tokens
    assert s0["weights"] == s0["vLLM weights"] == 2_000_000
    assert s0["KV cache"] == 16_384 and s0["vLLM workspace"] == GiB
    lp = memory.logprob_pass(SHAPE, 4, 16)
    assert s0["log-prob pass"] == lp and s0["allocator reserve"] == int(0.7 * lp)
    # over two GPUs (planned), each holds half of vLLM's weights and cache
    s2 = dict(memory.plan(SHAPE, RunShape(rows=4, prompt_tokens=10, new_tokens=6, beta=0.0, vllm=True,
                                          tensor_parallel=2))["sampler0"])
    assert (s2["vLLM weights"], s2["KV cache"]) == (1_000_000, 8_192)
    # the fraction the sampler gives vLLM on an 80 GiB GPU: (2,000,000 + 16,384 + 1 GiB) / 80 GiB = 1.25%: 0.02
    assert memory.vllm_gpu_fraction(list(s0.items()), 80 * GiB) == 0.02
