"""Per-token log-probs without full-vocabulary logits for the whole batch.

A teacher-forced pass over B sequences of length L would hold [B, L, V] logits (and a
float32 copy): for 16 x 512 tokens of Qwen2.5's 151,936-row vocabulary that is 5 GB in
float32, more than the model. Here the decoder runs once for the last hidden states
[B, L, D]; the LM head and the log-softmax then run over chunks of rows, so at most
`chunk_rows x V` logits exist at a time. Each chunk is checkpointed when gradients are
needed: backward recomputes that chunk's logits instead of keeping them, so memory does
not grow with B x L x V in training either (the same idea as a fused linear
cross-entropy, on plain PyTorch ops so it runs under DeepSpeed, autocast and on CPU).

Only positions whose target token is real (attention mask 1) are computed; padded
positions come back as 0.
"""
from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

# Logit elements per chunk: 2**27 is 512 MiB in float32 (~2,700 rows of a 49k vocabulary,
# ~880 rows of a 152k one); large enough that the LM-head matmul stays efficient.
DEFAULT_CHUNK_ELEMS = 1 << 27


def _chunk_logprobs(hidden: torch.Tensor, targets: torch.Tensor, head: torch.nn.Module,
                    temperature: float) -> torch.Tensor:
    """log softmax(head(hidden) / T)[target] for one chunk of rows: [n]."""
    logits = head(hidden).float() / temperature                            # [n, V]
    picked = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1)   # [n]
    return picked - torch.logsumexp(logits, dim=-1)                        # [n]


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
                           temperature: float, chunk_elems: int = DEFAULT_CHUNK_ELEMS) -> torch.Tensor:
    """log p(input_ids[:, t+1] | input_ids[:, :t+1]): [B, L-1] float32 (0 where the target is padding).

    Equal to the full-logits computation (same ops, row by row), gradients included.
    """
    B, L = input_ids.shape
    parts = _split_model(model)
    if parts is None:  # an unusual head: the full computation, still correct
        logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
        logits = logits[:, :-1, :].float() / temperature                   # [B, L-1, V]
        picked = torch.gather(logits, -1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        return (picked - torch.logsumexp(logits, dim=-1)) * attention_mask[:, 1:].to(picked.dtype)
    decoder, head = parts
    hidden = decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    valid = attention_mask[:, 1:].bool()                                   # [B, L-1]
    rows = hidden[:, :-1][valid]                                           # [N, D] predicting positions
    targets = input_ids[:, 1:][valid]                                      # [N]
    step = max(1, chunk_elems // head.out_features)
    grad = torch.is_grad_enabled() and rows.requires_grad
    pieces = []
    for s in range(0, rows.shape[0], step):
        h, t = rows[s:s + step], targets[s:s + step]
        if grad:
            pieces.append(checkpoint(_chunk_logprobs, h, t, head, temperature, use_reentrant=False))
        else:
            pieces.append(_chunk_logprobs(h, t, head, temperature))
    flat = torch.cat(pieces) if pieces else rows.new_zeros((0,), dtype=torch.float32)
    out = torch.zeros((B, L - 1), dtype=torch.float32, device=input_ids.device)
    return out.masked_scatter(valid, flat)                                 # [B, L-1]
