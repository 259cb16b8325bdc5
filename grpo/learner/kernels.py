"""Fused layers for the learner's passes (--liger-kernel; TRL's use_liger_kernel): which to use
(liger_choice, a rule of its own, tested by hand) and the learner's model patched with them
(fuse_layers). The patch and its scoping are grpo.model.liger's: Liger's module-level names are in
place only around the learner's own forward passes (TrainStep.amp), so the final evaluation's
decode copy (grpo.generate.greedy.decode_copy, built from the config) decodes as our engine
decodes it (grpo.generate.engine: Liger's layers there too under --liger-decode, the default).
The kernels' values against Hugging Face's are bench/learner_kernels.py's (a GPU machine).
"""
from __future__ import annotations

import logging

from grpo.config.training import LIGER_CHOICES
from grpo.model.liger import INSTALL, FusedLayers, apply_liger, liger_installed, liger_supported, scoped_patch  # noqa: F401

log = logging.getLogger(__name__)


def liger_choice(choice: str, cuda: bool, installed: bool, supported: bool) -> tuple[bool, str]:
    """(use Liger's kernels, why in a few words) for --liger-kernel `choice` ('auto', 'on', 'off') on
    a CUDA device or not, with liger-kernel installed or not, for a model type it supports or not.
    'on' where it cannot run is a ValueError naming the fix; 'auto' uses it wherever it can."""
    if choice not in LIGER_CHOICES:
        raise ValueError(f"--liger-kernel {choice!r}: choose one of {', '.join(LIGER_CHOICES)}")
    if choice == "off":
        return False, "--liger-kernel off"
    missing = ("its kernels are Triton kernels, which need a CUDA device" if not cuda else
               f"liger-kernel is not installed ({INSTALL})" if not installed else
               "Liger has no kernels for this model type" if not supported else "")
    if missing and choice == "on":
        raise ValueError(f"--liger-kernel on: {missing}; drop --liger-kernel or pass --liger-kernel off")
    return (False, missing) if missing else (True, "fused RMSNorm, SwiGLU and rotary embedding")


def fuse_layers(model, choice: str, cuda: bool) -> FusedLayers | None:
    """The learner's model with Liger's kernels where --liger-kernel says (None: Hugging Face's
    layers); one line says which and why."""
    installed = liger_installed()
    supported = cuda and installed and liger_supported(model)
    use, why = liger_choice(choice, cuda, installed, supported)
    if not use:
        log.info("learner layers: Hugging Face's (%s)", why)
        return None
    fused = apply_liger(model)
    log.info("learner layers: Liger-Kernel's (%s; %d module-level names set for the learner's passes only)",
             why, len(fused.names))
    return fused
