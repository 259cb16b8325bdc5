"""Fused layers for the learner's passes: Liger-Kernel's RMSNorm, SwiGLU MLP and rotary embedding in
place of Hugging Face's (--liger-kernel; TRL's use_liger_kernel), applied the way TRL applies them
(liger_kernel.transformers._apply_liger_kernel_to_instance on the loaded model).

Liger patches two things: the model instance's norm and MLP modules (their forward rebound), and
names in the model's modelling module (its RMSNorm and MLP classes, its apply_rotary_pos_emb), which
every model of that type in the process would then use. The learner keeps the first and scopes the
second: the module-level names go back to Hugging Face's as soon as the model is patched, and
FusedLayers.passes() puts Liger's in only around the learner's own forward passes (TrainStep.amp).
So the final evaluation's decode copy (grpo.generate.greedy.decode_copy, built from the config) is
Hugging Face's model, decoding as sampler 0 decoded the baseline. The backward needs no scope: it
runs Liger's autograd functions the forward recorded.

Liger's kernels are Triton kernels: CUDA only, and liger-kernel is not a requirement (`pip install
liger-kernel`). The choice (liger_choice) is a rule of its own, tested by hand; the kernels' values
against Hugging Face's are bench/learner_kernels.py's (a GPU machine).
"""
from __future__ import annotations

import contextlib
import importlib.util
import logging
import sys
from dataclasses import dataclass, field
from typing import Callable

from grpo.config.training import LIGER_CHOICES

log = logging.getLogger(__name__)

INSTALL = "pip install liger-kernel"


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


def liger_installed() -> bool:
    return importlib.util.find_spec("liger_kernel") is not None


@dataclass
class FusedLayers:
    """The module-level names a patch changed: (module, name, Hugging Face's value, the patch's)."""
    names: list[tuple[object, str, object, object]] = field(default_factory=list)

    @contextlib.contextmanager
    def passes(self):
        """The patch's module-level names in place for the passes inside (one thread: the learner's)."""
        for mod, name, _, new in self.names:
            setattr(mod, name, new)
        try:
            yield
        finally:
            for mod, name, old, _ in self.names:
                setattr(mod, name, old)


def scoped_patch(apply: Callable[[object], None], model) -> FusedLayers:
    """Run apply(model) (a patch of the instance and of module-level names), then put every
    transformers module-level name it changed back: the returned FusedLayers puts them in again
    for the passes inside its passes()."""
    def loaded() -> dict[str, object]:
        return {n: m for n, m in list(sys.modules.items()) if n.startswith("transformers.") and m is not None}

    before = {n: dict(vars(m)) for n, m in loaded().items()}
    fused = FusedLayers()
    try:
        apply(model)
    finally:   # a patch that fails half-way leaves no module-level name behind either
        for n, m in loaded().items():
            old = before.get(n)
            if old is None:
                continue
            for name, value in list(vars(m).items()):
                if name in old and old[name] is not value:
                    fused.names.append((m, name, old[name], value))
                    setattr(m, name, old[name])
    return fused


def fuse_layers(model, choice: str, cuda: bool) -> FusedLayers | None:
    """The learner's model with Liger's kernels where --liger-kernel says (None: Hugging Face's
    layers); one line says which and why."""
    installed, supported = liger_installed(), False
    if cuda and installed:
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
        supported = getattr(model.config, "model_type", None) in MODEL_TYPE_TO_APPLY_LIGER_FN
    use, why = liger_choice(choice, cuda, installed, supported)
    if not use:
        log.info("learner layers: Hugging Face's (%s)", why)
        return None
    from liger_kernel.transformers import _apply_liger_kernel_to_instance

    fused = scoped_patch(lambda m: _apply_liger_kernel_to_instance(
        model=m, rope=True, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=False), model)
    log.info("learner layers: Liger-Kernel's (%s; %d module-level names set for the learner's passes only)",
             why, len(fused.names))
    return fused
