"""Triton HSTU attention with the reference's signature (see ``reference.py``).

The reference builds the (B, H, L, L) scores and weights in memory, and autograd keeps
several such tensors for the backward: at dlrm_hstu's training shapes (8,192 rows of 78
positions, 4 heads) each is 200M values, written and read about a dozen times a layer
and step. Here one program takes a (row, head) and a tile of BLOCK positions: the
forward computes its scores tile by tile against the row's keys, applies SiLU, the
divisor and the mask in registers and accumulates the weighted values; the backward
recomputes the tiles (keys and values one kernel, queries another, so that no two
programs add into one gradient and the result does not depend on their timing). Only the
(B, L, L) mask is read besides q, k, v and the output gradient.

q, k and v may be strided views (the split of one projection); their last dimension
must be contiguous. Scores and weights are float32 in registers; the tile products run
in the inputs' dtype (float32 inputs in IEEE float32, not TF32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hashrec.modules.hstu_attention import reference
from hashrec.table.ops.launch import cdiv, fast_launch

_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_BLOCK = 64  # positions a tile, queries and keys alike (fewer for short rows)
_WARPS = 4


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    """a @ b accumulated in float32; float32 tiles in IEEE float32 (IEEE), not TF32."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _tile(ptr, base, rows, row_stride, cols, length, width):
    """The (rows, cols) tile at ptr + base + row * row_stride + col, 0 at rows past
    ``length`` and columns past ``width``."""
    return tl.load(ptr + base + rows[:, None] * row_stride + cols[None, :],
                   mask=(rows[:, None] < length) & (cols[None, :] < width), other=0.0)


@triton.jit
def _scores(q, k, mask_ptr, mask_row, n, m, length, alpha, inv_divisor,
            IEEE: tl.constexpr):
    """A (BLOCK, BLOCK) tile of queries n and keys m: the scores s = alpha q k^T and each
    weight's factor past SiLU (1 / divisor where n reads m, else 0), both float32."""
    s = _dot(q, tl.trans(k), IEEE) * alpha
    allowed = _tile(mask_ptr, mask_row, n, length, m, length, length)
    return s, tl.where(allowed != 0, inv_divisor, 0.0)


@triton.jit
def _score_gradient(dw, s, keep, alpha):
    """d loss / d (q k^T) from d loss / d weight: the weight is silu(s) * keep, s = alpha q k^T."""
    sig = tl.sigmoid(s)
    return dw * keep * sig * (1.0 + s * (1.0 - sig)) * alpha


