"""Row-tile loads shared by the row kernels (pooling, gradient reduction, optimizer)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_rows(base, row, stride, col, live, cmask, EVEN: tl.constexpr):
    """Rows ``row`` (R,) of the row-major matrix at ``base`` (row stride ``stride``) at
    columns ``col`` (C,): an (R, C) tile, zero where not ``live`` or outside ``cmask``.

    With EVEN (every column is valid and the width is a compile-time constant), rows
    that are not live read row 0 and are zeroed afterwards: the load carries no mask,
    so it moves 16-byte vectors (a load masked by row alone at that width fails to
    compile with triton 3.6 on sm_90). Row 0 must exist.
    """
    if EVEN:
        x = tl.load(base + tl.where(live, row, 0)[:, None] * stride + col[None, :])
        x = tl.where(live[:, None], x, tl.zeros_like(x))
    else:
        x = tl.load(base + row[:, None] * stride + col[None, :], mask=live[:, None] & cmask,
                    other=0.0)
    return x
