"""Liger-Kernel's fused RMSNorm, SwiGLU MLP and rotary embedding in place of Hugging Face's, applied
the way TRL applies them (liger_kernel.transformers._apply_liger_kernel_to_instance on a loaded
model), for the learner's passes (--liger-kernel, grpo.learner.kernels) and our engine's decode
(--liger-decode, grpo.generate.engine).

Liger patches two things: the model instance's norm and MLP modules (their forward rebound), and
names in the model's modelling module (its RMSNorm and MLP classes, its apply_rotary_pos_emb), which
every model of that type in the process would then use. apply_liger keeps the first and scopes the
second: the module-level names go back to Hugging Face's as soon as the model is patched, and
FusedLayers.passes() puts Liger's in only around its owner's own forward passes (the learner's
step, the engine's prefill and decode steps; a CUDA graph captured inside keeps Liger's kernels).
So another model of that type in the process (a decode copy, a reference model) keeps Hugging
Face's rotary embedding unless it is patched too. The backward needs no scope: it runs Liger's
autograd functions the forward recorded.

Liger's kernels are Triton kernels: CUDA only, and liger-kernel is not a requirement (`pip install
liger-kernel`, or `pip install -e '.[liger]'`). Whether to use them (liger_choice) is a rule of its
own, tested by hand.
"""
from __future__ import annotations

import contextlib
import importlib.util
import sys
from dataclasses import dataclass, field
from typing import Callable

from grpo.config.training import LIGER_CHOICES

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


def liger_supported(model) -> bool:
    """Whether Liger has kernels for this model's type (liger-kernel must be installed)."""
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    return getattr(model.config, "model_type", None) in MODEL_TYPE_TO_APPLY_LIGER_FN


@dataclass
class FusedLayers:
    """The module-level names a patch changed: (module, name, Hugging Face's value, the patch's); and
    each of the model's modules with its attributes before the patch (`instance`, for remove)."""
    names: list[tuple[object, str, object, object]] = field(default_factory=list)
    instance: list[tuple[object, dict]] = field(default_factory=list)

    def remove(self) -> None:
        """Undo the patch of the instance: every module's attributes as they were before it (Liger's
        instance patch sets attributes and binds methods in each module's __dict__). The module-level
        names are Hugging Face's outside passes() already."""
        for module, before in self.instance:
            now = module.__dict__
            for key in [k for k in now if k not in before]:
                del now[key]
            for key, value in before.items():
                if now.get(key) is not value:
                    now[key] = value

    @contextlib.contextmanager
    def passes(self):
        """The patch's module-level names in place for the passes inside (one thread: the owner's)."""
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
    for the passes inside its passes(), and its remove() undoes the instance's patch."""
    def loaded() -> dict[str, object]:
        return {n: m for n, m in list(sys.modules.items()) if n.startswith("transformers.") and m is not None}

    before = {n: dict(vars(m)) for n, m in loaded().items()}
    fused = FusedLayers(instance=[(m, dict(m.__dict__)) for m in model.modules()])
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


def apply_liger(model) -> FusedLayers:
    """Liger's RMSNorm, SwiGLU and rotary kernels on `model` (no fused cross-entropy: the callers
    take their own log-probs), its module-level names scoped (FusedLayers.passes)."""
    from liger_kernel.transformers import _apply_liger_kernel_to_instance

    return scoped_patch(lambda m: _apply_liger_kernel_to_instance(
        model=m, rope=True, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=False), model)


def fuse(model, choice: str, cuda: bool) -> tuple[FusedLayers | None, str]:
    """(the patch on `model`, or None for Hugging Face's layers; why in a few words) for a choice of
    liger_choice's on a CUDA device or not: the one rule the learner (--liger-kernel) and our engine
    (--liger-decode: 'auto' or 'off') both follow."""
    installed = liger_installed()
    use, why = liger_choice(choice, cuda, installed, cuda and installed and liger_supported(model))
    return (apply_liger(model) if use else None), why
