"""Triton reply ops with the reference's signatures (see ``reference.py``).

Each is one launch over blocks of rows: ``pack_reply`` gathers the rows and writes
the stored flag next to them (the reference compares, converts, concatenates and
gathers), ``unpack_reply`` scatters rows and flags to the caller's order (the
reference scatters, slices, copies and compares).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hashrec.table.ops.launch import cdiv, fast_launch, next_pow2

_ROWS = 64


@fast_launch
@triton.jit(do_not_specialize=["m"])
def _pack_kernel(values_ptr, slots_ptr, index_ptr, out_ptr, m, dim, values_stride,
                 ROWS: tl.constexpr, DIM: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    live = i < m
    row = tl.load(index_ptr + i, mask=live, other=0)
    col = tl.arange(0, DIM)
    cell = live[:, None] & (col[None, :] < dim)
    v = tl.load(values_ptr + row[:, None] * values_stride + col[None, :], mask=cell, other=0.0)
    tl.store(out_ptr + i[:, None] * (dim + 1) + col[None, :], v.to(tl.float32), mask=cell)
    stored = tl.load(slots_ptr + row, mask=live, other=-1) >= 0
    tl.store(out_ptr + i * (dim + 1) + dim, stored.to(tl.float32), mask=live)


@fast_launch
@triton.jit(do_not_specialize=["n"])
def _unpack_kernel(rows_ptr, order_ptr, values_ptr, stored_ptr, n, dim,
                   ROWS: tl.constexpr, DIM: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    live = i < n
    dest = tl.load(order_ptr + i, mask=live, other=0)
    col = tl.arange(0, DIM)
    cell = live[:, None] & (col[None, :] < dim)
    v = tl.load(rows_ptr + i[:, None] * (dim + 1) + col[None, :], mask=cell, other=0.0)
    tl.store(values_ptr + dest[:, None] * dim + col[None, :], v, mask=cell)
    flag = tl.load(rows_ptr + i * (dim + 1) + dim, mask=live, other=0.0)
    tl.store(stored_ptr + dest, flag > 0.5, mask=live)


def pack_reply(values: torch.Tensor, slots: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """See ``reference.pack_reply``."""
    m, dim = index.numel(), values.shape[1]
    out = torch.empty((m, dim + 1), dtype=torch.float32, device=values.device)
    if m == 0:
        return out
    if values.stride(1) != 1:
        values = values.contiguous()
    _pack_kernel[(cdiv(m, _ROWS),)](values, slots.contiguous(), index.contiguous(), out, m,
                                    dim, values.stride(0), ROWS=_ROWS, DIM=next_pow2(dim))
    return out


def unpack_reply(rows: torch.Tensor, order: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """See ``reference.unpack_reply``."""
    n, dim = rows.shape[0], rows.shape[1] - 1
    values = torch.empty((n, dim), dtype=torch.float32, device=rows.device)
    stored = torch.empty(n, dtype=torch.bool, device=rows.device)
    if n == 0:
        return values, stored
    _unpack_kernel[(cdiv(n, _ROWS),)](rows.contiguous(), order.contiguous(), values, stored,
                                      n, dim, ROWS=_ROWS, DIM=next_pow2(dim))
    return values, stored