@fast_launch
@triton.jit
def _forward_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, out_ptr, length, heads,
                    q_b, q_l, q_h, k_b, k_l, k_h, v_b, v_l, v_h, mask_b, o_b, o_l, o_h,
                    alpha, inv_divisor, A: tl.constexpr, DV: tl.constexpr,
                    BLOCK_A: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK: tl.constexpr,
                    IEEE: tl.constexpr):
    """out[n] = sum_m silu(s[n, m]) / divisor * allowed[n, m] * v[m] for BLOCK queries n."""
    row_head = tl.program_id(0)  # on axis 0: B * H may pass axis 1's 65,535
    b = (row_head // heads).to(tl.int64)
    h = row_head % heads
    n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    a = tl.arange(0, BLOCK_A)
    d = tl.arange(0, BLOCK_DV)
    q = _tile(q_ptr, b * q_b + h * q_h, n, q_l, a, length, A)
    acc = tl.zeros((BLOCK, BLOCK_DV), dtype=tl.float32)
    start = 0
    while start < length:  # range() over a runtime bound fails interpreted
        m = start + tl.arange(0, BLOCK)
        k = _tile(k_ptr, b * k_b + h * k_h, m, k_l, a, length, A)
        v = _tile(v_ptr, b * v_b + h * v_h, m, v_l, d, length, DV)
        s, keep = _scores(q, k, mask_ptr, b * mask_b, n, m, length, alpha, inv_divisor, IEEE)
        acc += _dot((s * tl.sigmoid(s) * keep).to(v.dtype), v, IEEE)
        start += BLOCK
    tl.store(out_ptr + b * o_b + h * o_h + n[:, None] * o_l + d[None, :],
             acc.to(out_ptr.dtype.element_ty),
             mask=(n[:, None] < length) & (d[None, :] < DV))


@fast_launch
@triton.jit
def _keys_values_kernel(q_ptr, k_ptr, v_ptr, do_ptr, mask_ptr, dk_ptr, dv_ptr, length,
                        heads, q_b, q_l, q_h, k_b, k_l, k_h, v_b, v_l, v_h, do_b, do_l,
                        do_h, mask_b, alpha, inv_divisor, A: tl.constexpr,
                        DV: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_DV: tl.constexpr,
                        BLOCK: tl.constexpr, IEEE: tl.constexpr):
    """dk and dv of BLOCK keys m, over every query n (dk, dv (B, L, H, .) contiguous)."""
    row_head = tl.program_id(0)
    b = (row_head // heads).to(tl.int64)
    h = row_head % heads
    m = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    a = tl.arange(0, BLOCK_A)
    d = tl.arange(0, BLOCK_DV)
    k = _tile(k_ptr, b * k_b + h * k_h, m, k_l, a, length, A)
    v = _tile(v_ptr, b * v_b + h * v_h, m, v_l, d, length, DV)
    dk = tl.zeros((BLOCK, BLOCK_A), dtype=tl.float32)
    dv = tl.zeros((BLOCK, BLOCK_DV), dtype=tl.float32)
    start = 0
    while start < length:
        n = start + tl.arange(0, BLOCK)
        q = _tile(q_ptr, b * q_b + h * q_h, n, q_l, a, length, A)
        do = _tile(do_ptr, b * do_b + h * do_h, n, do_l, d, length, DV)
        s, keep = _scores(q, k, mask_ptr, b * mask_b, n, m, length, alpha, inv_divisor, IEEE)
        w = s * tl.sigmoid(s) * keep
        dv += _dot(tl.trans(w.to(do.dtype)), do, IEEE)
        ds = _score_gradient(_dot(do, tl.trans(v), IEEE), s, keep, alpha)
        dk += _dot(tl.trans(ds.to(q.dtype)), q, IEEE)
        start += BLOCK
    out = b * length * heads + m[:, None] * heads + h
    tl.store(dk_ptr + out * A + a[None, :], dk.to(dk_ptr.dtype.element_ty),
             mask=(m[:, None] < length) & (a[None, :] < A))
    tl.store(dv_ptr + out * DV + d[None, :], dv.to(dv_ptr.dtype.element_ty),
             mask=(m[:, None] < length) & (d[None, :] < DV))


@fast_launch
@triton.jit
def _queries_kernel(q_ptr, k_ptr, v_ptr, do_ptr, mask_ptr, dq_ptr, length, heads,
                    q_b, q_l, q_h, k_b, k_l, k_h, v_b, v_l, v_h, do_b, do_l, do_h, mask_b,
                    alpha, inv_divisor, A: tl.constexpr, DV: tl.constexpr,
                    BLOCK_A: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK: tl.constexpr,
                    IEEE: tl.constexpr):
    """dq of BLOCK queries n, over every key m (dq (B, L, H, A) contiguous)."""
    row_head = tl.program_id(0)
    b = (row_head // heads).to(tl.int64)
    h = row_head % heads
    n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    a = tl.arange(0, BLOCK_A)
    d = tl.arange(0, BLOCK_DV)
    q = _tile(q_ptr, b * q_b + h * q_h, n, q_l, a, length, A)
    do = _tile(do_ptr, b * do_b + h * do_h, n, do_l, d, length, DV)
    dq = tl.zeros((BLOCK, BLOCK_A), dtype=tl.float32)
    start = 0
    while start < length:
        m = start + tl.arange(0, BLOCK)
        k = _tile(k_ptr, b * k_b + h * k_h, m, k_l, a, length, A)
        v = _tile(v_ptr, b * v_b + h * v_h, m, v_l, d, length, DV)
        s, keep = _scores(q, k, mask_ptr, b * mask_b, n, m, length, alpha, inv_divisor, IEEE)
        ds = _score_gradient(_dot(do, tl.trans(v), IEEE), s, keep, alpha)
        dq += _dot(ds.to(k.dtype), k, IEEE)
        start += BLOCK
    out = b * length * heads + n[:, None] * heads + h
    tl.store(dq_ptr + out * A + a[None, :], dq.to(dq_ptr.dtype.element_ty),
             mask=(n[:, None] < length) & (a[None, :] < A))


def _block(size: int) -> int:
    """A tile side for ``size`` values: a power of two, 16 at least (``tl.dot``)."""
    return max(16, triton.next_power_of_2(size))


def _strides(t: torch.Tensor) -> tuple[int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2)


def _mask_bytes(allowed: torch.Tensor, batch: int, length: int
                ) -> tuple[torch.Tensor, int]:
    """(the mask as contiguous uint8, its row stride: 0 where one (L, L) mask serves all)."""
    if allowed.dtype != torch.bool:
        raise ValueError(f"allowed must be bool, got {allowed.dtype}")
    shape = (length, length) if allowed.dim() == 2 else (batch, length, length)
    if tuple(allowed.shape) != shape:
        raise ValueError(f"allowed must be (L, L) or (B, L, L) = {(batch, length, length)}, "
                         f"got {tuple(allowed.shape)}")
    mask = allowed.contiguous().view(torch.uint8)
    return mask, 0 if allowed.dim() == 2 else length * length


def _launch_shape(q: torch.Tensor, v: torch.Tensor) -> dict:
    length, a, dv = q.shape[1], q.shape[3], v.shape[3]
    return {"A": a, "DV": dv, "BLOCK_A": _block(a), "BLOCK_DV": _block(dv),
            "BLOCK": min(_BLOCK, _block(length)), "IEEE": q.dtype == torch.float32}


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> None:
    if q.dim() != 4 or k.shape != q.shape or v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"q, k must be (B, L, H, A) and v (B, L, H, Dv) alike, got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.device == k.device == v.device == allowed.device:
        raise ValueError(f"q, k, v and allowed must be on one device, got {q.device}, "
                         f"{k.device}, {v.device}, {allowed.device}")


def _last_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(3) == 1 else t.contiguous()


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, allowed, alpha, divisor):
        batch, length, heads = q.shape[0], q.shape[1], q.shape[2]
        q, k, v = (_last_contiguous(t) for t in (q, k, v))
        mask, mask_b = _mask_bytes(allowed, batch, length)
        shape = _launch_shape(q, v)
        out = torch.empty(v.shape, dtype=v.dtype, device=v.device)
        if out.numel():
            grid = (batch * heads, cdiv(length, shape["BLOCK"]))
            _forward_kernel[grid](q, k, v, mask, out, length, heads, *_strides(q),
                                  *_strides(k), *_strides(v), mask_b, *_strides(out),
                                  float(alpha), 1.0 / float(divisor), **shape,
                                  num_warps=_WARPS)
        ctx.save_for_backward(q, k, v, mask)
        ctx.mask_b, ctx.alpha, ctx.inv_divisor = mask_b, float(alpha), 1.0 / float(divisor)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, mask = ctx.saved_tensors
        grad = _last_contiguous(grad.to(v.dtype))
        batch, length, heads = q.shape[0], q.shape[1], q.shape[2]
        shape = _launch_shape(q, v)
        dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
        dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
        if q.numel() or v.numel():
            grid = (batch * heads, cdiv(length, shape["BLOCK"]))
            common = (length, heads, *_strides(q), *_strides(k), *_strides(v),
                      *_strides(grad), ctx.mask_b, ctx.alpha, ctx.inv_divisor)
            _keys_values_kernel[grid](q, k, v, grad, mask, dk, dv, *common, **shape,
                                      num_warps=_WARPS)
            _queries_kernel[grid](q, k, v, grad, mask, dq, *common, **shape,
                                  num_warps=_WARPS)
        return dq, dk, dv, None, None, None


def hstu_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   allowed: torch.Tensor, alpha: float, divisor: float) -> torch.Tensor:
    """See ``reference.hstu_attention``; the output in v's dtype, or autocast's where it
    is on (as the reference's). Other dtypes than float32, float16 and bfloat16 (float64,
    say) take the reference."""
    _check(q, k, v, allowed)
    if q.dtype not in _KERNEL_DTYPES:
        return reference.hstu_attention(q, k, v, allowed, alpha, divisor)
    q, k, v = _autocast(q, k, v)
    return _Attention.apply(q, k, v, allowed, alpha, divisor)


def _autocast(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v in autocast's dtype where it is on, as the reference's products take them
    (an autograd Function is not cast by autocast itself): the STU layer's projection,
    float32 past its bias, would otherwise run the tiles in IEEE float32, 4x slower than
    the reference in bfloat16 on an H100 (``benchmarks/results/hstu_attention_gpu_fp32.md``)."""
    kind = q.device.type
    if not torch.is_autocast_enabled(kind):
        return q, k, v
    dtype = torch.get_autocast_dtype(kind)
    return q.to(dtype), k.to(dtype), v.to(dtype)
