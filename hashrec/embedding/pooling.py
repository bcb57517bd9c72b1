"""Autograd wrappers of the pooling and sequence ops.

Both take the unique rows of one storage lookup (U, D) and index them by
``inverse``; their backward reduces gradients per unique row, so the storage's
update sees one gradient row per unique key.
"""

from __future__ import annotations

import torch

from hashrec.embedding.ops.pooling import pool_backward, pool_forward
from hashrec.embedding.ops.sequence import gather_padded, gather_padded_backward


class _PoolBags(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, inverse, offsets, weights, mean):  # noqa: D102
        ctx.save_for_backward(inverse, offsets, weights)
        ctx.mean, ctx.num_rows = mean, rows.shape[0]
        return pool_forward(rows, inverse, offsets, weights, mean)

    @staticmethod
    def backward(ctx, grad_out):  # noqa: D102
        inverse, offsets, weights = ctx.saved_tensors
        grad = pool_backward(grad_out.contiguous(), inverse, offsets, weights, ctx.mean,
                             ctx.num_rows)
        return grad, None, None, None, None


class _GatherPadded(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, inverse, offsets, max_length):  # noqa: D102
        ctx.save_for_backward(inverse, offsets)
        ctx.num_rows = rows.shape[0]
        return gather_padded(rows, inverse, offsets, max_length)

    @staticmethod
    def backward(ctx, grad_out):  # noqa: D102
        inverse, offsets = ctx.saved_tensors
        grad = gather_padded_backward(grad_out.contiguous(), inverse, offsets, ctx.num_rows)
        return grad, None, None, None


def pool_bags(rows: torch.Tensor, inverse: torch.Tensor, offsets: torch.Tensor,
              weights: torch.Tensor | None = None, mean: bool = False) -> torch.Tensor:
    """Pools B bags of rows: rows (U, D), inverse (n,), offsets (B + 1,) -> (B, D) float32.

    ``weights`` (n,) scale each id; ``mean`` divides by the bag length; an empty bag
    gives zeros.
    """
    return _PoolBags.apply(rows, inverse, offsets, weights, mean)


def gather_sequences(rows: torch.Tensor, inverse: torch.Tensor, offsets: torch.Tensor,
                     max_length: int) -> torch.Tensor:
    """Pads B sequences (each <= max_length long): -> (B, max_length, D) float32, zeros after."""
    return _GatherPadded.apply(rows, inverse, offsets, max_length)
