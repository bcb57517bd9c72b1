"""Triton kernels over two row tensors addressed as one index space.

Index ``i < split`` is row ``i`` of ``first``; otherwise row ``i - split`` of
``second``. ``second`` may be a pinned host tensor: under unified virtual
addressing its data pointer is valid on the device, so the kernels read and
write host rows in place over the interconnect (no staging copy). Both tensors
are row-major with ``row_dim`` columns. The optimizer step reuses the shared
``update_rows`` body of ``hashrec.table.ops.optimizer.triton``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hashrec.table.ops.launch import cdiv, fast_launch, next_pow2
from hashrec.table.ops.optimizer.triton import kernel_hyper, rows_per_program, update_rows


@triton.jit
def _tile(index_ptr, split, n, width, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """This program's (BLOCK_R, BLOCK_C) tile: its rows and columns, their masks, and
    for each row the row of ``first`` or of ``second`` it addresses (``near``: first)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    col = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    rmask = rows < n
    cmask = col[None, :] < width
    idx = tl.load(index_ptr + rows, mask=rmask, other=0)
    near = idx < split
    return rows, col, rmask, cmask, near, tl.where(near, idx, 0), tl.where(near, 0, idx - split)


@fast_launch
@triton.jit(do_not_specialize=["n"])
def _gather_kernel(first, second, split, index_ptr, out_ptr, n, row_dim, start, width,
                   BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    rows, col, rmask, cmask, near, row_a, row_b = _tile(index_ptr, split, n, width,
                                                        BLOCK_R, BLOCK_C)
    src = start + col[None, :]
    a = tl.load(first + row_a[:, None] * row_dim + src,
                mask=(rmask & near)[:, None] & cmask, other=0.0)
    b = tl.load(second + row_b[:, None] * row_dim + src,
                mask=(rmask & ~near)[:, None] & cmask, other=0.0)
    tl.store(out_ptr + rows[:, None] * width + col[None, :], tl.where(near[:, None], a, b),
             mask=rmask[:, None] & cmask)


@fast_launch
@triton.jit(do_not_specialize=["n"])
def _scatter_kernel(first, second, split, index_ptr, rows_ptr, n, row_dim, start, width,
                    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    rows, col, rmask, cmask, near, row_a, row_b = _tile(index_ptr, split, n, width,
                                                        BLOCK_R, BLOCK_C)
    x = tl.load(rows_ptr + rows[:, None] * width + col[None, :], mask=rmask[:, None] & cmask)
    dst = start + col[None, :]
    tl.store(first + row_a[:, None] * row_dim + dst, x, mask=(rmask & near)[:, None] & cmask)
    tl.store(second + row_b[:, None] * row_dim + dst, x, mask=(rmask & ~near)[:, None] & cmask)


@fast_launch
@triton.jit(do_not_specialize=["u"])
def _update_kernel(first, second, split, index_ptr, grads_ptr, u, row_dim, dim, lr, eps, beta1,
                   beta2, wd, adam_scale, OPT: tl.constexpr, DIM_P2: tl.constexpr,
                   BLOCK: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    rmask = rows < u
    idx = tl.load(index_ptr + rows, mask=rmask, other=0)
    near = idx < split
    col = tl.arange(0, DIM_P2)
    g = tl.load(grads_ptr + rows[:, None] * dim + col[None, :],
                mask=rmask[:, None] & (col[None, :] < dim), other=0.0).to(tl.float32)
    update_rows(first, tl.where(near, idx, 0), rmask & near, g, row_dim, dim, lr, eps, beta1,
                beta2, wd, adam_scale, OPT, DIM_P2)
    update_rows(second, tl.where(near, 0, idx - split), rmask & ~near, g, row_dim, dim, lr, eps,
                beta1, beta2, wd, adam_scale, OPT, DIM_P2)


def _tiles(n: int, width: int) -> tuple[int, int, tuple[int, int]]:
    """BLOCK_R, BLOCK_C and the grid of an (n, width) gather or scatter."""
    block_c = min(next_pow2(max(width, 1)), 128)
    block_r = max(1, min(64, 2048 // block_c))
    return block_r, block_c, (cdiv(n, block_r), cdiv(width, block_c))


def gather(first: torch.Tensor, second: torch.Tensor, split: int, index: torch.Tensor,
           start: int, width: int) -> torch.Tensor:
    """index (n,) int64 -> (n, width) rows of columns [start, start + width), on index's device."""
    n = index.numel()
    out = torch.empty(n, width, dtype=first.dtype, device=index.device)
    if n == 0 or width == 0:
        return out
    block_r, block_c, grid = _tiles(n, width)
    _gather_kernel[grid](first, second, split, index.contiguous(), out, n, first.shape[1],
                         start, width, BLOCK_R=block_r, BLOCK_C=block_c)
    return out


def scatter(first: torch.Tensor, second: torch.Tensor, split: int, index: torch.Tensor,
            rows: torch.Tensor, start: int) -> None:
    """Writes rows (n, w) into columns [start, start + w) of unique index (n,)."""
    n, width = rows.shape
    if n == 0 or width == 0:
        return
    block_r, block_c, grid = _tiles(n, width)
    _scatter_kernel[grid](first, second, split, index.contiguous(),
                          rows.to(first.dtype).contiguous(), n, first.shape[1], start, width,
                          BLOCK_R=block_r, BLOCK_C=block_c)


def update(first: torch.Tensor, second: torch.Tensor, split: int, index: torch.Tensor,
           grads: torch.Tensor, spec, lr: float | None, step: int) -> None:
    """Optimizer step (embedding + state) of unique index (u,) with grads (u, dim) float32."""
    u, dim = grads.shape
    if dim + spec.state_dim(dim) != first.shape[1]:
        raise ValueError(f"row_dim {first.shape[1]} != dim {dim} + state "
                         f"{spec.state_dim(dim)} of {type(spec).__name__}")
    hp = kernel_hyper(spec, lr, step)
    if u == 0:
        return
    dim_p2 = next_pow2(dim)
    block = rows_per_program(dim_p2)
    _update_kernel[(cdiv(u, block),)](
        first, second, split, index.contiguous(), grads.contiguous().float(), u, first.shape[1],
        dim, hp.lr, hp.eps, hp.beta1, hp.beta2, hp.weight_decay, hp.adam_scale,
        OPT=hp.kind, DIM_P2=dim_p2, BLOCK=block)


def probe_uva() -> bool:
    """True when a kernel on the current CUDA device reads and writes pinned host rows."""
    device = torch.device("cuda")
    host = torch.arange(12, dtype=torch.float32).view(4, 3).pin_memory()
    first = torch.zeros(1, 3, device=device)
    index = torch.tensor([3, 1], device=device)
    rows = gather(first, host, 1, index, 0, 3)
    scatter(first, host, 1, index[:1], rows[1:] + 100.0, 0)
    torch.cuda.synchronize()
    expected_rows = torch.tensor([[6.0, 7.0, 8.0], [0.0, 1.0, 2.0]])
    return (torch.equal(rows.cpu(), expected_rows)
            and torch.equal(host[2], torch.tensor([100.0, 101.0, 102.0])))
