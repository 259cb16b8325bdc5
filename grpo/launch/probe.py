"""What the memory plan (grpo.rules.memory) is computed from, read before anything loads and
without torch: the model's shape from its config.json (or, for the default model or a --model
FILE.gguf, its GGUF header), the GPUs' memory from the CUDA driver (ctypes), the learner's
micro-batch from the --deepspeed-config, and the run's shape from the roles' parsed configs.
"""
from __future__ import annotations

import ctypes
import json
import math
import os
import struct
from pathlib import Path

from grpo.config import allocator_conf, expandable_segments, micro_token_budget, resolve_precision
from grpo.model import fetch
from grpo.model.gguf.header import ModelUnavailable, find_gguf, gguf_config
from grpo.rules.backend import backend_for
from grpo.rules.memory import PROMPT_TOKENS, RunShape, Shape, decode_rows, shape_from_config
from grpo.rules.staleness import Staleness
from grpo.weights.methods import IPC, NCCL, SHARED, sampler_method

# --model names grpo.model builds into cache folders (grpo.model.zoo._BUILDERS; a test keeps them equal)
BUILT_FOLDERS = {"smollm2": "smollm2-135m-instruct", "tiny-random": "tiny-random-llama",
                 **{f"random:qwen2.5-{k}": f"random-qwen2.5-{k}" for k in ("0.5b", "1.5b", "3b", "7b")}}
# --model names whose folder grpo.model converts from the GGUF file (grpo.model.zoo._convert_smollm2):
# before the first load converts it, the GGUF's header gives the same shape (grpo.model.gguf.header), as it
# does for any --model FILE.gguf (read_shape)
FROM_GGUF = frozenset({"smollm2"})


def model_folder(model: str, cache: str | None = None) -> Path | None:
    """The folder holding --model's config.json without building anything: an embedded name's
    cache folder, a short name's GGUF file once fetched (grpo.model.fetch), or a path; None for a hub
    id (not looked up here)."""
    if model in fetch.MODELS:
        return fetch.find(model)
    if model in BUILT_FOLDERS:
        base = cache or os.environ.get("GRPO_CACHE") or str(Path.home() / ".cache" / "grpo")
        return Path(base) / BUILT_FOLDERS[model]
    p = Path(model).expanduser()
    return p if p.exists() else None


def read_shape(model: str) -> tuple[Shape | None, str]:
    """(shape, "") or (None, a one-line note why there is no plan)."""
    folder = model_folder(model)
    gguf_file = folder is not None and folder.is_file()   # --model FILE.gguf (grpo.model converts it at load)
    if gguf_file or (folder is not None and not (folder / "config.json").is_file() and model in FROM_GGUF):
        # A first run: the folder is converted at load, but the config it will hold is the GGUF
        # header's (read here in ~0.05 s, no tensor touched), so the first run is checked too.
        try:
            gguf = folder if gguf_file else find_gguf()
        except ModelUnavailable:
            gguf = None   # not installed: the load will say so; the plan is skipped as for any missing config
        if gguf is not None:
            try:
                return shape_from_config(gguf_config(gguf)), ""
            except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
                return None, f"memory plan skipped: cannot read the GGUF header of {gguf}: {exc}"
    if folder is None or not (folder / "config.json").is_file():
        return None, f"memory plan skipped: no config.json for --model {model} here yet (built or fetched at load)"
    try:
        return shape_from_config(json.loads((folder / "config.json").read_text())), ""
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"memory plan skipped: cannot read {folder / 'config.json'}: {exc}"


