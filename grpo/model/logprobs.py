"""Token log-probs from a causal LM, and the padded layouts that they and generation read.

token_logprobs is the one function that turns a model's logits into per-token log-probs: the
sampler's old and reference passes and the learner's current pass all call it, so the ratio compares
like with like. right_pad builds the layout it reads; left_pad the one generation reads, each
row's next token in the same column.
"""
from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from grpo.model.fused_logprobs import token_logprob as fused_token_logprob
from grpo.model.packed import packable, packed_decoder


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   temperature: float, with_entropy: bool = False, first: torch.Tensor | None = None,
                   padding_free: bool = True):
    """log p(input_ids[:, t+1] | input_ids[:, :t+1]) for every position: [B, L-1], float32.

    Sampler (old and reference log-probs) and learner (current log-probs) both use this, so
    the ratio compares like with like: same right-padded layout, same temperature scaling.
    The LM head and log-softmax run in chunks of rows (chunked_token_logprobs below), so full-vocabulary
    logits never exist for the whole batch; positions whose target is padding are 0.
    with_entropy: also each position's entropy [B, L-1] (the learner's --entropy-coef).
    first: [B], each row's first position wanted (prompt length - 1 for a caller that reads only
    the completion); earlier positions come back 0 and are not computed (the LM head over a long
    prompt is most of the cost of a short completion's pass).
    padding_free: the decoder computes no padding slot (grpo.model.packed), where the model's type
    allows (the same values within float tolerance); False: the right-padded rows as they are.
    """
    return chunked_token_logprobs(model, input_ids, attention_mask, temperature, with_entropy=with_entropy,
                                  first=first, padding_free=padding_free)


def right_pad(sequences: list[list[int]] | list[torch.Tensor], pad_id: int,
              device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, L] ids and attention mask from variable-length sequences (padding on the right)."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, seq in enumerate(sequences):
        ids[i, :len(seq)] = torch.as_tensor(seq, dtype=torch.long)
        mask[i, :len(seq)] = 1
    return ids.to(device), mask.to(device)


