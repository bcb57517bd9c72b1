"""Triton bag pooling with the reference's signatures (see ``reference.py``).

The backward groups positions by row once (stable sort of ``inverse``) and sums
each row's gradients in that fixed order: deterministic, no atomics.
"""

from __future__ import annotations

import torch

from hashrec.embedding.ops.fused.dedup import bag_of_positions, group_positions
from hashrec.embedding.ops.fused.triton import pool_rows, reduce_rows


def pool_forward(rows: torch.Tensor, inverse: torch.Tensor, offsets: torch.Tensor | None,
                 weights: torch.Tensor | None, mean: bool, one_id: bool = False) -> torch.Tensor:
    """Pools bags: -> (B, D) float32 sums (or means) of their rows."""
    return pool_rows(rows, inverse, offsets, weights, mean, one_id=one_id)


def pool_backward(grad_out: torch.Tensor, inverse: torch.Tensor, offsets: torch.Tensor,
                  weights: torch.Tensor | None, mean: bool, num_rows: int) -> torch.Tensor:
    """Gradient of ``pool_forward`` w.r.t. ``rows``: (B, D) -> (U, D) float32, summed per row."""
    order, row_start = group_positions(inverse, num_rows)
    bags = bag_of_positions(offsets, inverse.numel())
    return reduce_rows(grad_out, bags, order, row_start, weights, offsets if mean else None)


def reduce_positions(grads: torch.Tensor, gidx: torch.Tensor, inverse: torch.Tensor,
                     order: torch.Tensor, row_start: torch.Tensor,
                     weights: torch.Tensor | None, groups: list[int] | None = None,
                     sorted_rows: torch.Tensor | None = None, sorted_gidx: bool = False,
                     covered: bool = False) -> torch.Tensor:
    """Sums position gradients per unique row in a fixed order: -> (U, D) float32; each
    of ``groups`` (unique-row bounds) exactly as on its own."""
    # The row of each position in ``order``: one gather instead of rebuilding it from
    # ``row_start`` (a repeat_interleave and four more ops), when the caller lacks it.
    if sorted_rows is None:
        sorted_rows = inverse.index_select(0, order)
    return reduce_rows(grads.float(), gidx, order, row_start, weights,
                       sorted_rows=sorted_rows, groups=groups, sorted_gidx=sorted_gidx,
                       covered=covered)
