"""grpo.rules.backend: which decoder --generation-backend gives a process, and auto's measured rule
between our engine and vLLM's, worked by hand."""
import pytest

from grpo.rules.backend import MEASURED_DECODE, auto_engine, backend_for


def test_auto_is_our_engine_on_cuda_and_generate_on_cpu():
    assert [backend_for("auto", d) for d in ("cuda", "cpu")] == ["fast", "hf"]
    assert [backend_for(c, "cuda") for c in ("fast", "hf", "vllm")] == ["fast", "hf", "vllm"]


def test_auto_takes_the_engine_measured_faster_at_the_nearest_size():
    """Sizes 0.5e9 (ours faster) and 7e9 (vLLM faster): 1.5e9 is 3x from 0.5e9 and 4.67x from 7e9,
    so ours; 3e9 is 6x from 0.5e9 and 2.33x from 7e9, so vLLM; without vLLM installed, ours always."""
    table = ((500_000_000, 30_000.0, 15_000.0), (7_000_000_000, 4_000.0, 6_000.0))
    assert auto_engine(1_500_000_000, True, table)[0] == "fast"
    name, why = auto_engine(3_000_000_000, True, table)
    assert name == "vllm" and "at 7.00B parameters" in why and "this model's 3.00B" in why
    assert "our engine decoded 4.0k tokens/s and vLLM's 6.0k" in why
    assert auto_engine(7_000_000_000, False, table) == (
        "fast", "--generation-backend auto: fast (vLLM is not installed, so nothing to weigh it against)")
    with pytest.raises(ValueError, match="at least one parameter"):
        auto_engine(0, True, table)


def test_the_measured_table_says_our_engine_at_both_sizes():
    """The two sizes measured on one H200, vLLM with its engine core in a process of its own
    (--vllm-engine-process, its faster mode): Qwen2.5-Coder-0.5B, ours 49.0k against vLLM's 22.1k; Qwen2.5-7B's shapes, ours
    23.6k against 13.6k. A 3B model is 6.1x from 0.5B and 2.5x from 7.6B."""
    assert MEASURED_DECODE == ((494_032_768, 48_994.0, 22_131.0), (7_615_616_512, 23_586.0, 13_575.0))
    assert auto_engine(494_032_768, True)[0] == "fast"
    name, why = auto_engine(3_000_000_000, True)
    assert name == "fast" and "at 7.62B parameters" in why and "our engine decoded 23.6k tokens/s and vLLM's 13.6k" in why
