"""Reference ``tag_summary`` in torch operators (the CPU path and the test oracle)."""

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
