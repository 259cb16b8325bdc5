"""What a folder that a training run saved holds, and how `python -m grpo.evaluate --model` loads it.

A run saves its policy in four places (docs/operations.md, "Evaluating a checkpoint"):

  runs/<id>/checkpoints/step_N/     a checkpoint: its policy is in hf/
  runs/<id>/checkpoints/step_N/hf/  full fine-tuning: an ordinary Hugging Face folder (config.json, safetensors);
                                    LoRA: the adapter (adapter_config.json, adapter_model.safetensors) and the tokenizer
  runs/<id>/weights/step_N/         --save-weights-every-s (full fine-tuning only): an ordinary folder, as hf/
  runs/<id>/lora_adapter/           LoRA: the adapter at the end of the run (no tokenizer)

An adapter is merged into its base model for decoding (W + scale * B @ A, peft's merge_and_unload),
as the samplers decode a LoRA run's policy (grpo.learner.lora says why merged): the evaluation runs
a plain model at full speed, through either decoder. The base model is the one the run's saved
config (config_learner.json, in the run folder above the adapter) names, through resolve_model as
the learner loaded it (a GGUF file, tiny-random, a random:* model drawn from its seed); else the
adapter's own base_model_name_or_path; --base-model overrides both.

find_model reads only folder listings and JSON files, so a folder it cannot take is refused before
torch loads.
"""
from __future__ import annotations

import json
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path

from grpo.model.gguf.header import ModelUnavailable

log = logging.getLogger(__name__)

RUN_CONFIG = "config_learner.json"   # grpo.obs.rundir.save_config's file for the learner role
ADAPTER_CONFIG = "adapter_config.json"
MODEL_CONFIG = "config.json"
TAKES = ("a model folder (config.json: weights/step_N/ too), a run's checkpoint (runs/<id>/checkpoints/step_N) "
         "or its hf/, a LoRA run's lora_adapter/, a hub id or a .gguf file")


@dataclass
class FoundModel:
    """What to load for one --model: `model` (a folder or hub id resolve_model gave) with `adapter` (a peft
    adapter folder, or None) merged in; the tokenizer from `tokenizer`; `what`: one line for the log."""

    model: str
    adapter: str | None
    tokenizer: str
    what: str


def find_model(name: str, base_model: str = "") -> FoundModel:
    """The model `name` (--model) names: a folder a run saved (the module's docstring), or anything
    resolve_model takes. A folder that holds neither a model nor an adapter is a ModelUnavailable,
    one line naming what --model takes."""
    path = Path(name).expanduser()
    if not path.is_dir():
        return _plain(name)
    folder = path
    if not _holds_policy(path) and _holds_policy(path / "hf"):
        folder = path / "hf"   # a checkpoint folder: the policy it saved
    if (folder / MODEL_CONFIG).is_file():
        return _plain(str(folder))
    if (folder / ADAPTER_CONFIG).is_file():
        return _adapter(folder, base_model)
    raise ModelUnavailable(f"--model {name} holds no model ({MODEL_CONFIG}) and no LoRA adapter ({ADAPTER_CONFIG})"
                           f"{_hint(path)}; --model takes {TAKES}")


def load_found(found: FoundModel, device, dtype):
    """The model `found` names on `device` in `dtype`, an adapter merged into its base (a plain
    transformers model either way)."""
    from grpo.model.load import load_causal_lm  # here: grpo.model.load brings torch; the evaluate command imports this module before its checks (as _resolve)

    model = load_causal_lm(found.model, device, dtype)
    if found.adapter is None:
        return model
    from peft import PeftModel  # here: peft (slow, brings transformers) only for an adapter

    try:
        with warnings.catch_warnings():
            # peft asks transformers whether gradient checkpointing is on, a name transformers 5 deprecates:
            # a FutureWarning about nothing this load does
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            merged = PeftModel.from_pretrained(model, found.adapter).merge_and_unload()
    except (OSError, ValueError, KeyError, RuntimeError) as exc:   # a missing file, a base of other shapes
        raise ModelUnavailable(f"cannot apply the LoRA adapter {found.adapter} to {found.model}: "
                               f"{str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}; "
                               f"name its base model with --base-model") from None
    return merged.to(device).eval()


def _resolve(name: str) -> str:
    """grpo.model.zoo.resolve_model(name): the folder or hub id a --model value loads from."""
    from grpo.model.zoo import resolve_model  # here: grpo.model.zoo brings torch; the evaluate command imports this module and refuses a bad flag or --dataset before torch loads

    return resolve_model(name)


def _plain(name: str) -> FoundModel:
    path = _resolve(name)
    return FoundModel(path, None, path, f"model {path}")


def _holds_policy(folder: Path) -> bool:
    return (folder / MODEL_CONFIG).is_file() or (folder / ADAPTER_CONFIG).is_file()


def _adapter(folder: Path, base_model: str) -> FoundModel:
    candidates = [(base_model, "--base-model")] if base_model else _bases_of(folder)
    if not candidates:
        raise ModelUnavailable(f"the LoRA adapter {folder} names no base model and no run config ({RUN_CONFIG}) is "
                               f"above it; name the base model with --base-model")
    # The run config first; the adapter's own record where the run's name no longer resolves (a GGUF
    # path relative to the folder the run was launched from, say).
    for i, (base, said) in enumerate(candidates):
        try:
            resolved = _resolve(base)
            break
        except ModelUnavailable as exc:
            if i == len(candidates) - 1:
                raise ModelUnavailable(f"the LoRA adapter {folder}'s base model {base} ({said}) cannot be loaded: "
                                       f"{str(exc).splitlines()[0]}; name it with --base-model") from None
    # The adapter's folder has the tokenizer when a checkpoint saved it (hf/); lora_adapter/ has none.
    tokenizer = str(folder) if (folder / "tokenizer_config.json").is_file() else resolved
    return FoundModel(resolved, str(folder), tokenizer, f"LoRA adapter {folder} merged into {base} ({said})")


def _bases_of(folder: Path) -> list[tuple[str, str]]:
    """The adapter's base model as --model would name it, with where that name came from: the run's
    config, then the adapter's own config (each when it names one)."""
    out = []
    # The run folder is the adapter folder's parent (lora_adapter/) or its grandparent's parent
    # (checkpoints/step_N/hf/): the nearest one holding the learner's config.
    for run_dir in list(folder.resolve().parents)[:3]:
        cfg = run_dir / RUN_CONFIG
        if cfg.is_file():
            model = _json_field(cfg, "model")
            if model:
                out.append((model, f"as {cfg} names it"))
            break
    base = _json_field(folder / ADAPTER_CONFIG, "base_model_name_or_path")
    if base and base not in [b for b, _ in out]:
        out.append((base, f"as its {ADAPTER_CONFIG} names it"))
    return out


def _json_field(path: Path, key: str) -> str | None:
    try:
        value = json.loads(path.read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and value else None


def _hint(path: Path) -> str:
    """Where a folder near the one given holds what --model takes: a run folder's newest checkpoint."""
    steps = sorted((p for p in (path / "checkpoints").glob("step_*") if p.name[5:].isdigit()),
                   key=lambda p: int(p.name[5:]))
    if steps:
        return f" (a run folder: its newest checkpoint is {steps[-1]})"
    if (path / "trainer_state.json").is_file() or (path / "rng_rank0.json").is_file():
        return " (a checkpoint without its hf/ folder)"
    return ""
