"""Triton erase: clears the digest (the occupancy mark) of the given slots."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hashrec.table.ops.launch import cdiv, fast_launch
from hashrec.table.storage import TableStorage


@fast_launch
@triton.jit(do_not_specialize=["n"])
def _erase_kernel(slots_ptr, t_digests, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    slot = tl.load(slots_ptr + offs, mask=mask, other=-1)
    tl.store(t_digests + slot, tl.zeros([BLOCK], dtype=tl.uint8), mask=mask & (slot >= 0))


def erase_slots(storage: TableStorage, slots: torch.Tensor) -> None:
    """Marks slots empty: (k,) int64 slots (negative entries are skipped) -> None."""
    if slots.dtype != torch.int64 or slots.dim() != 1 or slots.device != storage.device:
        raise ValueError(f"slots must be a 1-D int64 tensor on {storage.device}, "
                         f"got {slots.dtype} {tuple(slots.shape)} on {slots.device}")
    n = slots.numel()
    if n:
        block = 1024
        _erase_kernel[(cdiv(n, block),)](slots.contiguous(), storage.digests, n,
                                                BLOCK=block)
