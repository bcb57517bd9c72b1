"""Every feature's output of one storage lookup, with a single backward reduction.

A storage lookup returns its unique rows (U, D) once per step. ``emit_storage``
pools (bag features) or pads (sequence features) those rows for every feature
reading the storage, inside one autograd Function; bag features of one pooling
kind (sequences of one length), laid out next to each other by the dedup, take
one launch. Its backward sums the features' output gradients per unique row in
one pass over the positions (reading them where they lie when they share one
buffer, as slices of the gradient of the outputs' concatenation do; else from
their concatenation), grouped by the storage's dedup (``StorageBatch.order`` /
``row_start``): no per-feature sort, no per-feature (U, D) gradient for autograd
to add up. The summation order is fixed by the data, so results do not depend
on thread timing.

With ``TableRows`` (a lookup that left stored rows out: ``lookup_rows``), bag
features read each id's row from the table by slot, and from the lookup's rows only
where the slot is -1: one pass over the rows instead of a copy and a pass.
"""

from __future__ import annotations

import functools
import itertools
from typing import NamedTuple

import torch

from hashrec.embedding.batching import FeatureIds, StorageBatch, pooling_kind
from hashrec.embedding.ops.pooling import pool_forward, reduce_positions
from hashrec.embedding.ops.positions import gradient_rows
from hashrec.embedding.ops.sequence import gather_padded


class TableRows(NamedTuple):
    """Where bag features read stored rows: the table's ``values`` (R, row_dim), its
    first ``dim`` columns the embedding, at each unique id's ``slots`` (U,) entry."""

    values: torch.Tensor
    slots: torch.Tensor


def _pool(rows: torch.Tensor, inverse: torch.Tensor, offsets: torch.Tensor | None,
          weights: torch.Tensor | None, mean: bool, table: TableRows | None,
          one_id: bool) -> torch.Tensor:
    if table is None:
        return pool_forward(rows, inverse, offsets, weights, mean, one_id)
    from hashrec.embedding.ops.fused.triton import pool_rows_with_fallback  # Triton only

    return pool_rows_with_fallback(table.values, inverse, offsets, weights, mean, table.slots,
                                   rows, dim=rows.shape[1], one_id=one_id)


def _one_id(f: FeatureIds) -> bool:
    """Every bag holds exactly one id: the host knows none holds more, and there are as
    many ids as bags."""
    return f.max_bag is not None and f.max_bag <= 1 and f.values.numel() == f.lengths.numel()


def _forward_one(rows: torch.Tensor, f: FeatureIds, table: TableRows | None) -> torch.Tensor:
    if f.spec.is_sequence:
        return gather_padded(rows, f.inverse, f.offsets, f.spec.max_length)
    return _pool(rows, f.inverse, f.offsets, f.weights, f.spec.pooling == "mean", table,
                 _one_id(f))


def _run(rows: torch.Tensor, batch: StorageBatch, features: list[FeatureIds],
         start: int, n: int, table: TableRows | None) -> list[torch.Tensor]:
    """Outputs of consecutive features of one kind (bags of one pooling, or sequences of
    one length) in one launch: their n ids are ``batch.inverse[start:start + n]``, so
    their bags are one list."""
    first, inverse = features[0], batch.inverse[start:start + n]
    one_id = not first.spec.is_sequence and all(_one_id(f) for f in features)
    offsets = None
    if not one_id:  # bags of one id each need no offsets
        lengths = torch.cat([f.lengths for f in features])
        offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
        torch.cumsum(lengths, 0, out=offsets[1:])
    if first.spec.is_sequence:
        out = gather_padded(rows, inverse, offsets, first.spec.max_length)
    else:
        weights = torch.cat([f.weights for f in features]) if first.weights is not None \
            else None
        out = _pool(rows, inverse, offsets, weights, first.spec.pooling == "mean", table,
                    one_id)
    return list(out.split([f.lengths.numel() for f in features]))


def _forward_all(rows: torch.Tensor, batch: StorageBatch, table: TableRows | None
                 ) -> list[torch.Tensor]:
    """Every feature's output; a run of features of one kind (which ``batch.features``
    keeps next to each other) takes one launch."""
    out, start = [], 0
    for _, run in itertools.groupby(batch.features, key=pooling_kind):
        run = list(run)
        n = sum(f.values.numel() for f in run)
        if len(run) > 1:
            out.extend(_run(rows, batch, run, start, n, table))
        else:
            out.append(_forward_one(rows, run[0], table))
        start += n
    return out


