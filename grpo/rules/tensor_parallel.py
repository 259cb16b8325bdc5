"""A vLLM sampler over several GPUs (--vllm-tensor-parallel-size N): which flags allow it and which
GPUs each such sampler takes. Pure and torch-free: the launcher refuses a plan that cannot work
before anything loads, and a sampler started by hand refuses the same flags in the same words.

The rules (docs/configuration.md, "vLLM as the rollout engine"):
  backend   N > 1 needs --generation-backend vllm: only vLLM's engine splits a model over GPUs.
  device    N > 1 needs CUDA (vLLM does).
  weights   N > 1 refuses --weight-sync shared: vLLM's workers are processes of their own and load
            each version from CUDA IPC handles of the sampler's policy, and torch cannot hand on
            tensors the sampler itself mapped from the learner ("shared"'s storages).
  GPUs      each sampler takes N consecutive GPUs of --sampling-gpus, so their count must be a
            multiple of N; the sampler sees them first (its device 0 is the first of them, where
            its own model and vLLM's rank-0 worker live), then learner rank 0's GPU.
  nodes     N > 1 with --nodes is not planned: the several-node plan places one GPU per sampler.
  model     N must divide the model's attention heads and MLP width, and divide or be a multiple of
            its KV heads (vLLM splits them evenly over the ranks, replicating KV heads when there
            are fewer than N; it refuses otherwise, but only once the sampler has loaded).
"""
from __future__ import annotations

FLAG = "--vllm-tensor-parallel-size"


def tensor_parallel_problem(tp: int, backend: str, device_type: str, weight_sync: str, nodes: int = 0) -> str | None:
    """The one-line refusal of a sampler over `tp` GPUs with --generation-backend `backend` (as
    given: 'auto' is not vllm), on `device_type` ('cuda' or 'cpu'), receiving weights by
    `weight_sync`, in a run over `nodes` hosts (--nodes; 0: one host, as a sampler started by hand
    sees it); None when it can work (or tp is 1)."""
    if tp == 1:
        return None
    if backend != "vllm":
        return (f"{FLAG} {tp} spreads vLLM's engine over {tp} GPUs, but --generation-backend is {backend}: add "
                f"--generation-backend vllm, or drop {FLAG}")
    if device_type != "cuda":
        return f"{FLAG} {tp} needs CUDA GPUs (vLLM does), but the run is on {device_type}: drop {FLAG} or run on GPUs"
    if weight_sync == "shared":
        return (f"{FLAG} {tp} with --weight-sync shared: vLLM's workers load each version from CUDA IPC handles of "
                f"the sampler's weights, which cannot be handed on when they are the learner's own; use "
                f"--weight-sync ipc (or nccl, tcp), or {FLAG} 1")
    if nodes:
        return (f"{FLAG} {tp} with --nodes: the several-node plan gives each sampler one GPU; run a vLLM sampler "
                f"over several GPUs on one host, or drop {FLAG}")
    return None


def sampler_groups(sampling_gpus: list[int] | tuple[int, ...], tp: int) -> list[tuple[int, ...]]:
    """Each sampler's GPUs: `tp` consecutive ids of --sampling-gpus, in order (0,1,2,3 with tp 2:
    (0, 1) and (2, 3)). A count that is not a multiple of tp is refused (ValueError, one line)."""
    ids = tuple(sampling_gpus)
    if tp < 1:
        raise ValueError(f"{FLAG} must be at least 1, got {tp}")
    if len(ids) % tp:
        ok = ",".join(map(str, ids[:tp])) if len(ids) >= tp else ",".join(map(str, range(tp)))
        raise ValueError(f"--sampling-gpus {','.join(map(str, ids))} lists {len(ids)} GPU(s), not a multiple of "
                         f"{FLAG} {tp} (each vLLM sampler takes {tp}): list a multiple of {tp}, e.g. "
                         f"--sampling-gpus {ok}")
    return [ids[i:i + tp] for i in range(0, len(ids), tp)]


def visible_devices(group: tuple[int, ...], learner_gpu: int) -> str:
    """A sampler's CUDA_VISIBLE_DEVICES: its own GPUs first (vLLM's worker of rank i takes visible
    device i; the sampler's own model lives on device 0), then learner rank 0's GPU, which CUDA IPC
    weight sync maps (found there by UUID), unless it is one of them already."""
    return ",".join(map(str, dict.fromkeys([*group, learner_gpu])))


def _splits(tp: int, heads: int, kv_heads: int, intermediate: int) -> bool:
    """Whether vLLM can split a model of these widths over `tp` GPUs (0: a width not known)."""
    return ((not heads or heads % tp == 0) and (not kv_heads or kv_heads % tp == 0 or tp % kv_heads == 0)
            and (not intermediate or intermediate % tp == 0))


def model_problem(tp: int, heads: int, kv_heads: int, intermediate: int) -> str | None:
    """The one-line refusal of a model vLLM cannot split over `tp` GPUs (the module's 'model' rule),
    naming the sizes that would; None when it can (or tp is 1)."""
    if tp == 1 or _splits(tp, heads, kv_heads, intermediate):
        return None
    ok = [n for n in range(1, max(heads, kv_heads, 1) + 1) if _splits(n, heads, kv_heads, intermediate)]
    return (f"{FLAG} {tp} cannot split the model (vLLM splits its {heads} attention heads, {kv_heads} KV heads and "
            f"MLP width {intermediate} evenly over a sampler's GPUs): use {FLAG} {' or '.join(map(str, ok))}")
