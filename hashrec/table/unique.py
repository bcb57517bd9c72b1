"""Deduplication of (key, tag) identities for the table's batch entry points."""

from __future__ import annotations

import torch


def sort_pairs(keys: torch.Tensor, tags: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(order, sorted keys, sorted tags): (key, tag) pairs sorted by key, then tag, with
    two stable 1-D sorts (tag, then key) instead of a row-wise sort."""
    order = torch.sort(tags, stable=True).indices
    order = order.index_select(0, torch.sort(keys.index_select(0, order), stable=True).indices)
    return order, keys.index_select(0, order), tags.index_select(0, order)


def unique_pairs(keys: torch.Tensor, tags: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """(unique keys, their tags | None, inverse (n,), counts) over (key, tag) identities.

    The unique pairs come out in (key, tag) order. Without tags this is a 1-D unique
    of the keys; with tags the pairs are sorted with two stable 1-D sorts (tag, then
    key) instead of a row-wise ``unique(dim=0)``. Either way the output size is read
    on the host once (testing first whether all tags are equal would be a second read).
    """
    if tags is None:
        unique, inverse, counts = torch.unique(keys, return_inverse=True, return_counts=True)
        return unique, None, inverse, counts
    if keys.numel() == 0:
        empty = keys.new_empty(0)
        return keys.clone(), tags.clone(), empty, empty
    order, skeys, stags = sort_pairs(keys, tags)
    new = torch.ones_like(skeys, dtype=torch.bool)
    new[1:] = (skeys[1:] != skeys[:-1]) | (stags[1:] != stags[:-1])
    group = torch.cumsum(new, 0) - 1
    first = torch.nonzero(new).flatten()
    counts = torch.diff(first, append=first.new_tensor([keys.numel()]))
    inverse = torch.empty_like(group).index_copy_(0, order, group)
    return skeys.index_select(0, first), stags.index_select(0, first), inverse, counts

