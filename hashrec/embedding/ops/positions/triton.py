"""Triton gradient rows with the reference's signature (see ``reference.py``).

One kernel over the ids: each finds its bag by a binary search of the bags' ends
(a cumulative sum), so zero-length bags need no special case and the host reads
nothing. Three launches in all, where the reference takes about a dozen.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hashrec.table.ops.launch import cdiv, fast_launch

_BLOCK = 1024


@fast_launch
@triton.jit
def _rows_kernel(ends_ptr, lengths_ptr, first_ptr, sequence_ptr, rows_ptr, bags_ptr, n,
                 num_bags, steps, BLOCK: tl.constexpr):
    p = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = p < n
    lo = tl.zeros([BLOCK], dtype=tl.int64)
    hi = tl.zeros([BLOCK], dtype=tl.int64) + num_bags
    step = 0
    while step < steps:  # the first bag whose end lies past p
        open_ = mask & (lo < hi)
        mid = (lo + hi) // 2
        right = tl.load(ends_ptr + mid, mask=open_, other=0) <= p
        lo = tl.where(open_ & right, mid + 1, lo)
        hi = tl.where(open_ & ~right, mid, hi)
        step += 1
    bag = lo
    start = tl.load(ends_ptr + bag, mask=mask, other=0) - tl.load(lengths_ptr + bag, mask=mask,
                                                                   other=0)
    row = tl.load(first_ptr + bag, mask=mask, other=0) + (p - start) * tl.load(
        sequence_ptr + bag, mask=mask, other=0)
    tl.store(rows_ptr + p, row, mask=mask)
    tl.store(bags_ptr + p, bag, mask=mask)


def gradient_rows(lengths: torch.Tensor, first: torch.Tensor, sequence: torch.Tensor,
                  n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row of each id's output gradient, and its bag: -> (rows (n,), bags (n,)) int64."""
    num_bags = lengths.numel()
    if first.shape != (num_bags,) or sequence.shape != (num_bags,):
        raise ValueError(f"first and sequence must be ({num_bags},), got "
                         f"{tuple(first.shape)} and {tuple(sequence.shape)}")
    rows = torch.empty(n, dtype=torch.int64, device=lengths.device)
    bags = torch.empty(n, dtype=torch.int64, device=lengths.device)
    if n == 0:
        return rows, bags
    ends = torch.cumsum(lengths, 0)
    _rows_kernel[(cdiv(n, _BLOCK),)](
        ends, lengths.contiguous(), first.contiguous(), sequence.contiguous(), rows, bags, n,
        num_bags, max(1, num_bags.bit_length()), BLOCK=_BLOCK)
    return rows, bags
