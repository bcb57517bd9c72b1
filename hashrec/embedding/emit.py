"""Every feature's output of one storage lookup, with a single backward reduction.

A storage lookup returns its unique rows (U, D) once per step. ``emit_storage``
pools (bag features) or pads (sequence features) those rows for every feature
reading the storage, inside one autograd Function; bag features of one pooling
kind (sequences of one length), laid out next to each other by the dedup, take
one launch. Its backward concatenates
the features' output gradients and sums them per unique row in one pass over
the positions, grouped by the storage's dedup (``StorageBatch.order`` /
``row_start``): no per-feature sort, no per-feature (U, D) gradient for autograd
to add up. The summation order is fixed by the data, so results do not depend
on thread timing.
"""

from __future__ import annotations

import functools
import itertools

import torch

from hashrec.embedding.batching import FeatureIds, StorageBatch, pooling_kind
from hashrec.embedding.ops.pooling import pool_forward, reduce_positions
from hashrec.embedding.ops.positions import gradient_rows
from hashrec.embedding.ops.sequence import gather_padded


def _forward_one(rows: torch.Tensor, f: FeatureIds) -> torch.Tensor:
    if f.spec.is_sequence:
        return gather_padded(rows, f.inverse, f.offsets, f.spec.max_length)
    return pool_forward(rows, f.inverse, f.offsets, f.weights, f.spec.pooling == "mean")


def _run(rows: torch.Tensor, batch: StorageBatch, features: list[FeatureIds],
         start: int, n: int) -> list[torch.Tensor]:
    """Outputs of consecutive features of one kind (bags of one pooling, or sequences of
    one length) in one launch: their n ids are ``batch.inverse[start:start + n]``, so
    their bags are one list."""
    lengths = torch.cat([f.lengths for f in features])
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
    torch.cumsum(lengths, 0, out=offsets[1:])
    first, inverse = features[0], batch.inverse[start:start + n]
    if first.spec.is_sequence:
        out = gather_padded(rows, inverse, offsets, first.spec.max_length)
    else:
        weights = torch.cat([f.weights for f in features]) if first.weights is not None \
            else None
        out = pool_forward(rows, inverse, offsets, weights, first.spec.pooling == "mean")
    return list(out.split([f.lengths.numel() for f in features]))


def _forward_all(rows: torch.Tensor, batch: StorageBatch) -> list[torch.Tensor]:
    """Every feature's output; a run of features of one kind (which ``batch.features``
    keeps next to each other) takes one launch."""
    out, start = [], 0
    for _, run in itertools.groupby(batch.features, key=pooling_kind):
        run = list(run)
        n = sum(f.values.numel() for f in run)
        if len(run) > 1:
            out.extend(_run(rows, batch, run, start, n))
        else:
            out.append(_forward_one(rows, run[0]))
        start += n
    return out


@functools.lru_cache(maxsize=16)
def _bag_rows(shapes: tuple[tuple[int, int], ...], device: torch.device
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per bag of the concatenated features: its first gradient row and whether its ids
    are positions of a sequence. ``shapes`` holds (bags, rows per bag) per feature:
    (B, 1) for a pooled feature, (B, max_length) for a sequence."""
    first, sequence, base = [], [], 0
    for bags, per_bag in shapes:
        first.append(torch.arange(bags, dtype=torch.int64) * per_bag + base)
        sequence.append(torch.full((bags,), int(per_bag > 1), dtype=torch.int64))
        base += bags * per_bag
    return torch.cat(first).to(device), torch.cat(sequence).to(device)


def _gradient_rows(features: list[FeatureIds], device: torch.device
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For every id of the concatenated features: its row in the concatenated output
    gradients, and per bag its index (ids -> bags) and length."""
    shapes = tuple((f.lengths.numel(), f.spec.max_length if f.spec.is_sequence else 1)
                   for f in features)
    first, sequence = _bag_rows(shapes, device)
    lengths = torch.cat([f.lengths for f in features]) if len(features) > 1 \
        else features[0].lengths
    rows, bags = gradient_rows(lengths, first, sequence, sum(f.values.numel() for f in features))
    return rows, bags, lengths


def _position_weights(features: list[FeatureIds], bags: torch.Tensor,
                      lengths: torch.Tensor) -> torch.Tensor:
    """Per id, the factor of its gradient: its weight, over its bag's length for mean."""
    w = torch.ones(bags.numel(), dtype=torch.float32, device=bags.device)
    divisor, start, first_bag = [], 0, 0
    for f in features:
        n, b = f.values.numel(), f.lengths.numel()
        if f.weights is not None and not f.spec.is_sequence:
            w[start:start + n] = f.weights.float()
        mean = f.spec.pooling == "mean" and not f.spec.is_sequence
        divisor.append((first_bag, first_bag + b) if mean else None)
        start, first_bag = start + n, first_bag + b
    if any(d is not None for d in divisor):
        scale = torch.ones(lengths.numel(), dtype=torch.float32, device=bags.device)
        for span in divisor:
            if span is not None:
                scale[span[0]:span[1]] = lengths[span[0]:span[1]].clamp(min=1).float()
        w = w / scale.index_select(0, bags)
    return w


def _weighted(f: FeatureIds) -> bool:
    return not f.spec.is_sequence and (f.weights is not None or f.spec.pooling == "mean")


def reduce_feature_grads(grads: tuple[torch.Tensor, ...], batch: StorageBatch
                         ) -> torch.Tensor:
    """Gradient per unique row (U, D) float32 from every feature's output gradient."""
    features = batch.features
    flat = [g if g.dim() == 2 else g.reshape(-1, g.shape[-1]) for g in grads]
    rows, bags, lengths = _gradient_rows(features, batch.inverse.device)
    weights = _position_weights(features, bags, lengths) \
        if any(_weighted(f) for f in features) else None
    return reduce_positions(torch.cat(flat) if len(flat) > 1 else flat[0], rows,
                            batch.inverse, batch.order, batch.row_start, weights,
                            batch.member_rows)


class _EmitStorage(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, batch):  # noqa: D102
        ctx.batch = batch
        return tuple(_forward_all(rows, batch))

    @staticmethod
    def backward(ctx, *grads):  # noqa: D102
        return reduce_feature_grads(grads, ctx.batch), None


def emit_storage(rows: torch.Tensor, batch: StorageBatch) -> list[torch.Tensor]:
    """Outputs of ``batch.features`` from the storage's unique rows (U, D), in that order.

    A bag feature gives (B, D) float32 (sum or mean, weighted when it has
    weights); a sequence feature gives (B, max_length, D) float32, zero padded.
    """
    if not batch.features:
        return []
    if rows.requires_grad and torch.is_grad_enabled():
        return list(_EmitStorage.apply(rows, batch))
    return _forward_all(rows, batch)
