"""Reference dedup ops in torch operators (the CPU path and the test oracle)."""

from __future__ import annotations

import torch


def tag_summary(sorted_tags: torch.Tensor, sorted_ids: torch.Tensor, group: torch.Tensor,
                num_tags: int, bad: torch.Tensor | None = None,
                starts: torch.Tensor | None = None) -> torch.Tensor:
    """Per tag of a batch sorted by (tag, id): its unique keys, smallest and largest id.

    Args:
        sorted_tags: (n,) int32 tags, ascending, n >= 1.
        sorted_ids: (n,) int64 ids, ascending within a tag.
        group: (n,) int64 index of each position's unique (tag, id), ascending from 0.
        num_tags: tags 0 .. num_tags - 1 (a tag may have no ids).
        bad: 0-d bool; when True every smallest id reads -1.
        starts: (num_tags + 1,) int64, the first position of every tag (``mark_sorted``
            with ``num_tags``), or None: found here.

    Returns:
        (3, num_tags) int64: unique keys, smallest id, largest id. A tag without ids
        has 0 unique keys and ids of its neighbours (meaningless).
    """
    n = sorted_tags.numel()
    total = group[-1:] + 1
    bounds = torch.arange(num_tags + 1, dtype=sorted_tags.dtype, device=sorted_tags.device)
    first = torch.searchsorted(sorted_tags, bounds) if starts is None else starts
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


def padded_keys(ids: torch.Tensor, meta: torch.Tensor, num_tags: int, bits: int,
                clamp: bool, compact: bool, features: int | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """One-pass sort keys of a padded batch (``hashrec.embedding.dedup_graphs``).

    Args:
        ids: (N,) int64 ids of every feature one after the other, then padding (any
            values).
        meta: (2 F,) int64: each feature's end in ``ids`` (the last is the real count
            n), then each feature's ``tag << bits``.
        num_tags: logical tables; a padding position's key is ``num_tags << bits``.
        bits: id bits below the tag.
        clamp: ids outside [0, 2 ** bits) are clamped into it (row ids of dense tables).
        compact: the keys are returned as int32 (the caller vouches that every valid
            key fits 31 bits; others wrap and are flagged by ``bad`` anyway).
        features: F, when ``meta`` is (3 F,) with every feature's ids' address after
            the tags, to be read there instead of ``ids`` (which then only sets N):
            the Triton kernel alone does, on the device that holds them.

    Returns:
        keys (N,) int64 (int32 when ``compact``), and a 0-d bool: some real id has bits
        above ``bits`` (negative ids included).
    """
    if features is not None:
        raise NotImplementedError("the reference reads ids from the tensor, not addresses")
    size, features = ids.numel(), meta.numel() // 2
    ends, shifted = meta[:features], meta[features:]
    position = torch.arange(size, device=ids.device)
    real = position < ends[-1]
    feature = torch.searchsorted(ends, position, right=True)
    pad = torch.full((1,), num_tags << bits, dtype=torch.int64, device=ids.device)
    mask = (1 << bits) - 1
    bad = ((ids >> bits) != 0).logical_and_(real).any()
    lows = ids.clamp(0, mask) if clamp else ids
    keys = torch.where(real, lows, 0) + torch.cat([shifted, pad])[feature]
    return (keys.to(torch.int32) if compact else keys), bad


def mark_sorted(keys: torch.Tensor, bits: int, num_tags: int | None = None
                ) -> tuple[torch.Tensor, ...]:
    """Splits sorted one-pass keys (N,) (int64, or int32) into their parts.

    Returns:
        sorted_ids (N,) int64 (the low ``bits``), sorted_tags (N,) int32 (the rest),
        new (N,) bool (a position whose key differs from the one before; position 0
        is new), and group (N,) int64: every position's unique key, numbered from 0
        (the cumulative sum of ``new`` less one). With ``num_tags``,
        also starts (num_tags + 1,) int64: the first position whose tag is at least
        0, 1, .. num_tags (N where none is), for ``tag_summary``.
    """
    wide = keys.to(torch.int64)
    new = torch.ones(keys.numel(), dtype=torch.bool, device=keys.device)
    torch.ne(wide[1:], wide[:-1], out=new[1:])
    group = torch.cumsum(new, 0) - 1
    tags = (wide >> bits).to(torch.int32)
    if num_tags is None:
        return wide & ((1 << bits) - 1), tags, new, group
    bounds = torch.arange(num_tags + 1, dtype=torch.int32, device=keys.device)
    return wide & ((1 << bits) - 1), tags, new, group, torch.searchsorted(tags, bounds)
