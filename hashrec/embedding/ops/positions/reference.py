"""Gradient rows of bag positions in PyTorch (the CPU path and the kernel's oracle)."""

from __future__ import annotations

import torch


def gradient_rows(lengths: torch.Tensor, first: torch.Tensor, sequence: torch.Tensor,
                  n: int, order: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Row of each id's output gradient, and its bag, for bags laid end to end.

    Args:
        lengths: (L,) int64 ids per bag; the n = sum(lengths) ids follow bag by bag.
        first: (L,) int64 output-gradient row of each bag's first id.
        sequence: (L,) int64 rows between a bag's consecutive ids: where they have a row each
            (a sequence, ``first + position in the bag * sequence``), else 0 (pooled: they
            share ``first``).
        n: number of ids (the host knows it).
        order: (n,) int64 ids in the order to return them (say, grouped by unique key),
            or None: id by id.

    Returns:
        (rows (n,) int64, bags (n,) int64), entry q for id q (``order[q]``).
    """
    bags = torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device),
                                   lengths, output_size=n)
    starts = torch.cumsum(lengths, 0) - lengths
    col = torch.arange(n, device=lengths.device) - starts.index_select(0, bags)
    rows = first.index_select(0, bags) + col * sequence.index_select(0, bags)
    if order is not None:
        return rows.index_select(0, order), bags.index_select(0, order)
    return rows, bags
