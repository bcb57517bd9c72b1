"""Triton export compaction: occupied slots of a range, ascending, in two passes.

Pass 1 counts occupied slots per block; an exclusive cumsum gives each block its
output offset; pass 2 writes each block's occupied slots in order. No atomics, so
the output order is fixed (ascending slot).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hashrec.table.ops.launch import cdiv, fast_launch
from hashrec.table.storage import TableStorage


@fast_launch
@triton.jit
def _count_kernel(t_digests, counts_ptr, start, end, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = start + pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    occ = tl.load(t_digests + offs, mask=offs < end, other=0) != 0
    tl.store(counts_ptr + pid, tl.sum(occ.to(tl.int64), axis=0))


@fast_launch
@triton.jit
def _write_kernel(t_digests, offsets_ptr, out_ptr, start, end, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = start + pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    occ = tl.load(t_digests + offs, mask=offs < end, other=0) != 0
    pos = tl.load(offsets_ptr + pid) + tl.cumsum(occ.to(tl.int64), axis=0) - 1
    tl.store(out_ptr + pos, offs, mask=occ)


def occupied_slots(storage: TableStorage, start: int, end: int) -> torch.Tensor:
    """Occupied slots in [start, end), ascending: -> (k,) int64."""
    if not 0 <= start <= end <= storage.capacity:
        raise ValueError(f"range [{start}, {end}) is not inside [0, {storage.capacity}]")
    device = storage.device
    n = end - start
    if n == 0:
        return torch.empty(0, dtype=torch.int64, device=device)
    block = 1024
    grid = cdiv(n, block)
    counts = torch.empty(grid, dtype=torch.int64, device=device)
    _count_kernel[(grid,)](storage.digests, counts, start, end, BLOCK=block)
    offsets = torch.cumsum(counts, 0) - counts
    total = int(counts.sum())
    out = torch.empty(total, dtype=torch.int64, device=device)
    if total:
        _write_kernel[(grid,)](storage.digests, offsets, out, start, end, BLOCK=block)
    return out
