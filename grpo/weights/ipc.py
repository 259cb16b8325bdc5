"""Method "ipc": a version handed over through CUDA IPC on one node.

The learner's slots (grpo.weights.slots) and, for method shared, its parameters' own storages
(grpo.weights.shared) are exported as CUDA IPC handles: bytes and integers that name memory
on the learner's GPU, never code. A sampler maps a handle once and caches the mapping; the
GPU is found by UUID, whatever CUDA_VISIBLE_DEVICES numbering this process has.

Sampler side (`IpcReceiver`): its policy's parameters live in one flat local buffer with the
published layout (grpo.weights.receiver), so applying a version is one peer-to-peer copy
(NVLink), not one per tensor. It reads the slot's stamp before and after the copy (a seqlock):
if the learner had begun rewriting the slot (stamp -1 or another version) the copy is thrown
away and the sampler asks again, so no torn version is ever generated with.
"""
from __future__ import annotations

import torch

from grpo.weights.receiver import FlatReceiver
from grpo.wire import messages as M


def gpu_uuid(index: int) -> str:
    return str(torch.cuda.get_device_properties(index).uuid)


def local_index_of(uuid: str) -> int | None:
    """This process's index of the GPU with `uuid`, or None if it is not visible here."""
    for i in range(torch.cuda.device_count()):
        if gpu_uuid(i) == uuid:
            return i
    return None


def share_storage(storage: torch.UntypedStorage, device_index: int, slot: int, stamp_offset: int) -> M.IpcHandle:
    """The IPC handle of a CUDA storage (torch's own `_share_cuda_` fields), to announce."""
    (_dev, handle, size, offset, rc_handle, rc_offset, ev_handle, ev_sync) = storage._share_cuda_()
    return M.IpcHandle(gpu_uuid=gpu_uuid(device_index), slot=slot, handle=bytes(handle), storage_nbytes=int(size),
                       storage_offset=int(offset), ref_counter_handle=bytes(rc_handle),
                       ref_counter_offset=int(rc_offset), event_handle=bytes(ev_handle or b""),
                       event_sync_required=bool(ev_sync), stamp_offset=stamp_offset)


def open_handle(h: M.IpcHandle, index: int) -> torch.Tensor:
    """Map an announced storage (on this process's GPU `index`) as a uint8 tensor."""
    storage = torch.UntypedStorage._new_shared_cuda(index, h.handle, h.storage_nbytes, h.storage_offset,
                                                    h.ref_counter_handle, h.ref_counter_offset, h.event_handle,
                                                    h.event_sync_required)
    return torch.empty(0, dtype=torch.uint8, device=f"cuda:{index}").set_(storage)


class IpcReceiver(FlatReceiver):
    """ipc: one peer-to-peer copy per version from the learner's slot (opened once, cached)."""

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype):
        super().__init__(model, dtype)
        self._opened: dict[tuple[str, bytes, int], torch.Tensor] = {}   # (gpu uuid, handle, offset)
        self.visible = True

    def _open(self, h: M.IpcHandle) -> torch.Tensor:
        # The offset is part of the key: small slots share one allocator segment, so one IPC
        # handle (the segment's) with different offsets; keyed by handle alone, slot 1 would
        # be read through slot 0's view and its stamp would never match (a tiny model's sampler
        # then never applies a version).
        key = (h.gpu_uuid, h.handle, h.storage_offset)
        if key not in self._opened:
            index = local_index_of(h.gpu_uuid)
            if index is None:
                self.visible = False
                raise RuntimeError(f"the learner's GPU {h.gpu_uuid} is not visible to this sampler")
            self._opened[key] = open_handle(h, index)
        return self._opened[key]

    def apply(self, announce: M.WeightsAnnounce) -> bool:
        """Copy `announce`'s version in; False (nothing changed) if the slot was rewritten meanwhile."""
        self.check_layout(announce)
        h = announce.ipc
        remote = self._open(h)
        stamp = remote[h.stamp_offset:h.stamp_offset + 8].view(torch.int64)   # buckets at 0..total
        if int(stamp.item()) != announce.version:
            return False
        self.staging.copy_(remote[:self.total], non_blocking=True)   # peer-to-peer over NVLink
        torch.cuda.synchronize(self.device)
        if int(stamp.item()) != announce.version:   # seqlock: the learner began rewriting the slot
            return False
        self.commit()
        return True
