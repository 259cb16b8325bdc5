"""grpo.generate.vllm_worker on CPU: a CUDA IPC handle's arguments as plain values (what vLLM's
msgpack carries to our loader in its workers) and back, a name not on the loader's list refused
without importing it, and the loader's own checks. Its CUDA path: tests/generate/test_vllm_worker_gpu.py."""
from __future__ import annotations

from types import SimpleNamespace

import msgpack
import pytest
import torch

from grpo.generate.vllm_worker import WeightLoader, handle_of, plain_args, typed_args

# rebuild_cuda_tensor's arguments as torch's reduce_tensor gives them for a CUDA tensor (values by hand)
ARGS = (torch.nn.Parameter, torch.Size([3, 4]), (4, 1), 8, torch.storage.TypedStorage, torch.bfloat16, 0,
        b"\x01\x02handle", 4096, 512, True, b"ref", 16, b"\x00event", True)


def test_a_handle_crosses_msgpack_and_comes_back_as_it_was():
    plain = plain_args(ARGS)
    assert plain[:7] == ["torch.nn.parameter.Parameter", [3, 4], [4, 1], 8, "torch.storage.TypedStorage",
                         "torch.bfloat16", 0]
    carried = msgpack.unpackb(msgpack.packb(plain, use_bin_type=True), raw=False)
    back = typed_args(carried)
    assert back == tuple(ARGS) and back[0] is torch.nn.Parameter and back[5] is torch.bfloat16
    assert type(back[1]) is tuple and type(back[7]) is bytes


@pytest.mark.parametrize("at, name", [(0, "os.system"), (4, "builtins.eval"), (5, "torch.complex64")])
def test_a_name_not_on_the_list_is_refused(at, name):
    plain = plain_args(ARGS)
    plain[at] = name
    with pytest.raises(ValueError, match=f"names {name!r}, which is not a tensor class, storage class or dtype"):
        typed_args(plain)


def test_only_a_cuda_tensor_has_a_handle():
    with pytest.raises(ValueError, match="travel to vLLM's workers as CUDA IPC handles; this tensor is on cpu"):
        handle_of(torch.ones(2))


def test_the_loader_loads_what_it_rebuilt_and_says_how_many():
    got, table = [], {b"a": torch.ones(2), b"b": torch.zeros(3)}

    class Worker(WeightLoader):
        def get_model(self):
            return SimpleNamespace(load_weights=got.extend)

        def grpo_rebuild(self, *args):
            return table[args[7]]

    def handle(key):
        t = table[key]
        return plain_args((torch.Tensor, t.size(), t.stride(), 0, torch.storage.TypedStorage, t.dtype, 0, key, 8, 0,
                           False, b"", 0, b"", False))

    worker = Worker()
    n, when = worker.grpo_load_weights(["x", "y"], [handle(b"a"), handle(b"b")])
    assert n == 2 and isinstance(when, float)
    assert [(name, t.tolist()) for name, t in got] == [("x", [1.0, 1.0]), ("y", [0.0, 0.0, 0.0])]
    table[b"a"].fill_(3.0)   # the sampler writes the next version into the same memory
    del table[b"a"], table[b"b"]   # and sends no handles: the worker finds what it mapped
    got.clear()
    assert worker.grpo_load_weights(["x", "y"], [None, None])[0] == 2
    assert [(name, t.tolist()) for name, t in got] == [("x", [3.0, 3.0]), ("y", [0.0, 0.0, 0.0])]
    with pytest.raises(ValueError, match="no tensor mapped for 'z': the sampler sends a tensor's handle with its first"):
        worker.grpo_load_weights(["z"], [None])
    with pytest.raises(ValueError, match="2 weight names with 1 handles"):
        Worker().grpo_load_weights(["x", "y"], [None])
