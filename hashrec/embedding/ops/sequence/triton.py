"""Triton padded sequence gather with the reference's signatures (see ``reference.py``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hashrec.embedding.ops.fused.dedup import bag_of_positions, group_positions
from hashrec.embedding.ops.fused.triton import reduce_rows
from hashrec.table.ops.launch import cdiv, fast_launch, next_pow2
from hashrec.table.ops.tiles import load_rows


# dim is not specialized: a dim divisible by 16 failed to compile (triton 3.6, sm_90);
# EVEN (dim == DIM_P2) makes it a compile-time constant instead (16-byte row vectors).
@fast_launch
@triton.jit(do_not_specialize=["total", "dim"],
            do_not_specialize_on_alignment=["inverse_ptr", "offsets_ptr"])
def _gather_kernel(rows_ptr, inverse_ptr, offsets_ptr, out_ptr, total, max_length, dim,
                   DIM_P2: tl.constexpr, EVEN: tl.constexpr, BR: tl.constexpr):
    if EVEN:
        dim = DIM_P2
    r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    rmask = r < total
    seq = r // max_length
    pos = r % max_length
    start = tl.load(offsets_ptr + seq, mask=rmask, other=0)
    live = rmask & (pos < tl.load(offsets_ptr + seq + 1, mask=rmask, other=0) - start)
    row = tl.load(inverse_ptr + start + pos, mask=live, other=0)
    col = tl.arange(0, DIM_P2)
    cmask = col[None, :] < dim
    x = load_rows(rows_ptr, row, dim, col, live, cmask, EVEN)
    tl.store(out_ptr + r[:, None] * dim + col[None, :], x.to(tl.float32),
             mask=rmask[:, None] & cmask)


# The gather launch: {"rows": output rows a program (a power of two), "num_warps"}; None
# keeps the default, ``_gather_config``. Benchmarks may set it.
GATHER_CONFIG: dict | None = None


def _gather_config(dim_p2: int) -> dict:
    """About 512 elements a program on two warps. On an H200, gathering 1M ids from
    unique rows as sequences of 8 took 0.190 ms at dim 128 against 0.222 at 2048
    elements on 4 warps, the earlier choice (1.17x), and 0.098 against 0.115 at dim 64;
    sequences of 32, 0.193 against 0.196; of one id, 0.192 against 0.186
    (benchmarks/results/sweep_rows_gpu_seq*.md)."""
    return {"rows": max(1, 512 // dim_p2), "num_warps": 2}


def gather_padded(rows: torch.Tensor, inverse: torch.Tensor, offsets: torch.Tensor,
                  max_length: int) -> torch.Tensor:
    """Gathers sequences: -> (B, max_length, D) float32, zero padded."""
    batch, dim = offsets.numel() - 1, rows.shape[1]
    out = torch.empty(batch, max_length, dim, dtype=torch.float32, device=rows.device)
    total = batch * max_length
    if total == 0:
        return out
    dim_p2 = next_pow2(dim)
    config = GATHER_CONFIG or _gather_config(dim_p2)
    br = config["rows"]
    _gather_kernel[(cdiv(total, br),)](
        rows.contiguous(), inverse.contiguous(), offsets.contiguous(), out, total, max_length,
        dim, DIM_P2=dim_p2, EVEN=dim == dim_p2 and rows.shape[0] > 0, BR=br,
        num_warps=config["num_warps"])
    return out


def gather_padded_backward(grad_out: torch.Tensor, inverse: torch.Tensor, offsets: torch.Tensor,
                           num_rows: int) -> torch.Tensor:
    """Gradient of ``gather_padded`` w.r.t. ``rows``: (B, L, D) -> (U, D), summed per row."""
    batch, max_length, dim = grad_out.shape
    n = inverse.numel()
    seq = bag_of_positions(offsets, n)
    col = torch.arange(n, device=inverse.device) - offsets[:-1].index_select(0, seq)
    order, row_start = group_positions(inverse, num_rows)
    return reduce_rows(grad_out.reshape(batch * max_length, dim), seq * max_length + col,
                       order, row_start)
