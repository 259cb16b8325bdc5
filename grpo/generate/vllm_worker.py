"""What the sampler's vLLM engine runs inside vLLM's workers, and the weights' CUDA IPC handles as
plain values.

vLLM mixes WeightLoader into its Worker class where EngineArgs(worker_extension_cls=EXTENSION) names
it, in whichever process the worker lives: vLLM's engine-core process (--vllm-engine-process) or
one process per GPU (--vllm-tensor-parallel-size > 1). The engine then calls its method by name,
`collective_rpc("grpo_load_weights", args=(names, handles))`, and vLLM carries the arguments with
msgpack: only plain values cross into the worker, no function or Python object. A handle is torch's own CUDA IPC
description of a tensor (torch.multiprocessing's reduce_tensor: the allocation's handle, its size
and offset, an event to wait on; a few hundred bytes, never the weights' bytes), whose three Python
objects (the tensor's and storage's classes and the dtype) travel as names and come back only from
the short list below: a name not on it is refused, never imported.
"""
from __future__ import annotations

import time

import torch
from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

EXTENSION = "grpo.generate.vllm_worker.WeightLoader"
LOAD = "grpo_load_weights"   # WeightLoader's method, called by name

# rebuild_cuda_tensor's arguments (torch's reduce_tensor for a CUDA tensor), by position
_TENSOR_CLS, _SIZE, _STRIDE, _STORAGE_CLS, _DTYPE = 0, 1, 2, 4, 5
_CLASSES = {f"{c.__module__}.{c.__qualname__}": c for c in
            (torch.Tensor, torch.nn.Parameter, torch.storage.TypedStorage, torch.storage.UntypedStorage)}
_DTYPES = {str(d): d for d in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64,
                               torch.int32, torch.int8, torch.uint8, torch.bool)}


def plain_args(args: tuple) -> list:
    """rebuild_cuda_tensor's arguments as values msgpack carries: the classes and the dtype as names,
    the size and stride as lists; everything else (ints, bytes, bools) as it is."""
    out = list(args)
    for i in (_TENSOR_CLS, _STORAGE_CLS):
        out[i] = f"{args[i].__module__}.{args[i].__qualname__}"
    out[_DTYPE] = str(args[_DTYPE])
    out[_SIZE], out[_STRIDE] = list(args[_SIZE]), list(args[_STRIDE])
    return out


def typed_args(plain: list) -> tuple:
    """plain_args undone: the names back to the classes and dtype they name (ValueError for a name not
    on this module's list)."""
    out = list(plain)
    for i, table in ((_TENSOR_CLS, _CLASSES), (_STORAGE_CLS, _CLASSES), (_DTYPE, _DTYPES)):
        if out[i] not in table:
            raise ValueError(f"a weights handle names {out[i]!r}, which is not a tensor class, storage class or dtype "
                             "this loader rebuilds")
        out[i] = table[out[i]]
    out[_SIZE], out[_STRIDE] = tuple(out[_SIZE]), tuple(out[_STRIDE])
    return tuple(out)


def handle_of(tensor: torch.Tensor) -> list:
    """A CUDA tensor's IPC handle as plain values (the tensor stays the caller's: the worker maps the same
    memory, so the caller keeps it unchanged until the load has returned)."""
    if tensor.device.type != "cuda":
        raise ValueError(f"weights travel to vLLM's workers as CUDA IPC handles; this tensor is on {tensor.device}")
    rebuild, args = reduce_tensor(tensor.detach())
    assert rebuild is rebuild_cuda_tensor
    return plain_args(args)


class WeightLoader:
    """Mixed into vLLM's Worker (EXTENSION): `self` is the worker, `self.get_model()` its model (what vLLM's
    own apply_model hands a function: the model runner's, unwrapped from any CUDA-graph wrapper). vLLM
    refuses an extension whose names the Worker has already: ours start with grpo_."""

    grpo_rebuild = staticmethod(rebuild_cuda_tensor)   # a handle's arguments -> the tensor (maps its memory)

    def grpo_load_weights(self, names: list[str], handles: list[list | None]) -> list:
        """Map each handle's memory, load the tensors into this worker's model (vLLM's load_weights takes
        this rank's shard of each and copies it in place) and wait for the copies. A handle of None: the
        tensor this worker mapped under that name at an earlier load. The sampler's parameters stay
        where they are from one version to the next, so it sends each one's handle once and the worker
        keeps the mapping (mapping every handle afresh was most of a swap's host time). Returns [how
        many it loaded, time.monotonic() when they were done]: the system's monotonic clock, which the
        engine-core process's step stamps (EngineCoreOutputs.timestamp) share on one host."""
        if len(names) != len(handles):
            raise ValueError(f"{len(names)} weight names with {len(handles)} handles")
        mapped = getattr(self, "grpo_mapped", None)
        if mapped is None:
            mapped = self.grpo_mapped = {}   # name -> the sampler's tensor, mapped into this process
        for name, h in zip(names, handles):
            if h is not None:
                mapped[name] = self.grpo_rebuild(*typed_args(h))
            elif name not in mapped:
                raise ValueError(f"no tensor mapped for {name!r}: the sampler sends a tensor's handle with its first load")
        weights = [(name, mapped[name]) for name in names]
        self.get_model().load_weights(weights)
        if weights and weights[0][1].is_cuda:
            torch.cuda.synchronize()   # the copies done before the clock is read, and before the caller reuses the tensors
        return [len(weights), time.monotonic()]
