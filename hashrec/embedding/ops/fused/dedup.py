"""Deduplication that also yields the CSR grouping the backward reduction needs."""

from __future__ import annotations

from typing import NamedTuple

import torch


class Dedup(NamedTuple):
    """Unique ids of a batch and how the batch maps onto them.

    Attributes:
        unique: (u,) int64 unique ids, ascending.
        inverse: (n,) int64 index into ``unique`` of each id.
        order: (n,) int64 positions of the batch grouped by unique id (stable).
        row_start: (u + 1,) int64; positions ``order[row_start[r]:row_start[r + 1]]``
            hold unique id ``r``.
    """

    unique: torch.Tensor
    inverse: torch.Tensor
    order: torch.Tensor
    row_start: torch.Tensor


def dedup(ids: torch.Tensor) -> Dedup:
    """Deduplicates ids (n,) int64 with one stable sort: -> Dedup."""
    if ids.dtype != torch.int64 or ids.dim() != 1:
        raise ValueError(f"ids must be a 1-D int64 tensor, got {ids.dtype} {tuple(ids.shape)}")
    sorted_ids, order = torch.sort(ids, stable=True)
    unique, counts = torch.unique_consecutive(sorted_ids, return_counts=True)
    row_start = torch.zeros(unique.numel() + 1, dtype=torch.int64, device=ids.device)
    torch.cumsum(counts, 0, out=row_start[1:])
    group = torch.repeat_interleave(torch.arange(unique.numel(), device=ids.device), counts,
                                    output_size=ids.numel())
    inverse = torch.empty_like(order).scatter_(0, order, group)
    return Dedup(unique, inverse, order, row_start)


def group_positions(inverse: torch.Tensor, num_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR grouping of positions by row: inverse (n,) -> (order (n,), row_start (U + 1,))."""
    order = torch.argsort(inverse, stable=True)
    row_start = torch.zeros(num_rows + 1, dtype=torch.int64, device=inverse.device)
    torch.cumsum(torch.bincount(inverse, minlength=num_rows), 0, out=row_start[1:])
    return order, row_start


def bag_of_positions(offsets: torch.Tensor, n: int) -> torch.Tensor:
    """Bag index of each of the n positions delimited by offsets (B + 1,): -> (n,) int64."""
    lengths = offsets[1:] - offsets[:-1]
    bags = torch.arange(lengths.numel(), device=offsets.device)
    return torch.repeat_interleave(bags, lengths, output_size=n)
