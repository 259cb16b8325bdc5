"""Token log-probs from a causal LM, and the padded layouts that they and generation read.

token_logprobs is the one function that turns a model's logits into per-token log-probs: the
sampler's old and reference passes and the learner's current pass all call it, so the ratio compares
like with like. right_pad builds the layout it reads; left_pad the one generation reads, each
row's next token in the same column.
"""
from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   temperature: float, with_entropy: bool = False, first: torch.Tensor | None = None,
                   share_prompts: bool = False):
    """log p(input_ids[:, t+1] | input_ids[:, :t+1]) for every position: [B, L-1], float32.

    Sampler (old and reference log-probs) and learner (current log-probs) both use this, so
    the ratio compares like with like: same right-padded layout, same temperature scaling.
    The LM head and log-softmax run in chunks of rows (chunked_token_logprobs below), so full-vocabulary
    logits never exist for the whole batch; positions whose target is padding are 0.
    with_entropy: also each position's entropy [B, L-1] (the learner's --entropy-coef).
    first: [B], each row's first position wanted (prompt length - 1 for a caller that reads only
    the completion); earlier positions come back 0 and are not computed (the LM head over a long
    prompt is most of the cost of a short completion's pass).
    share_prompts (with first): rows whose prompts (their ids up to first) are the same, a group's,
    run that prompt through the model once (shared_prompt_logprobs); the same values.
    """
    if share_prompts and first is not None and (parts := _split_model(model)) is not None and _full_attention(model):
        return shared_prompt_logprobs(parts, input_ids, attention_mask, temperature, first, with_entropy=with_entropy)
    return chunked_token_logprobs(model, input_ids, attention_mask, temperature, with_entropy=with_entropy,
                                  first=first)


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


def _chunk_logprobs(hidden: torch.Tensor, targets: torch.Tensor, head: torch.nn.Module,
                    temperature: float) -> torch.Tensor:
    """log softmax(head(hidden) / T)[target] for one chunk of rows: [n]."""
    logits = head(hidden).float() / temperature                            # [n, V]
    picked = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1)   # [n]
    return picked - torch.logsumexp(logits, dim=-1)                        # [n]


def _chunk_logprobs_entropy(hidden: torch.Tensor, targets: torch.Tensor, head: torch.nn.Module,
                            temperature: float) -> torch.Tensor:
    """[n, 2]: the target's log-prob and the entropy of the whole distribution, -sum_v p_v log p_v
    = logsumexp(z) - sum_v p_v z_v with z = head(hidden) / T, for one chunk of rows."""
    z = head(hidden).float() / temperature                                 # [n, V]
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
                           with_entropy: bool = False, first: torch.Tensor | None = None):
    """log p(input_ids[:, t+1] | input_ids[:, :t+1]): [B, L-1] float32 (0 where the target is padding,
    and before position first[b] of row b when first [B] is given).
    with_entropy: (that, the entropy of each position's distribution [B, L-1]), for --entropy-coef.

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
        logits = logits[:, :-1, :].float() / temperature                   # [B, L-1, V]
        keep = valid.to(logits.dtype)                                      # [B, L-1]
        lse = torch.logsumexp(logits, dim=-1)                              # [B, L-1]
        picked = (torch.gather(logits, -1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1) - lse) * keep
        if not with_entropy:
            return picked
        return picked, (lse - (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)) * keep
    decoder, head = parts
    hidden = decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    # The predicting positions by flat index, not by a boolean mask: a mask's backward is an
    # accumulating index_put (it sorts every index on CUDA: 0.35 s of a 2.1 s 0.5B learner step in
    # bench/results/step_profile_NVIDIA_H200.json), index_select's is an index_add. Positions are
    # b * L + t in the [B, L] layout, so `hidden` is read as the view [B * L, D] with no copy.
    at = torch.zeros((B, L), dtype=torch.bool, device=input_ids.device)
    at[:, :-1] = valid
    idx = at.reshape(-1).nonzero().squeeze(1)                              # [N] (one host sync)
    rows = hidden.reshape(B * L, -1).index_select(0, idx)                  # [N, D]
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


# ----------------------------------------------------------------------------- shared prompts
# A learner step's sequences come in groups: G completions of one prompt, each row of a micro-batch
# its prompt and its completion. Run whole, every row takes its prompt through the model again: on
# GSM8K with Qwen2.5 the prompts were 27% of the tokens a step put through the model. Here each
# distinct prompt of the micro-batch runs once (its keys and values kept, with their graph), and
# the completions run after it with those keys and values as their past: the same attention over
# the same tokens, so the same log-probs, and backward sums each row's gradient into its prompt's
# pass. Full attention only (a sliding-window cache keeps a window, not the prompt).


def _full_attention(model) -> bool:
    """Whether every layer attends to the whole past (no sliding window), so a prompt's keys and
    values can be another pass's past."""
    cfg = getattr(model, "config", None)
    types = getattr(cfg, "layer_types", None)
    if types:   # transformers' own per-layer word for it (Qwen2's False use_sliding_window included)
        return all(t == "full_attention" for t in types)
    return getattr(cfg, "sliding_window", None) is None   # (Mistral, Phi-3: a window for every layer)