@functools.lru_cache(maxsize=16)
def _bag_rows(layout: tuple[tuple[int, int, int, int], ...], device: torch.device
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per bag of the features: its first gradient row and the rows between its
    consecutive ids. ``layout`` holds per feature (bags, first row, rows per bag, rows
    per id): the last is 0 for a pooled feature (its ids share their bag's row)."""
    first = [torch.arange(bags, dtype=torch.int64) * per_bag + row
             for bags, row, per_bag, _ in layout]
    step = [torch.full((bags,), per_id, dtype=torch.int64) for bags, _, _, per_id in layout]
    return torch.cat(first).to(device), torch.cat(step).to(device)


def _concatenated_layout(features: list[FeatureIds]) -> tuple[tuple[int, int, int, int], ...]:
    """``_bag_rows``' layout of the output gradients concatenated feature by feature:
    (B, D) for a pooled feature, (B * max_length, D) for a sequence."""
    layout, row = [], 0
    for f in features:
        per_bag = f.spec.max_length if f.spec.is_sequence else 1
        layout.append((f.lengths.numel(), row, per_bag, int(f.spec.is_sequence)))
        row += f.lengths.numel() * per_bag
    return tuple(layout)


def _shared_rows(grads: tuple[torch.Tensor, ...]
                 ) -> tuple[torch.Tensor, tuple[tuple[int, int, int, int], ...]] | None:
    """The float32 output gradients as rows of one (R, D) view of the storage they all lie in,
    and their ``_bag_rows`` layout in it, when they do (say, slices of the gradient of
    the features' concatenation); else None. The reduction then reads them in place
    instead of from a concatenated copy."""
    first = grads[0]
    dim = first.shape[-1]
    storage = first.untyped_storage()
    rows = storage.nbytes() // first.element_size() // dim
    layout = []
    for g in grads:
        # Unit dims may carry any stride; every other one must step whole rows forward
        # (an expanded gradient, stride 0, is materialized by the concatenation instead).
        strides = [st if size > 1 else None for size, st in zip(g.shape, g.stride())]
        if g.dtype != torch.float32 or g.shape[-1] != dim or strides[-1] not in (None, 1) or \
                g.untyped_storage().data_ptr() != storage.data_ptr() or \
                any(st is not None and (st <= 0 or st % dim) for st in strides[:-1]) or \
                g.storage_offset() % dim:
            return None
        steps = [0 if st is None else st // dim for st in strides[:-1]]
        last = g.storage_offset() // dim + sum((size - 1) * step
                                               for size, step in zip(g.shape[:-1], steps))
        if last >= rows:
            return None
        layout.append((g.shape[0], g.storage_offset() // dim, steps[0],
                       steps[1] if g.dim() == 3 else 0))
    return torch.as_strided(first, (rows, dim), (dim, 1), 0), tuple(layout)


def _gradient_rows(features: list[FeatureIds], device: torch.device,
                   layout: tuple[tuple[int, int, int, int], ...],
                   order: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For every id of the features (of ``order``'s entries, when given): its output
    gradient's row (``_bag_rows``' layout), and per bag its index (ids -> bags) and
    length."""
    first, sequence = _bag_rows(layout, device)
    lengths = torch.cat([f.lengths for f in features]) if len(features) > 1 \
        else features[0].lengths
    rows, bags = gradient_rows(lengths, first, sequence, sum(f.values.numel() for f in features),
                               order)
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


def _rows_are_positions(features: list[FeatureIds],
                        layout: tuple[tuple[int, int, int, int], ...]) -> bool:
    """Whether id p's gradient row is row p: every feature pools bags of exactly one id
    (the host knows its longest bag is one id long, and it has as many ids as bags) whose
    gradient rows follow one another from the feature's first id on."""
    start = 0
    for f, (bags, first, per_bag, per_id) in zip(features, layout):
        n = f.values.numel()
        if f.spec.is_sequence or per_id or n != bags or first != start or \
                (n and (per_bag != 1 or not _one_id(f))):
            return False
        start += n
    return True


def reduce_feature_grads(grads: tuple[torch.Tensor, ...], batch: StorageBatch
                         ) -> torch.Tensor:
    """Gradient per unique row (U, D) float32 from every feature's output gradient. Every
    unique row of a batch has a position (its keys are the ids'), so no row needs zeroing."""
    features = batch.features
    shared = _shared_rows(grads) if len(grads) > 1 else None
    if shared is None:
        flat = [g if g.dim() == 2 else g.reshape(-1, g.shape[-1]) for g in grads]
        shared = torch.cat(flat) if len(flat) > 1 else flat[0], _concatenated_layout(features)
    source, layout = shared
    if any(_weighted(f) for f in features):
        rows, bags, lengths = _gradient_rows(features, batch.inverse.device, layout)
        return reduce_positions(source, rows, batch.inverse, batch.order, batch.row_start,
                                _position_weights(features, bags, lengths), batch.member_rows,
                                batch.sorted_rows, covered=True)
    # Unweighted: every position's gradient row in the order the reduction reads them;
    # where each id has a row of its own at its position, that is the order itself.
    rows = batch.order if _rows_are_positions(features, layout) else \
        _gradient_rows(features, batch.inverse.device, layout, batch.order)[0]
    return reduce_positions(source, rows, batch.inverse, batch.order, batch.row_start, None,
                            batch.member_rows, batch.sorted_rows, sorted_gidx=True,
                            covered=True)


class _EmitStorage(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, batch, table):  # noqa: D102
        ctx.batch = batch
        return tuple(_forward_all(rows, batch, table))

    @staticmethod
    def backward(ctx, *grads):  # noqa: D102
        return reduce_feature_grads(grads, ctx.batch), None, None


def emit_storage(rows: torch.Tensor, batch: StorageBatch, table: TableRows | None = None
                 ) -> list[torch.Tensor]:
    """Outputs of ``batch.features`` from the storage's unique rows (U, D), in that order.

    A bag feature gives (B, D) float32 (sum or mean, weighted when it has
    weights); a sequence feature gives (B, max_length, D) float32, zero padded.
    ``table``: bag features read the rows of ids with a slot there (Triton only;
    ``rows`` then need only hold those of slot -1).
    """
    if not batch.features:
        return []
    if rows.requires_grad and torch.is_grad_enabled():
        return list(_EmitStorage.apply(rows, batch, table))
    return _forward_all(rows, batch, table)