def cuda_driver():
    """(the CUDA driver library, the GPUs it sees) after cuInit, or None without a driver or a GPU.
    Asked of the driver itself (it honours CUDA_VISIBLE_DEVICES, as torch does): importing torch to
    ask took seconds on a GPU machine, all of them before any worker could start."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")   # the driver's library (Linux); absent without a driver
    except OSError:
        return None
    count = ctypes.c_int(0)
    # CUresult 0 is CUDA_SUCCESS; anything else (100 CUDA_ERROR_NO_DEVICE, 999 unknown, a driver
    # older than the kernel module, ...) means CUDA cannot be used here.
    if lib.cuInit(0) != 0 or lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return None
    return lib, count.value


def gpu_total_bytes() -> dict[int, int]:
    """{visible GPU index: total memory in bytes} from the CUDA driver (cuDeviceTotalMem_v2); {}
    without a driver or a GPU (no check)."""
    if (driver := cuda_driver()) is None:
        return {}
    lib, count = driver
    out = {}
    for i in range(count):
        dev, size = ctypes.c_int(0), ctypes.c_size_t(0)
        if lib.cuDeviceGet(ctypes.byref(dev), i) == 0 and lib.cuDeviceTotalMem_v2(ctypes.byref(size), dev) == 0:
            out[i] = size.value
    return out


def micro_batch_size(ds_config: str, train_batch_size: int, ranks: int) -> int:
    """The learner's micro-batch (grpo.learner.engine.resolve_ds_config): the --deepspeed-config's
    train_micro_batch_size_per_gpu, or "auto": ceil(train batch / ranks); never more than a rank's
    share of the batch. An unreadable file counts as "auto" (the learner reports it)."""
    share = max(1, math.ceil(train_batch_size / max(ranks, 1)))
    try:
        micro = json.loads(Path(ds_config).read_text()).get("train_micro_batch_size_per_gpu", "auto")
        micro = share if micro == "auto" else int(micro)
    except (OSError, ValueError, TypeError, AttributeError):
        micro = share
    return max(1, min(micro, share))


def run_shape(lcfg, scfg, ranks: int, samplers: int, ds_config: str) -> RunShape:
    """A RunShape from the learner's and a sampler's parsed configs (grpo.config), on CUDA."""
    method = sampler_method(scfg.weight_sync.weight_sync, "cuda")   # the plan is for CUDA: auto is ipc
    rows = decode_rows(scfg.rollout.num_generations, scfg.rollout.prompts_per_round, scfg.rollout.in_flight_rows,
                       Staleness(lcfg.training.max_staleness,
                                 lcfg.training.train_batch_size // scfg.rollout.num_generations),
                       scfg.rollout.filter_zero_signal, scfg.rollout.max_prompts_per_round, samplers,
                       scfg.rollout.cuda_graphs)
    micro = micro_batch_size(ds_config, lcfg.training.train_batch_size, ranks)
    return RunShape(ranks=ranks, lora_r=lcfg.training.lora_r, beta=lcfg.loss.beta, ipc=method == IPC,
                    shared=method == SHARED, staging=method in (IPC, NCCL), rows=rows,
                    prompt_tokens=min(PROMPT_TOKENS, lcfg.faults.max_prompt_tokens),
                    new_tokens=scfg.rollout.max_new_tokens, micro_batch=micro,
                    # the budget the learner packs by (grpo.learner.loop), from its own flags
                    micro_tokens=micro_token_budget(lcfg.training.micro_batch_tokens, micro,
                                                    lcfg.faults.max_prompt_tokens,
                                                    lcfg.rollout.max_new_tokens),
                    logprob_batch_size=scfg.rollout.logprob_batch_size,
                    samplers=samplers,
                    precision=resolve_precision(lcfg.training.precision, True, lcfg.training.lora_r > 0,
                                                not lcfg.training.no_deepspeed),
                    deepspeed=not lcfg.training.no_deepspeed, entropy=lcfg.loss.entropy_coef > 0,
                    expandable=expandable_segments(allocator_conf(os.environ)[0]),
                    vllm=backend_for(scfg.rollout.generation_backend, "cuda") == "vllm",
                    tensor_parallel=scfg.rollout.vllm_tensor_parallel_size,
                    vllm_process=scfg.rollout.vllm_engine_process)
