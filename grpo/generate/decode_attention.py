"""A decode step's attention as a Triton kernel: one query token per row against the row's cache,
the query heads that share a KV head read that head's keys and values once (GQA), with the engine's
additive mask, and the same result as SDPA's within float tolerance (softmax(q k^T * scale + mask) v,
accumulated in float32).

SDPA takes this as its memory-efficient kernel (a mask rules out flash), which tiles 64 query rows
where a decode step has the G query heads of one KV head (Qwen2.5: 6 or 7), so the step that should
run at the memory's speed does not (docs/benchmarks.md has the figures). Here one program takes one
(row, KV head) and a span of slots, holds
the G query rows in registers, and walks its keys and values in blocks of BLOCK_N with an online
softmax (flash attention's running max and sum); where rows x KV heads are too few to fill the GPU,
the slots are split across programs and a second kernel combines the parts (flash-decoding).

Triton is a dependency of torch's CUDA builds; on a CPU machine the kernels run under Triton's
interpreter (TRITON_INTERPRET=1), which is how the CPU tests check them against SDPA.
"""
from __future__ import annotations

import functools

import torch

from grpo.model.triton_run import failure, runs_here

BLOCK_N = 64      # cache slots a program reads at once
MIN_DOT = 16      # tl.dot's smallest side: the G query rows are padded up to it


available = runs_here   # whether the kernel can run on a device (CUDA, or the interpreter)


