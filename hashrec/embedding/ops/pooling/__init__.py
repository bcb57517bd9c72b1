"""Bag pooling op: ``pool_forward`` / ``pool_backward`` dispatched by device.

See ``reference.py`` for shapes and semantics; ``triton.py`` (CUDA) has the same
signatures.
"""

from __future__ import annotations

import torch

from hashrec.embedding.ops.pooling import reference
from hashrec.table.ops.dispatch import backend


def pool_forward(rows: torch.Tensor, inverse: torch.Tensor, offsets: torch.Tensor | None,
                 weights: torch.Tensor | None, mean: bool, one_id: bool = False) -> torch.Tensor:
    """Pools bags of rows: -> (B, D) float32. ``one_id``: the caller vouches that every bag
    holds exactly one id (bag b is id b): the kernel then reads no offsets, which may be
    None."""
    impl = backend(__name__, reference, rows.device)
    return impl.pool_forward(rows, inverse, offsets, weights, mean, one_id)


def pool_backward(grad_out: torch.Tensor, inverse: torch.Tensor, offsets: torch.Tensor,
                  weights: torch.Tensor | None, mean: bool, num_rows: int) -> torch.Tensor:
    """Gradient per unique row: (B, D) -> (num_rows, D) float32."""
    impl = backend(__name__, reference, grad_out.device)
    return impl.pool_backward(grad_out, inverse, offsets, weights, mean, num_rows)


def reduce_positions(grads: torch.Tensor, gidx: torch.Tensor, inverse: torch.Tensor,
                     order: torch.Tensor, row_start: torch.Tensor,
                     weights: torch.Tensor | None, groups: list[int] | None = None,
                     sorted_rows: torch.Tensor | None = None, sorted_gidx: bool = False,
                     covered: bool = False) -> torch.Tensor:
    """Gradient per unique row from position gradients: -> (U, D) float32.

    Position ``p`` adds ``grads[gidx[p]]`` (times ``weights[p]``) to row
    ``inverse[p]``; ``order`` / ``row_start`` group the positions by row.
    ``groups``: unique-row bounds [0, ..., U] of storages reduced together, each
    of whose rows must sum exactly as it would alone. ``sorted_rows`` (n,), when
    the caller has it: ``inverse[order]``. ``sorted_gidx``: ``gidx`` and ``weights``
    are given per position of ``order`` (entry q for position ``order[q]``).
    ``covered``: every row has a position (a dedup's grouping): rows without one are
    then undefined instead of zero.
    """
    impl = backend(__name__, reference, grads.device)
    return impl.reduce_positions(grads, gidx, inverse, order, row_start, weights, groups,
                                 sorted_rows, sorted_gidx, covered)


__all__ = ["pool_backward", "pool_forward", "reduce_positions"]
