"""Triton HSTU attention with the reference's signature (see ``reference.py``).

The reference builds the (B, H, L, L) scores and weights in memory, and autograd keeps
several such tensors for the backward: at dlrm_hstu's training shapes (8,192 rows of 78
positions, 4 heads) each is 200M values, written and read about a dozen times a layer
and step. Here one program takes a (row, head) and a tile of positions: the
forward computes its scores tile by tile against the row's keys, applies SiLU, the
divisor and the mask in registers and accumulates the weighted values; the backward
recomputes the tiles (keys and values one kernel, queries another, so that no two
programs add into one gradient and the result does not depend on their timing). Only the
(B, L, L) mask is read besides q, k, v and the output gradient, as bytes in rows padded
to 16 of them.

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
# Each kernel's (queries a tile, keys a tile, warps): the forward's and the queries'
# gradient's programs hold a tile of queries and loop over the keys' tiles, the keys' and
# values' gradient's the other way round; tiles of fewer positions for short rows. Picked
# without timing, for the most warps an SM holds at once by registers and shared memory
# (``benchmarks/hstu_kernel_registers.py`` at dlrm_hstu's shapes in bfloat16: 40, 32 and
# 32 of 64, against 20, 8 and 12 with 64 x 64 tiles and 4 warps everywhere);
# ``benchmarks/bench_hstu_attention.py --sweep`` times every setting on a GPU.
LAUNCH = {"forward": (64, 16, 8), "keys_values": (16, 16, 4), "queries": (64, 16, 8)}


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
def _scores(q, k, mask_ptr, mask_row, mask_l, n, m, length, alpha, IEEE: tl.constexpr):
    """A (BLOCK_N, BLOCK_M) tile of queries n and keys m: the scores s = alpha q k^T
    (float32), their sigmoid and whether n reads m. The weights are silu(s) / divisor where
    n reads m, else 0; the kernels apply the divisor (and alpha) to their sums at the end,
    which keeps one float32 tile fewer in registers."""
    s = _dot(q, tl.trans(k), IEEE) * alpha
    allowed = _tile(mask_ptr, mask_row, n, mask_l, m, length, length) != 0
    return s, tl.sigmoid(s), allowed


@triton.jit
def _score_gradient(dw, s, sig, allowed):
    """d loss / d (q k^T) from d loss / d weight, short of the factor alpha / divisor."""
    return tl.where(allowed, dw * sig * (1.0 + s * (1.0 - sig)), 0.0)


@fast_launch
@triton.jit
def _forward_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, out_ptr, length, heads,
                    q_b, q_l, q_h, k_b, k_l, k_h, v_b, v_l, v_h, mask_b, mask_l,
                    o_b, o_l, o_h, alpha, inv_divisor, A: tl.constexpr, DV: tl.constexpr,
                    BLOCK_A: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_M: tl.constexpr, IEEE: tl.constexpr):
    """out[n] = sum_m silu(s[n, m]) / divisor * allowed[n, m] * v[m] for BLOCK_N queries n."""
    row_head = tl.program_id(0)  # on axis 0: B * H may pass axis 1's 65,535
    b = (row_head // heads).to(tl.int64)
    h = row_head % heads
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    a = tl.arange(0, BLOCK_A)
    d = tl.arange(0, BLOCK_DV)
    q = _tile(q_ptr, b * q_b + h * q_h, n, q_l, a, length, A)
    acc = tl.zeros((BLOCK_N, BLOCK_DV), dtype=tl.float32)
    start = 0
    while start < length:  # range() over a runtime bound fails interpreted
        m = start + tl.arange(0, BLOCK_M)
        k = _tile(k_ptr, b * k_b + h * k_h, m, k_l, a, length, A)
        v = _tile(v_ptr, b * v_b + h * v_h, m, v_l, d, length, DV)
        s, sig, allowed = _scores(q, k, mask_ptr, b * mask_b, mask_l, n, m, length, alpha, IEEE)
        acc += _dot(tl.where(allowed, s * sig, 0.0).to(v.dtype), v, IEEE)
        start += BLOCK_M
    tl.store(out_ptr + b * o_b + h * o_h + n[:, None] * o_l + d[None, :],
             (acc * inv_divisor).to(out_ptr.dtype.element_ty),
             mask=(n[:, None] < length) & (d[None, :] < DV))


@fast_launch
@triton.jit
def _keys_values_kernel(q_ptr, k_ptr, v_ptr, do_ptr, mask_ptr, dk_ptr, dv_ptr, length,
                        heads, q_b, q_l, q_h, k_b, k_l, k_h, v_b, v_l, v_h, do_b, do_l,
                        do_h, mask_b, mask_l, alpha, inv_divisor, A: tl.constexpr,
                        DV: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_DV: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, IEEE: tl.constexpr):
    """dk and dv of BLOCK_M keys m, over every query n (dk, dv (B, L, H, .) contiguous)."""
    row_head = tl.program_id(0)
    b = (row_head // heads).to(tl.int64)
    h = row_head % heads
    m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    a = tl.arange(0, BLOCK_A)
    d = tl.arange(0, BLOCK_DV)
    k = _tile(k_ptr, b * k_b + h * k_h, m, k_l, a, length, A)
    v = _tile(v_ptr, b * v_b + h * v_h, m, v_l, d, length, DV)
    dk = tl.zeros((BLOCK_M, BLOCK_A), dtype=tl.float32)
    dv = tl.zeros((BLOCK_M, BLOCK_DV), dtype=tl.float32)
    start = 0
    while start < length:
        n = start + tl.arange(0, BLOCK_N)
        q = _tile(q_ptr, b * q_b + h * q_h, n, q_l, a, length, A)
        do = _tile(do_ptr, b * do_b + h * do_h, n, do_l, d, length, DV)
        s, sig, allowed = _scores(q, k, mask_ptr, b * mask_b, mask_l, n, m, length, alpha, IEEE)
        w = tl.where(allowed, s * sig, 0.0)
        dv += _dot(tl.trans(w.to(do.dtype)), do, IEEE)
        ds = _score_gradient(_dot(do, tl.trans(v), IEEE), s, sig, allowed)
        dk += _dot(tl.trans(ds.to(q.dtype)), q, IEEE)
        start += BLOCK_N
    out = b * length * heads + m[:, None] * heads + h
    tl.store(dk_ptr + out * A + a[None, :],
             (dk * (alpha * inv_divisor)).to(dk_ptr.dtype.element_ty),
             mask=(m[:, None] < length) & (a[None, :] < A))
    tl.store(dv_ptr + out * DV + d[None, :], (dv * inv_divisor).to(dv_ptr.dtype.element_ty),
             mask=(m[:, None] < length) & (d[None, :] < DV))


@fast_launch
@triton.jit
def _queries_kernel(q_ptr, k_ptr, v_ptr, do_ptr, mask_ptr, dq_ptr, length, heads,
                    q_b, q_l, q_h, k_b, k_l, k_h, v_b, v_l, v_h, do_b, do_l, do_h, mask_b,
                    mask_l, alpha, inv_divisor, A: tl.constexpr, DV: tl.constexpr,
                    BLOCK_A: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_M: tl.constexpr, IEEE: tl.constexpr):
    """dq of BLOCK_N queries n, over every key m (dq (B, L, H, A) contiguous)."""
    row_head = tl.program_id(0)
    b = (row_head // heads).to(tl.int64)
    h = row_head % heads
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    a = tl.arange(0, BLOCK_A)
    d = tl.arange(0, BLOCK_DV)
    q = _tile(q_ptr, b * q_b + h * q_h, n, q_l, a, length, A)
    do = _tile(do_ptr, b * do_b + h * do_h, n, do_l, d, length, DV)
    dq = tl.zeros((BLOCK_N, BLOCK_A), dtype=tl.float32)
    start = 0
    while start < length:
        m = start + tl.arange(0, BLOCK_M)
        k = _tile(k_ptr, b * k_b + h * k_h, m, k_l, a, length, A)
        v = _tile(v_ptr, b * v_b + h * v_h, m, v_l, d, length, DV)
        s, sig, allowed = _scores(q, k, mask_ptr, b * mask_b, mask_l, n, m, length, alpha, IEEE)
        ds = _score_gradient(_dot(do, tl.trans(v), IEEE), s, sig, allowed)
        dq += _dot(ds.to(k.dtype), k, IEEE)
        start += BLOCK_M
    out = b * length * heads + n[:, None] * heads + h
    tl.store(dq_ptr + out * A + a[None, :],
             (dq * (alpha * inv_divisor)).to(dq_ptr.dtype.element_ty),
             mask=(n[:, None] < length) & (a[None, :] < A))


def _block(size: int) -> int:
    """A tile side for ``size`` values: a power of two, 16 at least (``tl.dot``)."""
    return max(16, triton.next_power_of_2(size))


def _strides(t: torch.Tensor) -> tuple[int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2)


def _mask_bytes(allowed: torch.Tensor, batch: int, length: int
                ) -> tuple[torch.Tensor, int, int]:
    """(the mask as uint8, its strides between rows of the batch (0 where one (L, L) mask
    serves all) and between positions). Positions are padded to 16 bytes, so that the
    kernels read a tile's mask in 16-byte loads: at 78 positions a byte a load held a
    64-bit address a byte in registers."""
    if allowed.dtype != torch.bool:
        raise ValueError(f"allowed must be bool, got {allowed.dtype}")
    shape = (length, length) if allowed.dim() == 2 else (batch, length, length)
    if tuple(allowed.shape) != shape:
        raise ValueError(f"allowed must be (L, L) or (B, L, L) = {(batch, length, length)}, "
                         f"got {tuple(allowed.shape)}")
    padded = cdiv(length, 16) * 16
    if padded == length:
        mask = allowed.contiguous().view(torch.uint8)
    else:
        # the pad bytes are never read (the tiles' loads stop at ``length``): left unset
        mask = allowed.new_empty((*shape[:-1], padded), dtype=torch.uint8)
        mask[..., :length] = allowed
    return mask, 0 if allowed.dim() == 2 else length * padded, padded


def _launch(kernel: str, q: torch.Tensor, v: torch.Tensor) -> tuple[int, dict]:
    """(the grid's axis 1, the constexprs and warps) of one kernel's launch."""
    length, a, dv = q.shape[1], q.shape[3], v.shape[3]
    block_n, block_m, warps = LAUNCH[kernel]
    block_n, block_m = min(block_n, _block(length)), min(block_m, _block(length))
    tiles = cdiv(length, block_m if kernel == "keys_values" else block_n)
    return tiles, {"A": a, "DV": dv, "BLOCK_A": _block(a), "BLOCK_DV": _block(dv),
                   "BLOCK_N": block_n, "BLOCK_M": block_m, "IEEE": q.dtype == torch.float32,
                   "num_warps": warps}


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
        mask, mask_b, mask_l = _mask_bytes(allowed, batch, length)
        out = torch.empty(v.shape, dtype=v.dtype, device=v.device)
        if out.numel():
            tiles, shape = _launch("forward", q, v)
            _forward_kernel[(batch * heads, tiles)](
                q, k, v, mask, out, length, heads, *_strides(q), *_strides(k), *_strides(v),
                mask_b, mask_l, *_strides(out), float(alpha), 1.0 / float(divisor), **shape)
        ctx.save_for_backward(q, k, v, mask)
        ctx.mask_strides = mask_b, mask_l
        ctx.alpha, ctx.inv_divisor = float(alpha), 1.0 / float(divisor)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, mask = ctx.saved_tensors
        grad = _last_contiguous(grad.to(v.dtype))
        batch, length, heads = q.shape[0], q.shape[1], q.shape[2]
        dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
        dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
        if q.numel() or v.numel():
            common = (length, heads, *_strides(q), *_strides(k), *_strides(v),
                      *_strides(grad), *ctx.mask_strides, ctx.alpha, ctx.inv_divisor)
            tiles, shape = _launch("keys_values", q, v)
            _keys_values_kernel[(batch * heads, tiles)](q, k, v, grad, mask, dk, dv, *common,
                                                        **shape)
            tiles, shape = _launch("queries", q, v)
            _queries_kernel[(batch * heads, tiles)](q, k, v, grad, mask, dq, *common, **shape)
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