def splits(programs: int, blocks: int, sms: int) -> int:
    """Programs each (row, KV head) is cut into: enough that rows x KV heads x splits fill the
    device's `sms` multiprocessors about four times over, never more than its `blocks` of BLOCK_N
    slots (a split must have slots to read), at least 1. programs: rows x KV heads."""
    want = -(-4 * sms // max(1, programs))          # ceil(4 * sms / programs)
    return max(1, min(want, blocks, 64))


def _pow2(n: int, least: int) -> int:
    return max(least, 1 << (max(1, n) - 1).bit_length())


@functools.cache
def _compile():
    """The kernels, defined on first use: importing triton costs a second, and CPU runs need none."""
    import triton
    import triton.language as tl

    @triton.jit
    def attend_part(q_ptr, k_ptr, v_ptr, mask_ptr, out_ptr, m_ptr, l_ptr,
                    sq_b, sq_h, sq_g, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, sm_b, sm_n, so_b, so_h, so_g,
                    n, span, scale,
                    G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                    BLOCK_N: tl.constexpr, NB: tl.constexpr, HAS_MASK: tl.constexpr, SPLIT: tl.constexpr,
                    PREC: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1).to(tl.int64)
        s = tl.program_id(2)
        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, BLOCK_D)
        gd = (g[:, None] < G) & (d[None, :] < D)
        q = tl.load(q_ptr + b * sq_b + h * sq_h + g[:, None] * sq_g + d[None, :], mask=gd, other=0.0)  # [BG, BD]
        m = tl.full([BLOCK_G], -float("inf"), tl.float32)   # running max of the scores
        acc_l = tl.zeros([BLOCK_G], tl.float32)              # running sum of exp(score - m)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)       # running sum of exp(score - m) * v
        start = s * span
        end = tl.minimum(start + span, n)
        k_row = k_ptr + b * sk_b + h * sk_h
        v_row = v_ptr + b * sv_b + h * sv_h
        for j in range(NB):   # a span's blocks (a constant: Triton's interpreter loops over no runtime value)
            cols = start + j * BLOCK_N + tl.arange(0, BLOCK_N)
            inside = cols < end
            kd = inside[:, None] & (d[None, :] < D)
            k = tl.load(k_row + cols[:, None] * sk_n + d[None, :], mask=kd, other=0.0)             # [BN, BD]
            score = tl.dot(q, tl.trans(k), input_precision=PREC) * scale                # [BG, BN] f32
            if HAS_MASK:
                score += tl.load(mask_ptr + b * sm_b + cols * sm_n, mask=inside, other=0.0).to(tl.float32)[None, :]
            score = tl.where(inside[None, :], score, -float("inf"))
            new_m = tl.maximum(m, tl.max(score, 1))
            alpha = tl.exp(m - new_m)
            p = tl.exp(score - new_m[:, None])
            acc_l = acc_l * alpha + tl.sum(p, 1)
            v = tl.load(v_row + cols[:, None] * sv_n + d[None, :], mask=kd, other=0.0)             # [BN, BD]
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
            m = new_m
        if SPLIT:   # this span's part, combined by `combine`: [B, H_kv, S, BG(, BD)] float32
            part = (b * tl.num_programs(1) + h) * tl.num_programs(2) + s
            tl.store(m_ptr + part * BLOCK_G + g, m)
            tl.store(l_ptr + part * BLOCK_G + g, acc_l)
            tl.store(out_ptr + (part * BLOCK_G + g[:, None]) * BLOCK_D + d[None, :], acc)
        else:
            out = acc / acc_l[:, None]
            tl.store(out_ptr + b * so_b + h * so_h + g[:, None] * so_g + d[None, :],
                     out.to(out_ptr.dtype.element_ty), mask=gd)

    @triton.jit
    def combine(m_ptr, l_ptr, part_ptr, out_ptr, so_b, so_h, so_g,
                S: tl.constexpr, G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1).to(tl.int64)
        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, BLOCK_D)
        first = (b * tl.num_programs(1) + h) * S
        top = tl.full([BLOCK_G], -float("inf"), tl.float32)
        for s in tl.static_range(S):
            top = tl.maximum(top, tl.load(m_ptr + (first + s) * BLOCK_G + g))
        total = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        for s in tl.static_range(S):
            m_s = tl.load(m_ptr + (first + s) * BLOCK_G + g)
            w = tl.where(m_s == -float("inf"), 0.0, tl.exp(m_s - top))   # a span with no slots weighs 0
            total += w * tl.load(l_ptr + (first + s) * BLOCK_G + g)
            acc += w[:, None] * tl.load(part_ptr + ((first + s) * BLOCK_G + g[:, None]) * BLOCK_D + d[None, :])
        out = acc / total[:, None]
        tl.store(out_ptr + b * so_b + h * so_h + g[:, None] * so_g + d[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=(g[:, None] < G) & (d[None, :] < D))

    return (attend_part, combine)


def _sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def decode_attention(q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                     scale: float) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v for one query token a row: q [B, H_kv, G, D] (the G query heads
    of each KV head), key and value [B, H_kv, n, D] (any strides, the last dimension contiguous), mask
    additive, broadcastable as [B, 1, 1, n] (or None). Returns [B, H_kv, G, D] in q's dtype,
    contiguous. No host sync and shapes fixed by the inputs': capturable in a CUDA graph."""
    B, kv_heads, G, D = q.shape
    n = key.shape[2]
    if q.stride(-1) != 1:
        q = q.contiguous()
    if key.stride(-1) != 1 or value.stride(-1) != 1:
        key, value = key.contiguous(), value.contiguous()
    out = torch.empty((B, kv_heads, G, D), dtype=q.dtype, device=q.device)
    if B == 0 or n == 0:
        return out.zero_()
    if mask is not None:
        mask = mask.reshape(mask.shape[0], -1)                        # [B or 1, n]
        sm_b, sm_n = (mask.stride(0) if mask.shape[0] > 1 else 0), mask.stride(1)
    else:
        mask, sm_b, sm_n = q, 0, 0                                    # not read (HAS_MASK False)
    BG, BD = _pow2(G, MIN_DOT), _pow2(D, MIN_DOT)
    blocks = -(-n // BLOCK_N)
    S = splits(B * kv_heads, blocks, _sms(q.device))
    span = BLOCK_N * -(-blocks // S)                                  # slots a program reads, whole blocks
    S = -(-n // span)                                                 # no program left without slots
    attend_part, combine = _compile()
    common = dict(G=G, BLOCK_G=BG, D=D, BLOCK_D=BD, BLOCK_N=BLOCK_N, NB=span // BLOCK_N, HAS_MASK=mask is not q,
                  PREC="ieee" if q.dtype == torch.float32 else "tf32")   # float32: exact products, not TF32's
    strides = (q.stride(0), q.stride(1), q.stride(2), key.stride(0), key.stride(1), key.stride(2),
               value.stride(0), value.stride(1), value.stride(2), sm_b, sm_n)
    o_strides = (out.stride(0), out.stride(1), out.stride(2))
    if S == 1:
        attend_part[(B, kv_heads, 1)](q, key, value, mask, out, out, out, *strides, *o_strides,
                                      n, span, float(scale), SPLIT=False, **common)
        return out
    m = torch.empty((B, kv_heads, S, BG), dtype=torch.float32, device=q.device)
    sums = torch.empty_like(m)                                        # each span's sum of exp(score - m)
    part = torch.empty((B, kv_heads, S, BG, BD), dtype=torch.float32, device=q.device)
    attend_part[(B, kv_heads, S)](q, key, value, mask, part, m, sums, *strides, *o_strides,
                                  n, span, float(scale), SPLIT=True, **common)
    combine[(B, kv_heads)](m, sums, part, out, *o_strides, S=S, G=G, BLOCK_G=BG, D=D, BLOCK_D=BD)
    return out


def check(device: torch.device, kv_heads: int, groups: int, dim: int, dtype: torch.dtype) -> str | None:
    """None if the kernel runs on `device` at the model's head shapes and agrees with SDPA, both with the
    slots split across programs (2 rows) and without (rows enough to fill the device), else why not,
    in one line (the engine then keeps SDPA)."""
    try:
        gen = torch.Generator().manual_seed(0)
        for rows in (2, -(-4 * _sms(device) // kv_heads)):
            q, k, v = (torch.randn(shape, generator=gen).to(device, dtype) for shape in
                       ((rows, kv_heads, groups, dim), (rows, kv_heads, 70, dim), (rows, kv_heads, 70, dim)))
            mask = torch.zeros((rows, 1, 1, 70), dtype=dtype, device=device)
            mask[0, ..., :5] = torch.finfo(dtype).min                # a left-padded row
            got = decode_attention(q, k, v, mask, dim ** -0.5).float()
            want = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                                    attn_mask=mask.float(), scale=dim ** -0.5)
            err = (got - want).abs().max().item()                     # a host sync: a failed kernel says so here
            if not err < 0.05:
                return f"differs from SDPA by {err:.3g} at {rows} rows x {kv_heads} KV heads x {groups} x {dim}"
    except Exception as exc:   # noqa: BLE001 - any failure means: keep SDPA
        return failure(exc)
    return None