def left_pad(sequences: list[list[int]], pad_id: int, device: torch.device, width: int | None = None,
             rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """[rows, width] ids and attention mask, sequences right-aligned (padding on the left), so
    every row's next token goes in the same column, as generation needs. width and rows
    default to the longest sequence and the number of sequences; extra rows are all padding."""
    width = width or max(len(s) for s in sequences)
    ids = torch.full((rows or len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, seq in enumerate(sequences):
        ids[i, width - len(seq):] = torch.as_tensor(seq, dtype=torch.long)
        mask[i, width - len(seq):] = 1
    return ids.to(device), mask.to(device)


# ----------------------------------------------------------------------------- chunked log-probs
# Per-token log-probs without full-vocabulary logits for the whole batch.
#
# A teacher-forced pass over B sequences of length L would hold [B, L, V] logits (and a
# float32 copy): for 16 x 512 tokens of Qwen2.5's 151,936-row vocabulary that is 5 GB in
# float32, more than the model. Here the decoder runs once for the last hidden states
# [B, L, D]; the LM head and the log-softmax then run over chunks of rows, so at most
# `chunk_rows x V` logits exist at a time. Each chunk is checkpointed when gradients are
# needed: backward recomputes that chunk's logits instead of keeping them, so memory does
# not grow with B x L x V in training either (the same idea as a fused linear
# cross-entropy, on plain PyTorch ops so it runs under DeepSpeed, autocast and on CPU).
#
# Only positions whose target token is real (attention mask 1) are computed; padded
# positions come back as 0.

# Logit elements per chunk: 2**27 is 512 MiB in float32 (~2,700 rows of a 49k vocabulary,
# ~880 rows of a 152k one); large enough that the LM-head matmul stays efficient.
DEFAULT_CHUNK_ELEMS = 1 << 27


_fused_head = False   # each chunk through grpo.model.fused_logprobs (use_fused_head, at a process's start)


def use_fused_head(on: bool) -> None:
    """This process's log-prob passes take the fused kernels (on) or torch's ops; start_runtime's
    choice, after their check on the device."""
    global _fused_head
    _fused_head = bool(on)


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / T in float32; at T = 1 the cast alone: a division by 1 changes no value, and would be a
    pass over [n, V] float32 in the forward, again in the checkpoint's recompute and in the backward."""
    logits = logits.float()
    return logits if temperature == 1.0 else logits / temperature


def _chunk_logprobs(hidden: torch.Tensor, targets: torch.Tensor, head: torch.nn.Module,
                    temperature: float) -> torch.Tensor:
    """log softmax(head(hidden) / T)[target] for one chunk of rows: [n]."""
    if _fused_head:
        return fused_token_logprob(head(hidden), targets, temperature)    # [n]: one pass each way, no float32 copy
    logits = _scaled(head(hidden), temperature)                            # [n, V]
    picked = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1)   # [n]
    return picked - torch.logsumexp(logits, dim=-1)                        # [n]


def _chunk_logprobs_entropy(hidden: torch.Tensor, targets: torch.Tensor, head: torch.nn.Module,
                            temperature: float) -> torch.Tensor:
    """[n, 2]: the target's log-prob and the entropy of the whole distribution, -sum_v p_v log p_v
    = logsumexp(z) - sum_v p_v z_v with z = head(hidden) / T, for one chunk of rows."""
    z = _scaled(head(hidden), temperature)                                 # [n, V]
    lse = torch.logsumexp(z, dim=-1)                                       # [n]
    picked = torch.gather(z, -1, targets.unsqueeze(-1)).squeeze(-1) - lse  # [n]
    entropy = lse - (torch.softmax(z, dim=-1) * z).sum(dim=-1)             # [n]
    return torch.stack([picked, entropy], dim=-1)                          # [n, 2]


def _split_model(model):
    """(decoder, lm_head) when the logits are exactly lm_head(decoder(...)), else None."""
    cfg = getattr(model, "config", None)
    # Models that post-process logits (soft-capping, scaling) need their own forward.
    if cfg is None or getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logit_scale", None):
        return None
    try:
        decoder, head = model.get_decoder(), model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    if decoder is None or not isinstance(head, torch.nn.Linear):
        return None
    return decoder, head


def chunked_token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                           temperature: float, chunk_elems: int = DEFAULT_CHUNK_ELEMS,
                           with_entropy: bool = False, first: torch.Tensor | None = None,
                           padding_free: bool = True):
    """log p(input_ids[:, t+1] | input_ids[:, :t+1]): [B, L-1] float32 (0 where the target is padding,
    and before position first[b] of row b when first [B] is given).
    with_entropy: (that, the entropy of each position's distribution [B, L-1]), for --entropy-coef.
    padding_free: the decoder runs over the real tokens only (grpo.model.packed) where the model
    allows it (packable); the rows must then be right-padded.

    Equal to the full-logits computation (same ops, row by row), gradients included.
    """
    B, L = input_ids.shape
    valid = attention_mask[:, 1:].bool()                                   # [B, L-1]
    if first is not None:
        positions = torch.arange(L - 1, device=input_ids.device)
        valid = valid & (positions[None, :] >= first.to(input_ids.device)[:, None])
    parts = _split_model(model)
    if parts is None:  # an unusual head: the full computation, still correct
        logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
        logits = _scaled(logits[:, :-1, :], temperature)                   # [B, L-1, V]
        keep = valid.to(logits.dtype)                                      # [B, L-1]
        lse = torch.logsumexp(logits, dim=-1)                              # [B, L-1]
        picked = (torch.gather(logits, -1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1) - lse) * keep
        if not with_entropy:
            return picked
        return picked, (lse - (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)) * keep
    decoder, head = parts
    # The predicting positions by flat index, not by a boolean mask: a mask's backward is an
    # accumulating index_put (it sorts every index on CUDA: 0.35 s of a 2.1 s 0.5B learner step in
    # bench/results/step_profile_NVIDIA_H200.json), index_select's is an index_add. Positions are
    # b * L + t in the [B, L] layout.
    at = torch.zeros((B, L), dtype=torch.bool, device=input_ids.device)
    at[:, :-1] = valid
    idx = at.reshape(-1).nonzero().squeeze(1)                              # [N] (one host sync)
    if padding_free and packable(model) is None:
        hidden, slot = packed_decoder(decoder, input_ids, attention_mask)  # [T, D], [B * L]
        rows = hidden.index_select(0, slot.index_select(0, idx))           # [N, D]
    else:   # `hidden` read as the view [B * L, D], no copy
        hidden = decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        rows = hidden.reshape(B * L, -1).index_select(0, idx)              # [N, D]
    targets = input_ids.reshape(-1).index_select(0, idx + 1)               # [N]: position t predicts t+1
    step = max(1, chunk_elems // head.out_features)
    grad = torch.is_grad_enabled() and rows.requires_grad
    fn = _chunk_logprobs_entropy if with_entropy else _chunk_logprobs
    pieces = []
    for s in range(0, rows.shape[0], step):
        h, t = rows[s:s + step], targets[s:s + step]
        if grad:
            pieces.append(checkpoint(fn, h, t, head, temperature, use_reentrant=False))
        else:
            pieces.append(fn(h, t, head, temperature))
    width = (2,) if with_entropy else ()
    flat = torch.cat(pieces) if pieces else rows.new_zeros((0, *width), dtype=torch.float32)
    # back into place by flat index as well (index_copy's backward is an index_select)
    into = idx - idx // L                                                  # [N]: b * (L-1) + t
    if not with_entropy:
        out = torch.zeros((B * (L - 1),), dtype=torch.float32, device=input_ids.device)
        return out.index_copy(0, into, flat).view(B, L - 1)                # [B, L-1]
    out = torch.zeros((B * (L - 1), 2), dtype=torch.float32, device=input_ids.device)
    out = out.index_copy(0, into, flat).view(B, L - 1, 2)                  # [B, L-1, 2]
    return out[..., 0], out[..., 1]
