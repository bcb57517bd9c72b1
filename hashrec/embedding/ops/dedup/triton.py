"""Triton dedup ops with the reference's signatures (see ``reference.py``).

``tag_summary``: one program; every tag's first and last position come from
binary searches of the sorted tags, done for all tags at once, and the counts
and ids are loads at those positions. One launch where the reference takes about
fifteen operators. ``unique_layout``: one pass over the sorted positions writes
the keys, tags and start of every unique key (at its first position) and every
id's inverse, where the reference takes a scatter each and a search.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hashrec.table.ops.launch import cdiv, fast_launch, next_pow2

_BLOCK = 1024


@triton.jit
def _first_at_least(tags_ptr, target, valid, n, steps):
    """Per lane: the first position whose tag is >= ``target`` (n when none is)."""
    lo = tl.zeros(target.shape, dtype=tl.int64)
    hi = tl.zeros(target.shape, dtype=tl.int64) + n
    step = 0
    while step < steps:
        open_ = valid & (lo < hi)
        mid = (lo + hi) // 2
        below = tl.load(tags_ptr + mid, mask=open_, other=0) < target
        lo = tl.where(open_ & below, mid + 1, lo)
        hi = tl.where(open_ & ~below, mid, hi)
        step += 1
    return lo


@triton.jit
def _unique_before(group_ptr, first, valid, n, total):
    """Unique keys before position ``first``."""
    return tl.where(first < n, tl.load(group_ptr + tl.minimum(first, n - 1), mask=valid,
                                       other=0), total)


@fast_launch
@triton.jit
def _summary_kernel(tags_ptr, ids_ptr, group_ptr, bad_ptr, out_ptr, n, num_tags, steps,
                    HAS_BAD: tl.constexpr, TAGS: tl.constexpr):
    t = tl.arange(0, TAGS)
    valid = t < num_tags
    start = _first_at_least(tags_ptr, t, valid, n, steps)
    end = _first_at_least(tags_ptr, t + 1, valid, n, steps)
    total = tl.load(group_ptr + n - 1) + 1
    count = _unique_before(group_ptr, end, valid, n, total) - \
        _unique_before(group_ptr, start, valid, n, total)
    low = tl.load(ids_ptr + tl.minimum(start, n - 1), mask=valid, other=0)
    if HAS_BAD:
        low = tl.where(tl.load(bad_ptr) != 0, -1, low)
    high = tl.load(ids_ptr + tl.maximum(end - 1, 0), mask=valid, other=0)
    tl.store(out_ptr + t, count, mask=valid)
    tl.store(out_ptr + num_tags + t, low, mask=valid)
    tl.store(out_ptr + 2 * num_tags + t, high, mask=valid)


def tag_summary(sorted_tags: torch.Tensor, sorted_ids: torch.Tensor, group: torch.Tensor,
                num_tags: int, bad: torch.Tensor | None = None) -> torch.Tensor:
    """(3, num_tags) int64: unique keys, smallest id, largest id of every tag."""
    n = sorted_tags.numel()
    out = torch.empty(3, num_tags, dtype=torch.int64, device=sorted_tags.device)
    _summary_kernel[(1,)](
        sorted_tags, sorted_ids, group, bad.view(torch.uint8) if bad is not None else group,
        out, n, num_tags, n.bit_length() + 1, HAS_BAD=bad is not None,
        TAGS=next_pow2(max(num_tags, 2)))
    return out


@fast_launch
@triton.jit
def _layout_kernel(group_ptr, order_ptr, ids_ptr, tags_ptr, keys_ptr, out_tags_ptr,
                   inverse_ptr, row_start_ptr, n, HAS_TAGS: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    g = tl.load(group_ptr + i, mask=mask, other=0)
    prev = tl.load(group_ptr + i - 1, mask=mask & (i > 0), other=-1)
    first = mask & (g != prev)
    tl.store(keys_ptr + g, tl.load(ids_ptr + i, mask=first, other=0), mask=first)
    if HAS_TAGS:
        tl.store(out_tags_ptr + g, tl.load(tags_ptr + i, mask=first, other=0), mask=first)
    tl.store(row_start_ptr + g, i, mask=first)
    tl.store(row_start_ptr + g + 1, i + 1, mask=mask & (i == n - 1))
    tl.store(inverse_ptr + tl.load(order_ptr + i, mask=mask, other=0), g, mask=mask)


def unique_layout(group: torch.Tensor, order: torch.Tensor, sorted_ids: torch.Tensor,
                  sorted_tags: torch.Tensor | None, u: int
                  ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """(keys (u,), tags (u,) or None, inverse (n,), row_start (u + 1,))."""
    n, device = group.numel(), group.device
    keys = torch.empty(u, dtype=torch.int64, device=device)
    tags = torch.empty(u, dtype=torch.int32, device=device) if sorted_tags is not None \
        else None
    inverse = torch.empty(n, dtype=torch.int64, device=device)
    row_start = torch.empty(u + 1, dtype=torch.int64, device=device)
    if n == 0:
        row_start.zero_()
        return keys, tags, inverse, row_start
    _layout_kernel[(cdiv(n, _BLOCK),)](
        group, order, sorted_ids, sorted_tags if sorted_tags is not None else group, keys,
        tags if tags is not None else keys, inverse, row_start, n,
        HAS_TAGS=sorted_tags is not None, BLOCK=_BLOCK)
    return keys, tags, inverse, row_start
