"""Fused layers for the learner's passes (--liger-kernel; TRL's use_liger_kernel): the learner's model
patched with Liger-Kernel's layers where grpo.model.liger's rule says, and one line saying which. The
patch's module-level names are in place only around the learner's own forward passes
(TrainStep.amp), so the final evaluation's decode copy (grpo.generate.greedy.decode_copy, built from
the config) decodes as our engine decodes it (grpo.generate.engine: Liger's layers there too under
--liger-decode, the default). The kernels' values against Hugging Face's are
bench/learner_kernels.py's (a GPU machine).
"""
from __future__ import annotations

import logging

from grpo.model.liger import FusedLayers, fuse

log = logging.getLogger(__name__)


def fuse_layers(model, choice: str, cuda: bool) -> FusedLayers | None:
    """The learner's model with Liger's kernels where --liger-kernel says (None: Hugging Face's
    layers); one line says which and why."""
    fused, why = fuse(model, choice, cuda)
    if fused is None:
        log.info("learner layers: Hugging Face's (%s)", why)
    else:
        log.info("learner layers: Liger-Kernel's (%s; %d module-level names set for the learner's passes only)",
                 why, len(fused.names))
    return fused
