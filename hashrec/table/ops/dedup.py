"""Deduplication in fixed sizes for the Triton table's write calls: ``unique_pairs_fixed``.

``HashTable.find_or_insert`` / ``insert_or_assign`` on the fixed-size path deduplicate
their batch without reading the unique count back on the host (``unique.unique_pairs``,
torch's unique, does: a sync in every call). The outputs keep the batch's length, the
unique pairs first and padding after, and the count stays on the device. After the
sort, two launches and a cumulative sum do it: one marks where each (key, tag) pair
starts in sorted order, one scatters the pairs, each batch key's unique place, and each
pair's count and last batch position (integer atomics, whose sums and maxima do not
depend on thread timing). The same in PyTorch took sixteen operations, each tens of
microseconds of host time on a GPU host, where these calls are bound by the host.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from hashrec.table.ops.launch import aligned_rows, cdiv, fast_launch
from hashrec.table.unique import sort_pairs

__all__ = ["FixedUnique", "unique_pairs_fixed"]


class FixedUnique(NamedTuple):
    """``unique_pairs_fixed``'s outcome for a batch of n keys, every tensor (n,) on the
    batch's device: the first ``count`` ((1,) int64) places hold the unique (key, tag)
    pairs in (key, tag) order, the others are padding (key 0, tag 0, count 0)."""

    keys: torch.Tensor
    tags: torch.Tensor | None
    inverse: torch.Tensor  # the unique place of each batch key
    counts: torch.Tensor  # occurrences of each unique pair
    last: torch.Tensor  # batch position of each unique pair's last occurrence
    count: torch.Tensor


_BLOCK = 1024


@fast_launch
@triton.jit(do_not_specialize=["n"])
def _starts_kernel(skeys, stags, new_ptr, n, HAS_TAGS: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    before = mask & (i > 0)
    new = tl.load(skeys + i, mask=mask, other=0) != tl.load(skeys + i - 1, mask=before, other=0)
    if HAS_TAGS:
        new = new | (tl.load(stags + i, mask=mask, other=0)
                     != tl.load(stags + i - 1, mask=before, other=0))
    tl.store(new_ptr + i, (new | (i == 0)).to(tl.int32), mask=mask)


@fast_launch
@triton.jit(do_not_specialize=["n"])
def _scatter_kernel(skeys, stags, order_ptr, new_ptr, group_ptr, unique_ptr, utags_ptr,
                    inverse_ptr, counts_ptr, last_ptr, count_ptr, n, HAS_TAGS: tl.constexpr,
                    BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    g = tl.load(group_ptr + i, mask=mask, other=1) - 1  # the cumulative sum counts from 1
    at = tl.load(order_ptr + i, mask=mask, other=0)
    tl.store(inverse_ptr + at, g, mask=mask)
    tl.atomic_add(counts_ptr + g, tl.full([BLOCK], 1, tl.int64), mask=mask)
    tl.atomic_max(last_ptr + g, at, mask=mask)
    first = mask & (tl.load(new_ptr + i, mask=mask, other=0) != 0)
    tl.store(unique_ptr + g, tl.load(skeys + i, mask=first, other=0), mask=first)
    if HAS_TAGS:
        tl.store(utags_ptr + g, tl.load(stags + i, mask=first, other=0), mask=first)
    tl.store(count_ptr + i * 0, g + 1, mask=i == n - 1)


def unique_pairs_fixed(keys: torch.Tensor, tags: torch.Tensor | None) -> FixedUnique:
    """``unique.unique_pairs`` of keys (n,) int64 and tags (n,) int32 | None in fixed
    sizes (``FixedUnique``), with each pair's last batch position; no host read."""
    n = keys.numel()
    if tags is None:
        skeys, order = torch.sort(keys, stable=True)
        stags = None
    else:
        order, skeys, stags = sort_pairs(keys, tags)
    if n == 0:
        empty = torch.zeros(0, dtype=torch.int64, device=keys.device)
        return FixedUnique(keys.clone(), None if tags is None else tags.clone(), empty, empty,
                           empty, torch.zeros(1, dtype=torch.int64, device=keys.device))
    grid = (cdiv(n, _BLOCK),)
    new = torch.empty(n, dtype=torch.int32, device=keys.device)
    _starts_kernel[grid](skeys, stags if stags is not None else skeys, new, n,
                         HAS_TAGS=tags is not None, BLOCK=_BLOCK)
    group = torch.cumsum(new, 0)
    # unique keys, counts and last positions start at 0 (the padding stays so); the
    # inverse is written whole.
    unique, counts, last = aligned_rows(3, n, torch.int64, keys.device).zero_().unbind(0)
    utags = None if tags is None else torch.zeros_like(tags)
    inverse = torch.empty(n, dtype=torch.int64, device=keys.device)
    count = torch.empty(1, dtype=torch.int64, device=keys.device)
    _scatter_kernel[grid](skeys, stags if stags is not None else skeys, order, new, group,
                          unique, utags if utags is not None else unique, inverse, counts,
                          last, count, n, HAS_TAGS=tags is not None, BLOCK=_BLOCK)
    return FixedUnique(unique, utags, inverse, counts, last, count)
