"""grpo.generate.vllm_worker on a GPU (skipped without CUDA; vLLM not needed): a tensor's handle, as
plain values through msgpack, rebuilt in another process maps the same memory: it reads the values
the sampler wrote, and what it writes the sampler sees."""
from __future__ import annotations

import multiprocessing as mp

import msgpack
import pytest
import torch

from grpo.generate.vllm_worker import handle_of, typed_args

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def worker(message: bytes, out) -> None:
    from torch.multiprocessing.reductions import rebuild_cuda_tensor
    t = rebuild_cuda_tensor(*typed_args(msgpack.unpackb(message, raw=False)))
    out.put([float(t.float().sum()), list(t.shape), str(t.dtype)])
    t.mul_(2)
    torch.cuda.synchronize()
    out.put("written")


def test_a_handle_maps_the_same_memory_in_another_process():
    t = torch.arange(12, dtype=torch.bfloat16, device="cuda").reshape(3, 4)[1:]   # a view at an offset
    want = [float(t.float().sum()), [2, 4], "torch.bfloat16"]   # before the worker writes (it doubles t)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=worker, args=(msgpack.packb(handle_of(t), use_bin_type=True), out))
    p.start()
    try:
        assert out.get(timeout=120) == want == [60.0, [2, 4], "torch.bfloat16"]
        assert out.get(timeout=60) == "written"
        torch.cuda.synchronize()
        assert t.float().tolist() == [[8.0, 10.0, 12.0, 14.0], [16.0, 18.0, 20.0, 22.0]]
    finally:
        p.join(timeout=60)
    assert p.exitcode == 0
