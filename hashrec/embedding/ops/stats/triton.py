"""Triton per-table lookup counts with the reference's signature (see ``reference.py``).

One launch where the reference takes seven: each program counts the unstored keys of
its block, tag by tag from its first key's tag to its last one's (the tags ascend, so
a block spans one or a few), and takes each count off the running sums with one atomic
(integer sums: the result does not depend on their order).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hashrec.table.ops.launch import cdiv, fast_launch

_BLOCK = 1024


@fast_launch
@triton.jit(do_not_specialize=["n"])
def _unstored_kernel(sums_ptr, slots_ptr, tags_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = i < n
    unstored = (live & (tl.load(slots_ptr + i, mask=live, other=0) < 0)).to(tl.int64)
    tag = tl.load(tags_ptr + i, mask=live, other=0)
    first = tl.load(tags_ptr + tl.program_id(0).to(tl.int64) * BLOCK)
    last = tl.max(tl.where(live, tag, first), axis=0)
    t = first
    while t <= last:
        count = tl.sum(tl.where(tag == t, unstored, 0), axis=0)
        if count > 0:
            tl.atomic_add(sums_ptr + t, -count)
        t += 1


def take_unstored_by_tag(sums: torch.Tensor, slots: torch.Tensor, tags: torch.Tensor) -> None:
    """Subtracts from ``sums`` (T,) int64, per tag t, the keys of tag t with a negative slot."""
    n = slots.numel()
    if n:
        _unstored_kernel[(cdiv(n, _BLOCK),)](sums, slots.contiguous(), tags.contiguous(), n,
                                             BLOCK=_BLOCK)
