"""The engine's attention: the function its passes dispatch to (`rollout_attention`: GQA decode
without repeating the cache, only the filled slots read, Gemma2-style soft-capping), which layers
the engine serves (`layer_plan`: full and sliding-window attention), and the additive masks each
kind of layer is given (`layer_masks`).

Every layer's cache holds the whole sequence (slot = position, sliding layers included), so a
sliding layer differs from a full one only in its mask: a key at most window - 1 positions back.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.cache_utils import get_layer_types_and_kwargs
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from grpo.generate.backend import describe
from grpo.generate.decode_attention import decode_attention

ATTENTION = "grpo_rollout"
_kernel = False   # decode steps through grpo.generate.decode_attention (set by rollout_attention_on)


def register_attention() -> None:
    """Make ATTENTION a name Hugging Face models can dispatch to (idempotent)."""
    AttentionInterface.register(ATTENTION, rollout_attention)


@contextlib.contextmanager
def rollout_attention_on(model, kernel: bool = False):
    """Run the model's layers with rollout_attention (the model's own setting is restored after, so
    evaluation and log-prob passes keep theirs); kernel: its decode steps with the Triton kernel
    (the engine's choice, checked at its start). A captured graph keeps the kernels chosen here:
    only eager calls need the switch."""
    global _kernel
    cfg = model.config
    before, before_kernel = cfg._attn_implementation, _kernel
    cfg._attn_implementation, _kernel = ATTENTION, kernel
    try:
        yield
    finally:
        cfg._attn_implementation, _kernel = before, before_kernel


def attend_limit(width: int, length: int, k: int, chunk: int) -> int:
    """The cache slots decode step k reads (k >= 1; after a prefill of `width` slots, step k
    writes slot width + k - 1, so it needs width + k): rounded up to a multiple of `chunk` past
    the prompt, so that one captured graph serves `chunk` steps; at most `length`."""
    return min(length, width + chunk * -(-k // chunk))


def rollout_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                      **kwargs):
    """Attention for the engine's passes. A one-token query (decode) with grouped KV heads
    (GQA: SmolLM2 3 KV heads for 9, Qwen2.5-3B 2 for 16) attends the cache without copying it:
    the G query heads that share a KV head become G "query rows" of that head. Hugging Face's
    SDPA path instead repeats the whole cache G times per layer and step (`repeat_kv`, a
    copy), which on a 3B model at 256 rows took half the decode step. A decode mask shorter than
    the cache (the engine's attend_chunk) says how many slots the step reads: only those are read
    (the slots past it are empty, so this changes which zeros are summed, not the result).
    With the engine's kernel on (rollout_attention_on), a decode step is grpo.generate.decode_attention's.
    Prefill (many query tokens, once per round) goes through Hugging Face's SDPA function unchanged.
    With `softcap` (Gemma2's attn_logit_softcapping: scores become tanh(scores / cap) * cap before the
    mask and softmax), which SDPA has no argument for, both go through an explicit path instead
    (_softcapped_attention), as Hugging Face's eager attention computes it."""
    b, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    if q_len == 1 and attention_mask is not None and attention_mask.shape[-1] < key.shape[2]:
        n = attention_mask.shape[-1]
        key, value = key[:, :, :n], value[:, :, :n]                                           # [B, H_kv, n, D]
    softcap = kwargs.pop("softcap", None)
    if softcap is not None:
        return _softcapped_attention(query, key, value, attention_mask, scaling, softcap), None
    if q_len == 1 and _kernel:   # [B, H_kv, G, D] in and out: the same pairing of query and KV heads as below
        out = decode_attention(query.view(b, kv_heads, heads // kv_heads, dim), key, value, attention_mask,
                               dim ** -0.5 if scaling is None else scaling)
        return out.view(b, 1, heads, dim), None                                                # [B, 1, H, D]
    if q_len != 1 or heads == kv_heads:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    # repeat_kv puts query head j on KV head j // G, so [B, H, 1, D] -> [B, H_kv, G, D] pairs them up.
    q = query.view(b, kv_heads, heads // kv_heads, dim)
    out = torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=attention_mask,  # [B, 1, 1, L]
                                                           scale=scaling)
    return out.reshape(b, heads, 1, dim).transpose(1, 2).contiguous(), None                # [B, 1, H, D]


def _softcapped_attention(query, key, value, attention_mask, scaling, softcap: float) -> torch.Tensor:
    """softmax(tanh(q k^T * scaling / cap) * cap + mask) v, in the order of Hugging Face's eager
    Gemma2 attention (softmax in float32), with grouped KV heads broadcast rather than repeated.
    query [B, H, Q, D], key/value [B, H_kv, L, D], mask [B, 1, Q, L] (additive) or None;
    returns [B, Q, H, D]."""
    b, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    q = query.view(b, kv_heads, heads // kv_heads, q_len, dim)                               # [B, H_kv, G, Q, D]
    scale = dim ** -0.5 if scaling is None else scaling
    scores = torch.matmul(q, key.unsqueeze(2).transpose(-1, -2)) * scale                     # [B, H_kv, G, Q, L]
    scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, None, :, : key.shape[2]]                      # [B, 1, 1, Q, L]
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.matmul(probs, value.unsqueeze(2))                                            # [B, H_kv, G, Q, D]
    return out.reshape(b, heads, q_len, dim).transpose(1, 2).contiguous()

# ----------------------------------------------------------------------------- layers and masks
# Attention layer kinds the engine serves: full causal attention and sliding-window attention (a
# key at most window - 1 positions back, as transformers' masking_utils.sliding_window_overlay:
# kv_idx > q_idx - window). Everything else (chunked attention, linear attention, shared KV...)
# decodes with Hugging Face generate.
LAYER_KINDS = ("full_attention", "sliding_attention")


@dataclass(frozen=True)
class LayerPlan:
    kinds: tuple[str, ...]      # per decoder layer: one of LAYER_KINDS
    window: int | None          # the sliding layers' window (None: no sliding layer)

    @property
    def mixed(self) -> bool:
        """Both kinds: the model is given a dict of masks keyed by kind (transformers picks each
        layer's by config.layer_types); one kind: one mask tensor."""
        return len(set(self.kinds)) > 1


def layer_plan(model) -> LayerPlan:
    """The model's decoder layers as the engine serves them; ValueError naming what it cannot serve."""
    cfg = model.config
    if getattr(cfg, "is_encoder_decoder", False):
        raise ValueError(f"{cfg.model_type} is an encoder-decoder model")
    text = cfg.get_text_config(decoder=True)
    if text is not cfg:
        raise ValueError(f"{cfg.model_type} is a composite (multimodal) model")
    if getattr(text, "attention_chunk_size", None):
        raise ValueError(f"{cfg.model_type} uses chunked attention")
    if any(isinstance(getattr(m, "sinks", None), torch.Tensor) for m in model.modules()):
        raise ValueError(f"{cfg.model_type} uses attention sinks")
    try:
        kinds, kwargs = get_layer_types_and_kwargs(text)
    except Exception as exc:   # noqa: BLE001 - an unusual config: say so and fall back
        raise ValueError(f"{cfg.model_type}: cannot read its layer types ({describe(exc)})") from None
    kinds = tuple(kinds)
    if (other := sorted(set(kinds) - set(LAYER_KINDS))):
        raise ValueError(f"{cfg.model_type} has {', '.join(other)} layers")
    # transformers up to ~5.17 gives one kwargs dict for every layer; later versions one per layer.
    per_layer = [kwargs] * len(kinds) if isinstance(kwargs, dict) else list(kwargs)
    try:
        windows = {int(kw["sliding_window"]) for k, kw in zip(kinds, per_layer) if k == "sliding_attention"}
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{cfg.model_type}: cannot read its sliding window ({describe(exc)})") from None
    if len(windows) > 1:
        raise ValueError(f"{cfg.model_type} has sliding layers of different windows {sorted(windows)}")
    return LayerPlan(kinds, windows.pop() if windows else None)



def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where allowed, dtype's minimum elsewhere, in the model dtype: eager attention needs an
    additive mask, and SDPA would otherwise convert a boolean one in every layer of every step."""
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)


def layer_masks(plan: LayerPlan, dtype: torch.dtype, allowed: torch.Tensor, distance: torch.Tensor):
    """The attention mask(s) the model is given: `allowed` [B, 1, Q, L] (causal, real keys) for
    full-attention layers; for sliding layers also `distance` (query position - key position,
    broadcastable to allowed) < window, as transformers' sliding_window_overlay (a query sees
    itself and the window - 1 keys before it). One kind of layer: one tensor; both: a dict by
    layer kind, from which transformers gives each layer its own (config.layer_types)."""
    if plan.window is None:
        return additive_mask(allowed, dtype)
    sliding = additive_mask(allowed & (distance < plan.window), dtype)
    if not plan.mixed:
        return sliding
    return {"full_attention": additive_mask(allowed, dtype), "sliding_attention": sliding}
