"""The decoder over a batch's real tokens only (padding-free, TRL's `padding_free`): right-padded
rows [B, L] become one packed row [1, T] of their T real tokens, each keeping its position in its
own sequence, so the linear layers, norms and MLPs never compute a padding slot.

Attention alone needs the rows apart: `packed_attention` spreads each layer's queries, keys and
values back into [B, h, L, D] (zeros at the padding) and runs causal SDPA with no mask. A row's
real tokens are a prefix of it, so under the causal rule no real query reaches a padding key, and
without a mask SDPA may take its flash kernel (with a padding mask it takes the memory-efficient
one). The padding queries' outputs are computed there and then dropped.

The equality with the padded pass holds for decoders whose only use of the mask is causal
attention over positions 0.. of each row: `packable` names the model types that are, and says why
any other is not.
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

PACKED = "grpo_packed"
# Decoders whose layers read the mask only in causal full attention (sliding windows are refused
# by packable): Llama (SmolLM2), Qwen2 (Qwen2.5), Qwen3, Mistral.
PACKABLE_TYPES = ("llama", "qwen2", "qwen3", "mistral")


@dataclass(frozen=True)
class Layout:
    """Where the packed row's tokens sit in the padded rows: slot b * width + t of each."""

    rows: int               # B
    width: int              # L
    real: torch.Tensor      # [T] int64: the padded slot of each packed token, ascending


# Hugging Face's layers call the attention function with no word of the padded rows: packed_decoder
# sets the layout here for the length of its pass, in its own thread's context.
_LAYOUT: contextvars.ContextVar[Layout | None] = contextvars.ContextVar("grpo_packed_layout", default=None)


def packable(model) -> str | None:
    """None when `model`'s decoder can run packed with the padded pass's results, else why not."""
    cfg = getattr(model, "config", None)
    kind = getattr(cfg, "model_type", None)
    if kind not in PACKABLE_TYPES:
        return f"model type {kind!r} is not one of {', '.join(PACKABLE_TYPES)}"
    types = getattr(cfg, "layer_types", None)
    if types and any(t != "full_attention" for t in types):
        return "it has sliding-window layers"
    if not types and getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        return "it attends through a sliding window"
    return None


def register_packed() -> None:
    """Make PACKED a name the models' attention and mask lookups know (idempotent). Its mask is
    None: packed_attention needs none, and Hugging Face would otherwise build a [T, T] one."""
    AttentionInterface.register(PACKED, packed_attention)
    AttentionMaskInterface.register(PACKED, lambda *args, **kwargs: None)


@contextlib.contextmanager
def _packed_on(config, layout: Layout):
    """The layers dispatch to packed_attention, with `layout`, for the passes inside (restored after)."""
    register_packed()
    before = config._attn_implementation
    token = _LAYOUT.set(layout)
    config._attn_implementation = PACKED
    try:
        yield
    finally:
        config._attn_implementation = before
        _LAYOUT.reset(token)


def packed_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                     **kwargs):
    """Causal attention of each packed sequence within itself: query [1, H, T, D], key and value
    [1, H_kv, T, D] -> [1, T, H, D], as Hugging Face's attention functions return it."""
    lay = _LAYOUT.get()
    if lay is None:
        raise RuntimeError("packed_attention outside packed_decoder: no layout of the packed rows")
    heads, kv_heads, dim = query.shape[1], key.shape[1], query.shape[3]

    def spread(x: torch.Tensor) -> torch.Tensor:          # [1, h, T, D] -> [B, h, L, D], zeros at padding
        flat = x[0].transpose(0, 1)                                                   # [T, h, D]
        full = flat.new_zeros((lay.rows * lay.width, x.shape[1], dim)).index_copy(0, lay.real, flat)
        return full.view(lay.rows, lay.width, x.shape[1], dim).transpose(1, 2)       # [B, h, L, D]

    out = torch.nn.functional.scaled_dot_product_attention(
        spread(query), spread(key), spread(value), is_causal=True, scale=scaling,
        dropout_p=dropout if module.training else 0.0, enable_gqa=heads != kv_heads)   # [B, H, L, D]
    out = out.transpose(1, 2).reshape(lay.rows * lay.width, heads, dim).index_select(0, lay.real)  # [T, H, D]
    return out.unsqueeze(0), None                                                     # [1, T, H, D]


def packed_decoder(decoder, input_ids: torch.Tensor, attention_mask: torch.Tensor):
    """The decoder's last hidden states for the real tokens of right-padded rows: ([T, D], slot [B * L]
    -> that slot's row of the first, -1 at padding). Each token keeps its position in its row.
    Raises ValueError where a row's real tokens are not a prefix of it (left padding)."""
    B, L = input_ids.shape
    mask = attention_mask.bool()
    prefix = (mask.cummin(dim=1).values == mask).all()                                # right padding only
    real = mask.reshape(-1).nonzero().squeeze(1)                                      # [T] (one host sync)
    if not bool(prefix):
        raise ValueError("packed_decoder needs right-padded rows: a row's real tokens must come first")
    T = real.numel()
    ids = input_ids.reshape(-1).index_select(0, real).unsqueeze(0)                   # [1, T]
    positions = (real % L).unsqueeze(0)                                               # [1, T]
    slot = torch.full((B * L,), -1, dtype=torch.long, device=input_ids.device)
    slot[real] = torch.arange(T, device=input_ids.device)                             # [B * L]
    with _packed_on(decoder.config, Layout(B, L, real)):
        hidden = decoder(input_ids=ids, position_ids=positions, use_cache=False).last_hidden_state  # [1, T, D]
    return hidden[0], slot
