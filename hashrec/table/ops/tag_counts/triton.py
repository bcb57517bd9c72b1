"""Triton per-tag counts of flagged keys with the reference's signature (see
``reference.py``).

One launch where the reference takes four: each program counts its block's flagged keys
tag by tag, from its smallest tag to its largest, and adds each nonzero count to the
sums with one atomic (integer sums: the result does not depend on their order). Adding
every key into T counters instead (``index_add_``) makes each key's atomic wait on its
tag's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hashrec.table.ops.launch import cdiv, fast_launch
from hashrec.table.ops.tag_counts.reference import check_by_tag_args

_BLOCK = 1024


@triton.jit
def _add_count(sums_ptr, flags, at):
    count = tl.sum(flags.to(tl.int64), axis=0)
    if count > 0:
        tl.atomic_add(sums_ptr + at, count, sem="relaxed")


@fast_launch
@triton.jit(do_not_specialize=["n"])
def _by_tag_kernel(sums_ptr, tags_ptr, m0, m1, n, last, K: tl.constexpr,
                   BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = i < n
    tag = tl.load(tags_ptr + i, mask=live, other=0)
    tag = tl.where((tag >= 0) & (tag < last), tag, last)  # other tags: column ``last``
    a = live & (tl.load(m0 + i, mask=live, other=0) != 0)
    b = a
    if K > 1:
        b = live & (tl.load(m1 + i, mask=live, other=0) != 0)
    t = tl.min(tl.where(live, tag, last), axis=0)
    top = tl.max(tl.where(live, tag, 0), axis=0)
    while t <= top:
        here = tag == t
        _add_count(sums_ptr, a & here, t)
        if K > 1:
            _add_count(sums_ptr, b & here, last + 1 + t)
        t += 1


def add_by_tag(sums: torch.Tensor, tags: torch.Tensor, masks: list[torch.Tensor]) -> None:
    """Adds to ``sums[k, t]``, per tag t, the keys of tag t that ``masks[k]`` flags."""
    check_by_tag_args(sums, tags, masks)
    n = tags.numel()
    if n:
        views = [m.contiguous().view(torch.int8) for m in masks]
        _by_tag_kernel[(cdiv(n, _BLOCK),)](sums, tags.contiguous(), views[0], views[-1], n,
                                           sums.shape[1] - 1, K=len(masks), BLOCK=_BLOCK)