def shared_prompt_logprobs(parts, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float,
                           first: torch.Tensor, with_entropy: bool = False,
                           chunk_elems: int = DEFAULT_CHUNK_ELEMS):
    """chunked_token_logprobs' result ([B, L-1], and the entropy with with_entropy) for rows laid out
    as the learner's micro-batches are: right-padded, row b's prompt ids[b, :first[b] + 1] and its
    completion after it, up to its attention mask's length. parts: (decoder, lm_head).

    The distinct prompts run once ([U, P] right-padded, keys and values kept); the completions
    ([B, T] right-padded, positions first[b] + 1 on) run with their prompt's keys and values as the
    past, the prompt's padding masked out of it. Position first[b] (the prompt's last) predicts the
    completion's first token from the prompt pass; the completion's positions predict the rest."""
    from transformers import DynamicCache   # here: only this path builds a cache by hand

    decoder, head = parts
    B, L = input_ids.shape
    device = input_ids.device
    plen = first.to(device).long() + 1                                     # [B] prompt lengths
    tlen = attention_mask.sum(dim=1) - plen                                # [B] completion lengths
    host, host_plen = input_ids.tolist(), plen.tolist()                    # (one sync)
    prompt_of: dict[tuple[int, ...], int] = {}
    which = [prompt_of.setdefault(tuple(host[b][:host_plen[b]]), len(prompt_of)) for b in range(B)]
    P, T = max(host_plen), max(int(tlen.max()), 1)
    p_ids = torch.zeros((len(prompt_of), P), dtype=torch.long)             # [U, P], right-padded
    p_mask = torch.zeros((len(prompt_of), P), dtype=torch.long)
    for prompt, u in prompt_of.items():
        p_ids[u, :len(prompt)] = torch.tensor(prompt)
        p_mask[u, :len(prompt)] = 1
    out_p = decoder(input_ids=p_ids.to(device), attention_mask=p_mask.to(device), use_cache=True)
    p_hidden = out_p.last_hidden_state                                     # [U, P, D]
    sel = torch.tensor(which, device=device)                               # [B]: each row's prompt
    past = DynamicCache(ddp_cache_data=[(layer.keys.index_select(0, sel), layer.values.index_select(0, sel))
                                        for layer in out_p.past_key_values.layers])   # [B, H, P, Dh] each
    ar = torch.arange(T, device=device)
    in_c = ar[None, :] < tlen[:, None]                                     # [B, T]: a completion token
    src = (plen[:, None] + ar[None, :]).clamp(max=L - 1)                   # [B, T]: where it sits in the row
    c_ids = torch.where(in_c, input_ids.gather(1, src), 0)                 # [B, T]
    mask = torch.cat([p_mask.to(device).index_select(0, sel), in_c.long()], dim=1)   # [B, P + T]
    c_hidden = decoder(input_ids=c_ids, attention_mask=mask, position_ids=src, past_key_values=past,
                       use_cache=True).last_hidden_state                   # [B, T, D]
    # What predicts each completion token, by flat index as in chunked_token_logprobs: token 0 of
    # row b from its prompt's last position, token t + 1 from the completion's position t.
    has = (tlen > 0).nonzero().squeeze(1)                                  # [N0] rows with a completion
    own = (ar[None, :] < (tlen - 1)[:, None]).reshape(-1).nonzero().squeeze(1)   # [N1] = b * T + t
    D = p_hidden.shape[-1]
    hidden = torch.cat([p_hidden.reshape(-1, D).index_select(0, sel.index_select(0, has) * P
                                                             + plen.index_select(0, has) - 1),
                        c_hidden.reshape(-1, D).index_select(0, own)])    # [N, D]
    targets = torch.cat([c_ids[:, 0].index_select(0, has), c_ids.reshape(-1).index_select(0, own + 1)])   # [N]
    b_own, t_own = own // T, own % T
    into = torch.cat([has * (L - 1) + plen.index_select(0, has) - 1,
                      b_own * (L - 1) + plen.index_select(0, b_own) + t_own])   # [N]: b * (L-1) + position
    step = max(1, chunk_elems // head.out_features)
    grad = torch.is_grad_enabled() and hidden.requires_grad
    fn = _chunk_logprobs_entropy if with_entropy else _chunk_logprobs
    pieces = []
    for s0 in range(0, hidden.shape[0], step):
        h, t = hidden[s0:s0 + step], targets[s0:s0 + step]
        pieces.append(checkpoint(fn, h, t, head, temperature, use_reentrant=False) if grad
                      else fn(h, t, head, temperature))
    width = (2,) if with_entropy else ()
    flat = torch.cat(pieces) if pieces else hidden.new_zeros((0, *width), dtype=torch.float32)
    if not with_entropy:
        out = torch.zeros((B * (L - 1),), dtype=torch.float32, device=device)
        return out.index_copy(0, into, flat).view(B, L - 1)                # [B, L-1]
    out = torch.zeros((B * (L - 1), 2), dtype=torch.float32, device=device)
    out = out.index_copy(0, into, flat).view(B, L - 1, 2)                  # [B, L-1, 2]
    return out[..., 0], out[..., 1]
