"""LoRA mode: the learner trains low-rank adapters (peft); samplers get merged weights.

The merge itself is grpo.weights.publisher.publish_named: what samplers receive is the weight
layer's to say. Why merged weights and not the adapters: a sampler then holds a plain Hugging Face model
under the base model's parameter names, needs no peft, generates at full speed (no extra
adapter matmuls per token), and every weight-sync method (tcp, ipc, nccl, shared) works
unchanged because the layout is the base model's. The price is sending the full model each
version instead of a few MB of adapters, which the fast sync methods make cheap.
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from grpo.obs.progress import Progress
from grpo.weights.publisher import publish_named

log = logging.getLogger(__name__)


def parse_target_modules(text: str) -> str | list[str]:
    text = text.strip()
    if text in ("all-linear", "all_linear"):
        return "all-linear"
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise ValueError("--lora-target-modules is empty; give module names like q_proj,v_proj or 'all-linear'")
    return names


def wrap_lora(model: torch.nn.Module, r: int, alpha: float, target_modules: str, dropout: float):
    """`model` with LoRA adapters injected; only the adapters require grad."""
    if r < 0:
        raise ValueError(f"--lora-r {r}: must be > 0, or 0 for full fine-tuning")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"--lora-dropout {dropout}: must be in [0, 1)")
    from peft import LoraConfig, get_peft_model  # here: peft adds ~0.5 s to a learner's import; only --lora-r > 0 needs it

    targets = parse_target_modules(target_modules)
    cfg = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets, bias="none",
                     task_type="CAUSAL_LM")
    try:
        peft_model = get_peft_model(model, cfg)
    except ValueError as exc:  # peft: "Target modules {...} not found in the base model"
        raise ValueError(f"--lora-target-modules {target_modules}: {str(exc).splitlines()[0]}") from None
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in peft_model.parameters())
    log.info("LoRA r=%d alpha=%g on %s: %d trainable of %d parameters (%.2f%%)", r, alpha, targets,
             trainable, total, 100.0 * trainable / max(total, 1))
    return peft_model


def is_peft(model: torch.nn.Module) -> bool:
    # No model can be a PeftModel unless peft was imported: its class is asked of the loaded
    # package, never imported here (peft's import is slow).
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def save_adapter(model: torch.nn.Module, path: str | Path, merged: bool = False) -> Path:
    """Save the LoRA adapter (small: adapter_model.safetensors + adapter_config.json) to `path`;
    with merged=True also a full merged model in `path`/merged (a plain HF folder, loadable
    without peft). The trained model is not modified."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if not is_peft(model):
        raise ValueError("save_adapter needs a LoRA model (--lora-r > 0)")

    bar = Progress(f"saving LoRA adapter to {path}", total=2 if merged else 1, unit="part", every_s=0)
    model.save_pretrained(str(path))
    bar.update(1, part="adapter")
    if merged:
        base = model.get_base_model()

        state = dict(publish_named(model))
        # Tied weights (lm_head = embed_tokens) appear once in named_parameters; a fresh model
        # of the same config keeps the tie, so loading the one copy sets both.
        plain = AutoModelForCausalLM.from_config(base.config, dtype=next(base.parameters()).dtype)
        missing, unexpected = plain.load_state_dict({k: v.cpu() for k, v in state.items()}, strict=False)
        if unexpected or [m for m in missing if m not in state and not _tied(plain, m)]:
            raise RuntimeError(f"merged weights do not fit the base model: missing {missing[:3]}, "
                               f"unexpected {unexpected[:3]}")
        plain.save_pretrained(str(path / "merged"))
        bar.update(1, part="merged model")
    bar.close()
    return path


def _tied(model: torch.nn.Module, name: str) -> bool:
    """True when `name` is a parameter that shares its storage with another (tied embeddings)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    t = params.get(name)
    return t is not None and any(o is t for n, o in params.items() if n != name)


def lora_stats(engine) -> dict:
    """Trainable vs total parameters and how many numbers the optimizer keeps state for
    (Adam's exp_avg), for summary.json: in LoRA mode the state covers the adapters only."""
    module = engine.module
    opt = getattr(engine, "opt", None) or engine._engine.optimizer
    inner = getattr(opt, "optimizer", opt)  # DeepSpeed's ZeRO wrapper holds the torch optimizer
    state = sum(st["exp_avg"].numel() for st in inner.state.values() if "exp_avg" in st)
    return {"trainable_params": sum(p.numel() for p in module.parameters() if p.requires_grad),
            "total_params": sum(p.numel() for p in module.parameters()),
            "frozen_params_with_grad": sum(1 for p in module.parameters() if not p.requires_grad and p.grad is not None),
            "optimizer_state_numel": int(state)}
