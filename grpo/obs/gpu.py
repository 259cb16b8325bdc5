"""GPU utilisation and memory of this process, for the per-step and per-round logs.

NVML (the `nvidia-ml-py` package, module `pynvml`) gives device utilisation, device memory
and this process's own memory; without it, torch's allocator counters are reported alone.
On a CPU-only process everything here is silently empty.
"""
from __future__ import annotations

import logging
import os

import torch

from grpo.config import ALLOC_ENV, allocator_conf

try:
    import pynvml
except ImportError:   # nvidia-ml-py not installed: torch's counters alone (GpuMonitor's except)
    pynvml = None

log = logging.getLogger(__name__)


class GpuMonitor:
    def __init__(self, device: torch.device):
        self.device = device
        self._nvml = None
        self._handle = None
        if device.type != "cuda":
            return
        try:
            if pynvml is None:
                raise ImportError("no module named pynvml (pip install nvidia-ml-py)")
            pynvml.nvmlInit()
            # Find our GPU by UUID: CUDA_VISIBLE_DEVICES renumbers devices, NVML does not.
            uuid = str(torch.cuda.get_device_properties(device).uuid)
            uuid = uuid if uuid.startswith(("GPU-", "MIG-")) else "GPU-" + uuid
            self._handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            self._nvml = pynvml
        except Exception as exc:  # no NVML library, no permission, MIG...: torch counters still work
            log.debug("NVML unavailable (%s); reporting torch memory counters only", exc)

    def sample(self) -> dict[str, float]:
        """{} on CPU; else memory in GB (allocated, reserved, and the peaks of both since the last
        sample: torch's peak counters are reset here) and, with NVML, util_pct, device memory
        used/total and this process's own memory."""
        if self.device.type != "cuda":
            return {}
        out = {"mem_alloc_gb": torch.cuda.memory_allocated(self.device) / 1e9,
               "mem_reserved_gb": torch.cuda.memory_reserved(self.device) / 1e9,
               "mem_peak_gb": torch.cuda.max_memory_allocated(self.device) / 1e9,
               # the allocator's segments at their largest: beyond the allocated peak, what it caches
               "mem_reserved_peak_gb": torch.cuda.max_memory_reserved(self.device) / 1e9}
        torch.cuda.reset_peak_memory_stats(self.device)
        if self._nvml is not None:
            nv = self._nvml
            try:
                out["util_pct"] = float(nv.nvmlDeviceGetUtilizationRates(self._handle).gpu)
                mem = nv.nvmlDeviceGetMemoryInfo(self._handle)
                out["dev_mem_used_gb"] = mem.used / 1e9
                out["dev_mem_total_gb"] = mem.total / 1e9
                pid = os.getpid()
                for p in nv.nvmlDeviceGetComputeRunningProcesses(self._handle):
                    if p.pid == pid and p.usedGpuMemory is not None:
                        out["proc_mem_gb"] = p.usedGpuMemory / 1e9
            except Exception:  # a transient NVML error must never stop training
                pass
        return out


def format_gpu(stats: dict[str, float]) -> str:
    """A short log suffix: ' | gpu 87% 12.3/80.0 GB (proc 10.1, peak 9.8)', or '' on CPU."""
    if not stats:
        return ""
    parts = []
    if "util_pct" in stats:
        parts.append(f"{stats['util_pct']:.0f}%")
    if "dev_mem_used_gb" in stats:
        parts.append(f"{stats['dev_mem_used_gb']:.1f}/{stats['dev_mem_total_gb']:.1f} GB")
    extra = [f"proc {stats['proc_mem_gb']:.2f}"] if "proc_mem_gb" in stats else []
    extra.append(f"alloc {stats['mem_alloc_gb']:.2f}, peak {stats['mem_peak_gb']:.2f} GB")
    return " | gpu " + " ".join(parts) + (" " if parts else "") + "(" + ", ".join(extra) + ")"


def release_cached(device: torch.device) -> tuple[float, float]:
    """(GiB torch's allocator held, GiB it holds after) once the memory it caches but no tensor
    uses is handed back to the driver; (0, 0) off CUDA.

    Start-up leaves blocks cached that the steady state may never fit into again: the learner's
    model is copied into DeepSpeed's flat buffers and float32 partitions, the sampler's into its
    weight-sync buckets. On a GPU shared by learner and sampler, what one process keeps cached
    the other cannot have; how much start-up leaves unused at the sizes users train is in
    docs/benchmarks.md ("Expandable segments, and start-up's cache handed back"). Called once, after start-up: empty_cache waits for the device, which is idle then."""
    if device.type != "cuda":
        return 0.0, 0.0
    held = torch.cuda.memory_reserved(device) / 2**30
    torch.cuda.empty_cache()
    kept = torch.cuda.memory_reserved(device) / 2**30
    conf, users = allocator_conf(os.environ)   # what grpo.workers set before torch loaded, or the user's
    log.info("start-up left %.2f GiB reserved by torch's allocator (%s, %s): %.2f GiB unused, handed back to "
             "the driver (%.2f GiB still reserved)", held, conf or "torch's defaults",
             "the user's settings" if users else f"the default here; {ALLOC_ENV} chooses others",
             held - kept, kept)
    return held, kept
