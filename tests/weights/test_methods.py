"""grpo.weights.methods: which weight-sync method each side uses, and the one fallback rule."""
from __future__ import annotations

import pytest

from grpo.weights.methods import fallback, learner_method, sampler_method, serve_method

GPU, CPU = "cuda", "cpu"   # the rules take a device type


def test_fallback_by_hand():
    assert fallback("ipc", "auto") == "nccl"    # auto: the learner's GPU is not visible -> another host
    assert fallback("ipc", "ipc") == "tcp"      # asked for by name: no guessing, bytes always work
    assert fallback("nccl", "auto") == "tcp"
    assert fallback("nccl", "nccl") == "tcp"
    assert fallback("shared", "shared") == "tcp"


@pytest.mark.parametrize("requested,device,want", [("auto", GPU, "ipc"), ("auto", CPU, "tcp"),
                                                    ("nccl", GPU, "nccl"), ("shared", GPU, "shared"),
                                                    ("tcp", GPU, "tcp")])
def test_learner_method(requested, device, want):
    assert learner_method(requested, device) == want


def test_serve_method_uses_the_same_fallback():
    assert serve_method("", "ipc", has_ipc=True) == "ipc"       # the sampler asked for nothing: what we offer
    assert serve_method("nccl", "ipc", has_ipc=True) == "nccl"  # a sampler on another host
    assert serve_method("ipc", "ipc", has_ipc=False) == fallback("ipc", "ipc") == "tcp"  # a CPU learner
    assert serve_method("tcp", "ipc", has_ipc=True) == "tcp"


def test_a_sampler_steps_down_until_bytes():
    method, seen = sampler_method("auto", GPU), []
    while method != "tcp":
        seen.append(method)
        method = fallback(method, "auto")
    assert seen == ["ipc", "nccl"]


def test_which_methods_acknowledge_a_version():
    """ipc and nccl samplers read the learner's slot, so they acknowledge each version (their follow-up
    request) before the learner may rewrite it; shared (one copy, in turns) and tcp (the bytes came with
    the answer) do not."""
    from grpo.weights.methods import acknowledges
    from grpo.wire.messages import IPC, NCCL, SHARED, TCP

    assert acknowledges(IPC) and acknowledges(NCCL)
    assert not acknowledges(SHARED) and not acknowledges(TCP) and not acknowledges("")
