"""Every feature's output of one storage lookup, with a single backward reduction.

A storage lookup returns its unique rows (U, D) once per step. ``emit_storage``
pools (bag features) or pads (sequence features) those rows for every feature
reading the storage, inside one autograd Function. Its backward concatenates
the features' output gradients and sums them per unique row in one pass over
the positions, grouped by the storage's dedup (``StorageBatch.order`` /
``row_start``): no per-feature sort, no per-feature (U, D) gradient for autograd
to add up. The summation order is fixed by the data, so results do not depend
on thread timing.
"""

from __future__ import annotations

import torch

from hashrec.embedding.batching import FeatureIds, StorageBatch
from hashrec.embedding.ops.fused.dedup import bag_of_positions
from hashrec.embedding.ops.pooling import pool_forward, reduce_positions
from hashrec.embedding.ops.sequence import gather_padded


def _forward_one(rows: torch.Tensor, f: FeatureIds) -> torch.Tensor:
    if f.spec.is_sequence:
        return gather_padded(rows, f.inverse, f.offsets, f.spec.max_length)
    return pool_forward(rows, f.inverse, f.offsets, f.weights, f.spec.pooling == "mean")


def _position_weights(f: FeatureIds, bags: torch.Tensor) -> torch.Tensor:
    """Per-id factor of a bag feature's gradient: its weight, over the bag length for mean."""
    w = f.weights.float() if f.weights is not None else \
        torch.ones(bags.numel(), dtype=torch.float32, device=bags.device)
    if f.spec.pooling == "mean" and not f.spec.is_sequence:
        w = w / f.lengths.index_select(0, bags).clamp(min=1).float()
    return w


def _weighted(f: FeatureIds) -> bool:
    return not f.spec.is_sequence and (f.weights is not None or f.spec.pooling == "mean")


def reduce_feature_grads(grads: tuple[torch.Tensor, ...], batch: StorageBatch,
                         num_rows: int) -> torch.Tensor:
    """Gradient per unique row (U, D) float32 from every feature's output gradient."""
    flat, gidx, weights, base = [], [], [], 0
    any_weights = any(_weighted(f) for f in batch.features)
    for f, grad in zip(batch.features, grads):
        n = f.values.numel()
        bags = bag_of_positions(f.offsets, n)
        if f.spec.is_sequence:
            length = f.spec.max_length
            col = torch.arange(n, device=bags.device) - f.offsets[:-1].index_select(0, bags)
            gidx.append(bags * length + col + base)
            grad = grad.reshape(-1, grad.shape[-1])
        else:
            gidx.append(bags + base)
        if any_weights:
            weights.append(_position_weights(f, bags))
        flat.append(grad)
        base += grad.shape[0]
    return reduce_positions(
        torch.cat(flat) if len(flat) > 1 else flat[0],
        torch.cat(gidx) if len(gidx) > 1 else gidx[0], batch.inverse, batch.order,
        batch.row_start, torch.cat(weights) if any_weights else None)


class _EmitStorage(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, batch):  # noqa: D102
        ctx.batch, ctx.num_rows = batch, rows.shape[0]
        return tuple(_forward_one(rows, f) for f in batch.features)

    @staticmethod
    def backward(ctx, *grads):  # noqa: D102
        return reduce_feature_grads(grads, ctx.batch, ctx.num_rows), None


def emit_storage(rows: torch.Tensor, batch: StorageBatch) -> list[torch.Tensor]:
    """Outputs of ``batch.features`` from the storage's unique rows (U, D), in that order.

    A bag feature gives (B, D) float32 (sum or mean, weighted when it has
    weights); a sequence feature gives (B, max_length, D) float32, zero padded.
    """
    if not batch.features:
        return []
    if rows.requires_grad and torch.is_grad_enabled():
        return list(_EmitStorage.apply(rows, batch))
    return [_forward_one(rows, f) for f in batch.features]
