"""Reference dedup ops in torch operators (the CPU path and the test oracle)."""

from __future__ import annotations

import torch


def tag_summary(sorted_tags: torch.Tensor, sorted_ids: torch.Tensor, group: torch.Tensor,
                num_tags: int, bad: torch.Tensor | None = None) -> torch.Tensor:
    """Per tag of a batch sorted by (tag, id): its unique keys, smallest and largest id.

    Args:
        sorted_tags: (n,) int32 tags, ascending, n >= 1.
        sorted_ids: (n,) int64 ids, ascending within a tag.
        group: (n,) int64 index of each position's unique (tag, id), ascending from 0.
        num_tags: tags 0 .. num_tags - 1 (a tag may have no ids).
        bad: 0-d bool; when True every smallest id reads -1.

    Returns:
        (3, num_tags) int64: unique keys, smallest id, largest id. A tag without ids
        has 0 unique keys and ids of its neighbours (meaningless).
    """
    n = sorted_tags.numel()
    total = group[-1:] + 1
    bounds = torch.arange(num_tags + 1, dtype=sorted_tags.dtype, device=sorted_tags.device)
    first = torch.searchsorted(sorted_tags, bounds)
    before = torch.where(first < n, group[first.clamp(max=n - 1)], total)
    low = sorted_ids[first[:-1].clamp(max=n - 1)]
    if bad is not None:
        low = torch.where(bad, -1, low)
    high = sorted_ids[(first[1:] - 1).clamp(min=0)]
    return torch.stack([before[1:] - before[:-1], low, high])


def unique_layout(group: torch.Tensor, order: torch.Tensor, sorted_ids: torch.Tensor,
                  sorted_tags: torch.Tensor | None, u: int
                  ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """The unique keys of a sorted batch and the maps between them and its ids.

    Args:
        group: (n,) int64 index of each sorted position's unique key, 0 .. u - 1, each
            value present, ascending.
        order: (n,) int64 original position of each sorted position.
        sorted_ids, sorted_tags: (n,) int64 ids and (n,) int32 tags (or None) in
            sorted order.
        u: number of unique keys.

    Returns:
        keys (u,) int64, tags (u,) int32 or None, inverse (n,) int64 (the unique key
        of every original position), row_start (u + 1,) int64 (the first sorted
        position of every unique key, then n).
    """
    device = group.device
    keys = torch.empty(u, dtype=torch.int64, device=device).scatter_(0, group, sorted_ids)
    tags = None
    if sorted_tags is not None:
        tags = torch.empty(u, dtype=torch.int32, device=device).scatter_(0, group, sorted_tags)
    row_start = torch.searchsorted(group, torch.arange(u + 1, device=device))
    inverse = torch.empty(group.numel(), dtype=torch.int64, device=device).scatter_(
        0, order, group)
    return keys, tags, inverse, row_start
